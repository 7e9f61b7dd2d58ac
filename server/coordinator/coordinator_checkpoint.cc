// The coordinator's checkpoint protocol: pause the workers at one step,
// have the data written (checkpoint_driver.h), resume; restore a requeued
// or resumed job; drain a leaving member; periodic checkpoints.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/quote.h"
#include "rpc/table_grant.h"
#include "server/coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

// The workers that write part of a checkpoint: all-reduce worker 0 holds
// the model (a pipelined job: worker s holds stage s); QAT's worker 0 its
// buffers.
// The shards that write a checkpoint, by rank: those not declared lost
// (replicated shards: a lost one's chunks are saved by their new primaries).
std::vector<std::string> SavingShards(const JobStatus& s) {
  std::vector<std::string> shards = ShardAddresses(s);
  std::vector<int> lost(s.lost_shards().begin(), s.lost_shards().end());
  std::sort(lost.rbegin(), lost.rend());  // erased from the back
  for (int i : lost) if (i >= 0 && i < static_cast<int>(shards.size())) shards.erase(shards.begin() + i);
  return shards;
}

int CheckpointWriters(const JobSpec& spec) {
  if (spec.allreduce() && spec.pipeline.enabled()) return spec.pipeline.stages;
  return spec.allreduce() || spec.quantization.qat() ? 1 : 0;
}

}  // namespace

absl::StatusOr<uint64_t> Coordinator::ClaimCheckpoint(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
  const JobState state = job->stored.status.state();
  if (state != RUNNING && state != CHECKPOINTING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(state), ": only a running job can be checkpointed"));
  }
  if (job->checkpoint.claimed) {
    return absl::UnavailableError(
        absl::StrCat("a checkpoint of job ", job_id, " is already in progress; try again when it is done"));
  }
  job->checkpoint.claimed = true;  // atomically with the checks above
  return job->stored.status.attempt();
}

absl::StatusOr<CheckpointResponse> Coordinator::Checkpoint(const std::string& job_id) {
  absl::StatusOr<uint64_t> attempt = ClaimCheckpoint(job_id);
  if (!attempt.ok()) return attempt.status();
  if (options_.on_checkpoint_claimed) options_.on_checkpoint_claimed(job_id);
  return RunCheckpoint(job_id, *attempt);
}

int64_t Coordinator::NextPauseId() {
  // Workers remember the id of the pause they served last and ignore a
  // request with the same id; a restarted coordinator counting from 1 again
  // would have its first pause ignored (the workers never pause, the
  // checkpoint times out). The high half is this coordinator's life,
  // counted durably in the store.
  return (incarnation_ << 32) | ++pauses_;
}

void Coordinator::EndCheckpoint(Job& job, const std::string& reason, const std::string& message) {
  job.checkpoint.EndPause();
  if (job.stored.status.state() == CHECKPOINTING) {
    Transition(job, RUNNING, reason, message);
    MaybeSucceed(job);
  }
}

void Coordinator::StartPeriodicCheckpoints() {
  for (Job* active : ActiveJobs()) {
    Job& job = *active;
    const std::string& id = job.stored.id;
    if (!PeriodicCheckpointDue(job.stored.status, job.spec, job.checkpoint)) continue;
    job.checkpoint.claimed = true;  // RunCheckpoint() takes it from here
    Background([this, id = id, attempt = job.stored.status.attempt()] {
      auto r = RunCheckpoint(id, attempt);
      if (!r.ok()) spdlog::warn("coordinator: periodic checkpoint of {}: {}", id, r.status().ToString());
    });
  }
}

