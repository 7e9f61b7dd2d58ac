// The training loop of click-through-rate models (a spec with embeddings:
// model dlrm or torchscript:PATH, worker/ctr_model.h): dense parameters
// through the same gradient exchange as the dense loop
// (worker/exchange_setup.h: the shards' tables, or an all-reduce in hybrid
// mode), sparse embedding rows through an EmbeddingRows
// (worker/sparse_embeddings.h), data streamed from Criteo-format files
// (worker/criteo_data.h).
//
// Every step, on the calling thread:
//
//   exchange.BeginStep(step, lr)
//   embeddings.Forward   pull the batch's rows, pool them per field
//   model forward, DlrmLoss, backward
//   exchange.Offer(every dense gradient); exchange.Finish()
//   embeddings.Backward  push one summed gradient per row pulled
//
// Each worker reads example i of the training file when i % world == rank,
// batch_size at a time, `epochs` passes (the file reopened per pass), at
// most max_steps steps; under SYNC, SSP and all-reduce only the first
// (examples / world) of its share, so that every rank runs the same steps. At the end the dense tables are pulled and rank 0
// evaluates the AUC and log loss on the test file (when the spec names one).
// Events as the dense loop's: progress every log_every_steps, the final
// evaluation (WorkerEvent.Eval with auc and log_loss), the weights (dense
// parameters) and done.
//
// Checkpoints: before every step (a batch in hand) the loop calls
// at_step_boundary with its step, epoch and batches into the epoch, where a
// checkpoint's pause holds it (worker/pause_protocol.h; the shards save the
// dense and embedding tables). Resuming at start_step/start_epoch/
// start_epoch_step, the rank reads and drops the first start_epoch_step
// batches of its share of that epoch (the file is streamed, not indexed).
//
// Parameter-server jobs go on without a lost rank (min_workers < workers;
// SYNC: the others cover its batches, worker/ctr_batches.h) and a spare
// takes it over where it had got to (rejoin_step). Not yet: rejoining an
// all-reduce (hybrid) job, loss scaling or fp16, clip_grad_norm in hybrid
// mode: refused with INVALID_ARGUMENT.
#ifndef PSTRAIN_WORKER_CTR_TRAINER_H_
#define PSTRAIN_WORKER_CTR_TRAINER_H_

#include "absl/status/statusor.h"
#include "worker/sparse_embeddings.h"
#include "worker/trainer_options.h"

namespace pstrain {

// Runs a CTR job for one rank. `rows` (not owned) holds the job's
// embedding tables in spec.embeddings.tables' order; it may be shared by
// ranks in one process when it is thread-safe (LocalEmbeddingRows is).
// Reads spec.data.train_file and test_file under options.data_root.
absl::StatusOr<TrainResult> RunCtrTrainer(const TrainerOptions& options, EmbeddingRows* rows);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CTR_TRAINER_H_
