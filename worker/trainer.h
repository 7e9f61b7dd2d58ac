// Trainer: one worker's training loop against the parameter shards.
//
// Every optimizer step: forward and backward on this rank's batch; each
// parameter's gradient is pushed as soon as autograd produces it (a hook per
// parameter starts an asynchronous PushPull for that parameter's chunks), so
// communication overlaps the rest of backward; the new values land in
// staging buffers and replace the parameters once backward is done. With
// gradient accumulation or clipping the gradients are complete only after
// the last backward, so then every parameter is pushed after it.
//
// All-reduce mode (options.collective set): the same loop, but a complete
// bucket of gradients is packed into one flat buffer and all-reduced among
// the workers (asynchronously, while backward goes on); after backward the
// averaged gradients update the parameters where they live, with the
// shards' optimizer arithmetic; an in-process store holding the whole model
// (options.local_store, a ShardStore) keeps checkpoints in the shards' file
// format. Rank 0's initial values are broadcast first. The two modes are
// two GradientExchanges (worker/gradient_exchange.h).
//
// Events (progress, per-epoch evaluation, the final result) go to `emit` as
// WorkerEvent messages (proto/events.proto).
#ifndef PSTRAIN_WORKER_TRAINER_H_
#define PSTRAIN_WORKER_TRAINER_H_

#include "absl/status/statusor.h"
#include "worker/dataset.h"
#include "worker/trainer_options.h"

namespace pstrain {

// Runs the whole job for one rank. `data` may be shared by ranks in one
// process (tests); it is read only.
absl::StatusOr<TrainResult> RunTrainer(const TrainerOptions& options, const TrainTest& data);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAINER_H_