absl::StatusOr<CheckpointWrite> Coordinator::PauseForCheckpoint(const std::string& job_id, uint64_t attempt) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
  CheckpointState& c = job->checkpoint;
  // The claim was `attempt`'s. The waits below drop the lock: once the job
  // is requeued (its checkpoint state reset) or runs another attempt, the
  // claim and the pause, if any, are no longer this call's to end.
  auto moved_on = [&] {
    return job->stored.status.attempt() != attempt || job->stored.status.state() == PENDING;
  };
  auto abandoned = [&] {
    return absl::AbortedError(absl::StrCat("job ", job_id, " was restarted during the checkpoint"));
  };
  // An ended job past the retention is deleted (PruneEndedJobs): after a
  // wait, it is looked up again before `job` is used.
  auto deleted = [&] {
    return absl::AbortedError(absl::StrCat("job ", job_id, " ended (and was deleted) during the checkpoint"));
  };
  if (moved_on()) return abandoned();
  if (job->stored.status.state() != RUNNING) {
    c.claimed = false;
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ", JobStateName(job->stored.status.state()),
                                                      ": only a running job can be checkpointed"));
  }
  // A job that is still starting has not reported its model yet: wait.
  const absl::Time start_deadline = absl::Now() + options_.checkpoint_start_timeout;
  auto starting = [&] { return job->stored.status.params_size() == 0 || c.restoring; };
  while (starting() && job->stored.status.state() == RUNNING && absl::Now() < start_deadline && !shutdown_ &&
         !moved_on()) {
    cv_.WaitWithDeadline(&mu_, std::min(start_deadline, absl::Now() + absl::Seconds(1)));
    if (FindJob(job_id) == nullptr) return deleted();  // `job` is gone with it
  }
  if (moved_on()) return abandoned();
  if (starting() || job->stored.status.state() != RUNNING) {
    c.claimed = false;
    return absl::UnavailableError(absl::StrCat("job ", job_id, " did not start training within ",
                                               absl::ToInt64Seconds(options_.checkpoint_start_timeout),
                                               " s; try again later"));
  }
  c.claimed = true;
  c.pause_requested = true;
  c.pause_id = NextPauseId();
  c.paused.clear();
  Transition(*job, CHECKPOINTING, "CheckpointRequested", "pausing the workers at a step boundary");
  const absl::Time deadline = absl::Now() + options_.checkpoint_pause_timeout;
  while (true) {
    if (moved_on()) return abandoned();
    if (IsTerminal(job->stored.status.state())) {
      c.EndPause();
      return absl::AbortedError(absl::StrCat("job ", job_id, " ended during the checkpoint"));
    }
    // Workers that finished their steps will not pause; they count as ready.
    int ready = static_cast<int>(c.paused.size());
    for (int r : job->done_ranks) ready += c.paused.count(r) == 0 ? 1 : 0;
    // A vacant rank has nobody to pause.
    for (int r : job->stored.status.vacant_ranks()) ready += c.paused.count(r) == 0 && !job->done_ranks.count(r);
    if (ready >= job->spec.workers) break;
    if (absl::Now() > deadline || shutdown_) {
      EndCheckpoint(*job, "CheckpointFailed",
                    absl::StrCat("the workers did not pause within ",
                                 absl::ToInt64Seconds(options_.checkpoint_pause_timeout), " s"));
      return absl::DeadlineExceededError(absl::StrCat("job ", job_id, ": the workers did not pause in time"));
    }
    cv_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Seconds(1)));
    if (FindJob(job_id) == nullptr) return deleted();
  }
  const bool allreduce = job->spec.allreduce();
  const bool buffers = job->spec.quantization.qat();
  for (int r = 0; r < CheckpointWriters(job->spec); ++r) {
    if (c.paused.count(r) != 0) continue;
    // It finished its steps before reaching the agreed pause, so nobody is
    // left to write its part (the job is about to end: its final weights
    // are being written).
    EndCheckpoint(*job, "CheckpointSkipped", absl::StrCat("worker ", r, " finished before the pause"));
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " finished its steps before the checkpoint could be taken"));
  }
  const JobStatus& s = job->stored.status;
  CheckpointWrite w;
  CheckpointManifest& manifest = w.manifest;
  manifest.job = job_id;
  manifest.id = NewCheckpointId();
  manifest.name = s.name();
  manifest.created_unix_ms = absl::ToUnixMillis(Now());
  manifest.spec_yaml = job->stored.spec_yaml;
  manifest.chunk_bytes = s.chunk_bytes();
  for (const ParameterInfo& p : s.params()) {
    manifest.params.push_back({p.name(), std::vector<int64_t>(p.shape().begin(), p.shape().end()),
                               static_cast<DataType>(p.dtype())});
  }
  manifest.step = INT64_MAX;
  for (const auto& [rank, worker] : c.paused) {
    manifest.workers.push_back(worker);
    manifest.step = std::min(manifest.step, worker.step);
  }
  if (manifest.step == INT64_MAX) manifest.step = s.step();
  w.job_id = job_id;
  w.attempt = s.attempt();
  w.job_secret = s.job_secret();
  w.pause_id = c.pause_id;
  w.allreduce = allreduce;
  w.stages = allreduce && job->spec.pipeline.enabled() ? job->spec.pipeline.stages : 1;
  w.shards = SavingShards(s);
  w.embeddings = !job->spec.embeddings.empty();
  w.incremental = job->spec.checkpoint_incremental;
  w.base_dir = c.last_dir;
  w.buffers = buffers;
  // The job's own directory: jobs sharing an output_dir never touch each
  // other's checkpoints.
  w.dir = CheckpointDir(JobDir(job->stored.output_dir, job_id), manifest.step);
  w.keep = job->spec.checkpoint_keep;
  w.save_timeout = options_.checkpoint_save_timeout;
  w.abandon = AbandonCheck(job_id, s.attempt(), s.routing_generation());
  spdlog::debug("coordinator: {} pause {}: {} of {} ranks paused (the rest done or vacant), step {}", job_id,
                w.pause_id, c.paused.size(), job->spec.workers, manifest.step);
  return w;
}

