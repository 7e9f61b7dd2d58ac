// The worker's half of a checkpoint's pause (the coordinator's half is
// server/coordinator/coordinator_checkpoint.cc and checkpoint_driver.cc;
// checkpoint/layout.h has the whole checkpoint, checkpoint/pause_keys.h
// the keys). A SYNC step needs every worker, so all of them must stop
// before the same step. From one worker's side, at every step boundary:
//
//   1. It keeps a moving average of its step time.
//   2. The heartbeat brings the coordinator's request: `pause` with a
//      pause_id. Nothing happens without one, nor for the id it has already
//      paused for (the flag may still be up when training goes on).
//   3. The first time it sees an id, it adds 1 to pause/<id>/votes. The
//      worker that reads 1 picks the step: far enough ahead that every
//      other worker learns of the pause (through its own heartbeat) before
//      getting there -- four heartbeat intervals of training, at least 20
//      steps -- and writes it to pause/<id>/step. Every worker reads that
//      key (waiting up to 30 s); without an answer it pauses where it is.
//   4. It trains on until the agreed step, then emits a `paused` event
//      (its step, epoch, place in the epoch, loss scale and the pause_id)
//      and marks its activity PAUSED. The coordinator writes these places
//      into the manifest.
//   5. All-reduce, worker 0 only (it holds the model in its local store):
//      it waits for ckpt/<id>/path, flushes the store, writes its table
//      there, and answers under ckpt/<id>/saved with a WorkerSaveReport
//      (proto/checkpoint.proto): the file's size and crc32, or the error.
//      A pipelined job: worker s of the first replica holds stage s and
//      does the same under ckpt/<id>/stage-<s>/ (s > 0).
//      Parameter-server workers write nothing: the shards save. A model
//      with buffers (QAT's quantizers), either mode: worker 0 also writes
//      them where ckpt/<id>/buffers_path says, answering under
//      ckpt/<id>/buffers_saved (StepBoundary::save_buffers).
//   6. It waits until the coordinator lifts the pause (the heartbeat's
//      `pause` goes, or names another id) or the job is stopped, then
//      trains on.
#ifndef PSTRAIN_WORKER_PAUSE_PROTOCOL_H_
#define PSTRAIN_WORKER_PAUSE_PROTOCOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/events.pb.h"
#include "proto/parameter.pb.h"
#include "rpc/cluster_member.h"
#include "worker/activity.h"
#include "worker/trainer.h"

namespace pstrain {

class CheckpointPause {
 public:
  // Writes the model to a checkpoint's shard file (all-reduce worker 0:
  // AllReduceSetup::SaveTable); `flush` makes the store current first.
  using SaveTableFn = std::function<absl::StatusOr<SaveTableResponse>(const std::string& path,
                                                                      const std::function<absl::Status()>& flush)>;

  // None owned; all outlive the job. `stop` may be null; `save` is empty
  // for every worker but the all-reduce worker 0 (a pipelined job's workers
  // 0..stages-1: rank s saves stage s).
  CheckpointPause(ClusterMember* member, int rank, std::function<void(const WorkerEvent&)> emit,
                  Activity* activity, const std::atomic<bool>* stop, SaveTableFn save);

  // TrainerOptions::at_step_boundary: returns at once unless a pause is
  // due at this step, else only once the pause is over (steps 1-6 above).
  void AtStepBoundary(const StepBoundary& at);

 private:
  // Step 3: the step every worker stops before.
  int64_t AgreeOnStep(int64_t id, int64_t step);
  // Steps 4-6.
  void Pause(int64_t id, const StepBoundary& at);
  // Once `path_key` is set: `save` to that path, its report under
  // `saved_key`; false while the key is not set yet.
  bool SaveWhenAsked(int64_t id, const std::string& path_key, const std::string& saved_key,
                     const std::function<absl::StatusOr<SaveTableResponse>(const std::string& path)>& save);

  ClusterMember* const member_;
  const int rank_;
  const std::function<void(const WorkerEvent&)> emit_;
  Activity* const activity_;
  const std::atomic<bool>* const stop_;
  const SaveTableFn save_;
  // Called from the training loop only.
  int64_t id_ = 0;       // the pause whose step is agreed
  int64_t step_ = 0;     // that step
  int64_t done_id_ = 0;  // the pause this worker last ended
  absl::Time last_ = absl::InfinitePast();
  double step_seconds_ = 0.01;  // moving average
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PAUSE_PROTOCOL_H_
