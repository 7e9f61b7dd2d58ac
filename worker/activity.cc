#include "worker/activity.h"

#include <algorithm>

namespace pstrain {
namespace {
// Shard indices come from the job's plan; a bound keeps a bad one from
// growing the table.
constexpr int kMaxShards = 4096;
}  // namespace

void Activity::Enter(WorkerActivity::Phase phase, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (phase != phase_) since_ = absl::Now();
  phase_ = phase;
  step_ = step;
}

Activity::Shard& Activity::At(int shard) {
  shard = std::clamp(shard, 0, kMaxShards - 1);
  if (static_cast<size_t>(shard) >= shards_.size()) shards_.resize(shard + 1);
  return shards_[shard];
}

void Activity::ShardCallStarted(int shard) {
  absl::MutexLock lock(&mu_);
  Shard& s = At(shard);
  if (s.outstanding++ == 0) s.busy_since = absl::Now();
}

void Activity::ShardCallEnded(int shard, absl::Duration took, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  Shard& s = At(shard);
  s.outstanding = std::max(0, s.outstanding - 1);
  // While calls overlap, the shard stays busy since the oldest began.
  if (s.outstanding > 0) s.busy_since = std::max(s.busy_since, absl::Now() - took);
  ++s.calls;
  s.took += took;
  s.bytes += bytes;
}

WorkerActivity Activity::Snapshot() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  WorkerActivity a;
  a.set_phase(phase_);
  a.set_step(step_);
  a.set_for_s(absl::ToDoubleSeconds(now - since_));
  a.set_shard(-1);
  if (phase_ == WorkerActivity::SHARDS) {
    absl::Time oldest = absl::InfiniteFuture();
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (shards_[i].outstanding > 0 && shards_[i].busy_since < oldest) {
        oldest = shards_[i].busy_since;
        a.set_shard(static_cast<int>(i));
      }
    }
  }
  return a;
}

std::vector<ShardCalls> Activity::TakeShardWindow() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  const double window = std::max(1e-9, absl::ToDoubleSeconds(now - window_start_));
  window_start_ = now;
  std::vector<ShardCalls> out;
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = shards_[i];
    if (s.calls == 0) continue;
    ShardCalls c;
    c.set_shard(static_cast<int>(i));
    c.set_calls(s.calls);
    c.set_mean_ms(absl::ToDoubleMilliseconds(s.took) / static_cast<double>(s.calls));
    c.set_bytes_per_s(static_cast<double>(s.bytes) / window);
    out.push_back(c);
    s.calls = 0;
    s.took = absl::ZeroDuration();
    s.bytes = 0;
  }
  return out;
}

}  // namespace pstrain