// CheckpointWrite::abandon for a checkpoint of `job_id`'s attempt taken
// under routing `generation`: a shard lost (or a spare taking over) while
// the shards write changed which shard leads a chunk under the saves, and a
// lost one's call would hold the workers until save_timeout. The next
// checkpoint is whole.
std::function<std::string()> Coordinator::AbandonCheck(const std::string& job_id, uint64_t attempt,
                                                       uint64_t generation) {
  return [this, job_id, attempt, generation]() -> std::string {
    absl::MutexLock lock(&mu_);
    const Job* job = FindJob(job_id);
    if (job == nullptr) return "the job was deleted";
    const JobStatus& st = job->stored.status;
    if (st.attempt() != attempt || IsTerminal(st.state())) return "the job's attempt ended";
    if (st.routing_generation() == generation) return "";
    return absl::StrCat("the shards' routing changed (generation ", generation, " -> ", st.routing_generation(),
                        ", ", st.lost_shards_size(), " shard(s) lost, ", st.catching_up_shards_size(),
                        " catching up) while they wrote; the next checkpoint is taken under the new one");
  };
}

absl::StatusOr<CheckpointResponse> Coordinator::RunCheckpoint(const std::string& job_id, uint64_t attempt) {
  auto write = PauseForCheckpoint(job_id, attempt);
  if (!write.ok()) return write.status();
  // The shards write their tables, all at once, outside the lock (for up
  // to checkpoint_save_timeout).
  spdlog::debug("coordinator: {} pause {}: writing {} ({})", job_id, write->pause_id, write->dir,
                write->allreduce ? "worker 0" : absl::StrCat(write->shards.size(), " shard(s)"));
  std::string embeddings;  // what the shards wrote of the embedding tables
  absl::Status status = WriteCheckpoint(*write, options_.checkpoint_root, rendezvous_, &embeddings);
  spdlog::debug("coordinator: {} pause {}: written: {}", job_id, write->pause_id, status.ToString());
  if (options_.on_checkpoint_written) options_.on_checkpoint_written(job_id);
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job != nullptr && job->stored.status.attempt() != write->attempt) {
    // The job was requeued meanwhile and may be in a checkpoint of its new
    // attempt: that one's pause and claim are not ours to end.
    if (!status.ok()) return absl::AbortedError(absl::StrCat("job ", job_id, " was restarted during the checkpoint"));
    // Committed all the same: a whole checkpoint of the job (its workers
    // were paused at one step). The job's status names it, since retention
    // may have removed the one it named before.
    if (!IsTerminal(job->stored.status.state())) {
      job->stored.status.set_last_checkpoint(write->dir);
      Changed(*job);
    }
    CheckpointResponse r;
    r.set_path(write->dir);
    r.set_step(write->manifest.step);
    return r;
  }
  if (!status.ok()) {
    if (job != nullptr) EndCheckpoint(*job, "CheckpointFailed", std::string(status.message()));
    return status;
  }
  const int64_t step = write->manifest.step;
  if (job != nullptr) {
    job->stored.status.set_last_checkpoint(write->dir);
    job->checkpoint.last_step = step;
    job->checkpoint.last_dir = write->dir;
    EndCheckpoint(*job, "CheckpointSaved",
                  absl::StrCat("step ", step, " saved in ", write->dir,
                               embeddings.empty() ? std::string() : absl::StrCat(" (embeddings ", embeddings, ")")));
  }
  CheckpointResponse r;
  r.set_path(write->dir);
  r.set_step(step);
  return r;
}

