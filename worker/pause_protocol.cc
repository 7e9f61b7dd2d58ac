#include "worker/pause_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "checkpoint/pause_keys.h"
#include "proto/checkpoint.pb.h"
#include "spdlog/spdlog.h"

namespace pstrain {

CheckpointPause::CheckpointPause(ClusterMember* member, int rank, std::function<void(const WorkerEvent&)> emit,
                                 Activity* activity, const std::atomic<bool>* stop, SaveTableFn save)
    : member_(member),
      rank_(rank),
      emit_(std::move(emit)),
      activity_(activity),
      stop_(stop),
      save_(std::move(save)) {}

void CheckpointPause::AtStepBoundary(const StepBoundary& at) {
  const absl::Time now = absl::Now();
  if (last_ != absl::InfinitePast()) step_seconds_ = 0.9 * step_seconds_ + 0.1 * absl::ToDoubleSeconds(now - last_);
  last_ = now;
  if (!member_->pause_requested()) return;
  const int64_t id = member_->pause_id();
  if (id == done_id_) return;  // already paused for this one (stale flag)
  if (id_ != id) {
    step_ = AgreeOnStep(id, at.step);
    id_ = id;
  }
  if (at.step < step_) return;
  Pause(id, at);
  done_id_ = id;
  last_ = absl::Now();
}

int64_t CheckpointPause::AgreeOnStep(int64_t id, int64_t step) {
  const int64_t margin = std::max<int64_t>(
      20, static_cast<int64_t>(4 * absl::ToDoubleSeconds(member_->heartbeat_interval()) /
                               std::max(1e-4, step_seconds_)));
  auto votes = member_->KvAdd(PauseVotesKey(id), 1);
  if (votes.ok() && *votes == 1) (void)member_->KvSet(PauseStepKey(id), std::to_string(step + margin));
  auto agreed = member_->KvGet(PauseStepKey(id), absl::Seconds(30));
  int64_t p = step;
  if (!agreed.ok() || !absl::SimpleAtoi(*agreed, &p)) p = step;  // no agreement: pause here
  spdlog::debug("rank {}: pause {}: at step {}, vote {}, pausing before step {} ({})", rank_, id, step,
                votes.ok() ? *votes : -1, p, agreed.ok() ? "agreed" : "no agreement: here");
  return p;
}

bool CheckpointPause::SaveWhenAsked(
    int64_t id, const std::string& path_key, const std::string& saved_key,
    const std::function<absl::StatusOr<SaveTableResponse>(const std::string& path)>& save) {
  auto path = member_->KvGet(path_key, absl::Milliseconds(200));
  if (!path.ok()) return false;
  auto result = save(*path);
  WorkerSaveReport report;
  if (result.ok()) {
    *report.mutable_saved() = *std::move(result);
    // The chunk keys are the manifest's business, not the report's: a
    // large model's would not fit in a KV value.
    report.mutable_saved()->clear_keys();
  } else {
    report.set_error(result.status().ToString());
  }
  (void)member_->KvSet(saved_key, report.SerializeAsString());
  spdlog::debug("rank {}: pause {}: saved {} ({})", rank_, id, *path, result.ok() ? "ok" : result.status().ToString());
  return true;
}

void CheckpointPause::Pause(int64_t id, const StepBoundary& at) {
  WorkerEvent paused;
  paused.set_rank(rank_);
  paused.mutable_paused()->set_step(at.step);
  paused.mutable_paused()->set_epoch(at.epoch);
  paused.mutable_paused()->set_epoch_step(at.epoch_step);
  paused.mutable_paused()->set_pause_id(id);
  if (at.loss_scale) paused.mutable_paused()->set_loss_scale(at.loss_scale());
  emit_(paused);
  spdlog::debug("rank {}: pause {}: paused at step {}", rank_, id, at.step);
  activity_->Enter(WorkerActivity::PAUSED, at.step);
  // Rank 0 writes what the coordinator asks for, the table (all-reduce)
  // and the model's buffers (QAT), each once its path is set; a pipelined
  // job's rank s < stages, its stage's table under stage s's keys.
  bool saved = !save_;
  bool buffers_saved = !(rank_ == 0 && at.save_buffers);
  while (member_->pause_requested() && member_->pause_id() == id && !(stop_ != nullptr && stop_->load())) {
    if (!saved) {
      saved = SaveWhenAsked(id, CheckpointPathKey(id, rank_), CheckpointSavedKey(id, rank_),
                            [&](const std::string& path) { return save_(path, at.flush); });
    }
    if (!buffers_saved) {
      buffers_saved = SaveWhenAsked(id, CheckpointBuffersPathKey(id), CheckpointBuffersSavedKey(id), at.save_buffers);
    }
    if (saved && buffers_saved) absl::SleepFor(absl::Milliseconds(10));
  }
  spdlog::debug("rank {}: pause {}: resuming after step {}", rank_, id, at.step);
}

}  // namespace pstrain
