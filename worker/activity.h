// Activity: what a worker's training loop is doing now, and how its calls
// to each shard went since the last progress event. The loop enters phases
// (data, compute, waiting on the shards or the collective, ...); the PS
// client marks each shard call's start and end. The heartbeat thread reads
// a snapshot (so a stuck rank still says what it waits on, and for how
// long); progress events take the per-shard window.
//
// Thread-safe; the calls are a few per shard per step, so one mutex.
#ifndef PSTRAIN_WORKER_ACTIVITY_H_
#define PSTRAIN_WORKER_ACTIVITY_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/events.pb.h"

namespace pstrain {

class Activity {
 public:
  void Enter(WorkerActivity::Phase phase, int64_t step);
  // A call to `shard` began / ended (carrying `bytes` of tensor data both
  // ways). Every Started has one Ended.
  void ShardCallStarted(int shard);
  void ShardCallEnded(int shard, absl::Duration took, int64_t bytes);

  WorkerActivity Snapshot() const;
  // The shard calls since the previous Take (one entry per shard called).
  std::vector<ShardCalls> TakeShardWindow();

 private:
  struct Shard {
    int outstanding = 0;
    absl::Time busy_since;  // when outstanding last rose from 0
    int64_t calls = 0;
    absl::Duration took;
    int64_t bytes = 0;
  };
  Shard& At(int shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  WorkerActivity::Phase phase_ ABSL_GUARDED_BY(mu_) = WorkerActivity::STARTING;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time since_ ABSL_GUARDED_BY(mu_) = absl::Now();
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::vector<Shard> shards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_ACTIVITY_H_