void Coordinator::Restore(const std::string& job_id) {
  std::string dir;
  JobSpec spec;
  std::vector<std::string> shards;
  uint64_t attempt = 0;
  std::string secret;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return;
    attempt = job->stored.status.attempt();
    // LoadTable tells the shards the attempt: only once the store holds it.
    if (!AwaitDurableAttempt(job_id, attempt)) return;
    dir = job->stored.status.resumed_from();
    secret = job->stored.status.job_secret();
    spec = job->spec;
    shards = ShardAddresses(job->stored.status);
  }
  const std::string grant = options_.table_grant_signer == nullptr
                                ? std::string()
                                : options_.table_grant_signer->Sign(job_id, attempt, secret);
  auto manifest = LoadCheckpoint(job_id, attempt, secret, grant, dir, spec, shards, options_.checkpoint_root,
                                 options_.checkpoint_load_timeout);
  if (options_.on_restore_loaded) options_.on_restore_loaded(job_id, attempt);
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  // The LoadTable calls may take minutes: the job may have been requeued and
  // restarted meanwhile, with a restore of its own in flight, which this
  // (late) result must neither end nor fail.
  if (job == nullptr || job->stored.status.attempt() != attempt || job->stored.status.state() != RUNNING ||
      !job->checkpoint.restoring) {
    return;
  }
  job->checkpoint.restoring = false;
  if (!manifest.ok()) {
    // A shard that went away (not a bad checkpoint) is worth another try
    // on whichever shards are alive then.
    const absl::Status& s = manifest.status();
    RestartOrFail(*job, "RestoreFailed", absl::StrCat("cannot restore from ", dir, ": ", s.message()),
                  absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s));
    Schedule();
    return;
  }
  job->checkpoint.start_positions = StartPositions(*manifest, job->spec.workers);
  job->checkpoint.last_step = manifest->step;
  job->checkpoint.last_dir = dir;
  // The job goes on from the checkpoint: until its workers report, its
  // progress is the checkpoint's, not what a lost attempt had reached past it.
  JobStatus& st = job->stored.status;
  st.set_step(manifest->step);
  int epoch = INT32_MAX;
  for (const auto& w : job->checkpoint.start_positions) epoch = std::min(epoch, w.epoch);
  if (epoch != INT32_MAX) st.set_epoch(epoch + 1);  // the status's epochs count from 1, a checkpoint's from 0
  Transition(*job, RUNNING, "Restored",
             absl::StrCat("step ", manifest->step, " of ", manifest->job, " loaded from ", dir,
                          !spec.allreduce()           ? absl::StrCat(" onto ", spec.shards, " shard(s)")
                          : spec.embeddings.empty() ? std::string(" by the workers")
                                                    : absl::StrCat(" by the workers, rows onto ", spec.shards,
                                                                   " shard(s)")));
}

void Coordinator::Drain(const std::string& job_id, const std::string& who) {
  // A checkpoint already in progress is waited for, then a fresh one taken
  // (the leaving worker keeps training until the job stops).
  const absl::Time deadline = absl::Now() + options_.drain_checkpoint_timeout;
  absl::Status saved = absl::DeadlineExceededError(
      absl::StrCat("no checkpoint within ", absl::ToInt64Seconds(options_.drain_checkpoint_timeout), " s"));
  // The attempt that is draining: once the job runs another one, its end
  // (requeue or failure) is no longer this drain's to decide.
  uint64_t attempt = 0;
  {
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return;
    attempt = job->stored.status.attempt();
  }
  auto still_draining = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Job* {
    Job* job = FindJob(job_id);
    if (job == nullptr || !job->checkpoint.draining || shutdown_ || job->stored.status.attempt() != attempt) {
      return nullptr;
    }
    const JobState state = job->stored.status.state();
    return state == RUNNING || state == CHECKPOINTING ? job : nullptr;
  };
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      if (still_draining() == nullptr) return;
    }
    auto r = Checkpoint(job_id);
    saved = r.status();
    if (!absl::IsUnavailable(r.status())) break;
    absl::SleepFor(absl::Milliseconds(200));  // another checkpoint is in progress
  }
  absl::MutexLock lock(&mu_);
  Job* job = still_draining();
  if (job == nullptr) return;
  if (saved.ok() && CanRestart(*job)) {
    Requeue(*job, "MemberLeft", absl::StrCat(who, " shut down; the job was checkpointed"));
  } else {
    Transition(*job, FAILED, "MemberLeft",
               absl::StrCat(who, " shut down and the job cannot restart: ",
                            saved.ok() ? "no restarts left" : std::string(saved.message())));
  }
  Schedule();
}

}  // namespace pstrain
