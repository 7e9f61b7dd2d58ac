// VacantRankCover: how a SYNC parameter-server worker covers vacant ranks
// (ranks whose worker was lost and not yet replaced), so that every batch of
// an epoch is still trained once. Each step the ranks the shards last
// reported vacant are shared out among the active ranks (AssignBatches);
// this worker trains its share of their batches besides its own (or
// instead of it: a replacement joining a step a survivor already covered),
// and its pushes say how many batches they sum.
//
// Where gradients are finished per batch (loss scaling, clipping: each
// rank's batch on its own, as its own worker would), each batch's finished
// gradients are set aside (SetAside) before the next batch's backward adds
// to them, and their sum put back (Restore) once every batch is done.
//
// Not thread-safe: the training loop's thread only. `data` must outlive it.
#ifndef PSTRAIN_WORKER_VACANT_RANK_COVER_H_
#define PSTRAIN_WORKER_VACANT_RANK_COVER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/batch_loader.h"
#include "worker/dataset.h"
#include "worker/sampler.h"

namespace pstrain {

class VacantRankCover {
 public:
  // The job's sampler settings: the vacant ranks' slices are
  // DistributedSampler's, as their own workers would have drawn them.
  VacantRankCover(const Dataset& data, int rank, int world_size, uint64_t seed, int64_t batch_size)
      : rank_(rank), world_size_(world_size), loader_(data, world_size, seed, batch_size) {}

  // The batches this rank trains in a step, given the shards' vacant ranks.
  StepBatches Assign(const std::vector<uint32_t>& vacant) const {
    return AssignBatches(vacant, rank_, world_size_);
  }
  // Micro-batch `micro` of vacant rank `rank`'s slice in `epoch`.
  absl::StatusOr<BatchLoader::Batch> Batch(int rank, int epoch, int64_t micro) {
    return loader_.Get(rank, epoch, micro);
  }

  // Adds the parameters' gradients (those defined) to the sum set aside,
  // and zeroes them for the next batch.
  void SetAside(const std::vector<at::Tensor>& params);
  // The sum set aside into the parameters' gradients; the sum starts afresh
  // (its buffers kept for the next step).
  void Restore(const std::vector<at::Tensor>& params);

 private:
  const int rank_;
  const int world_size_;
  CoverLoader loader_;
  std::vector<at::Tensor> sum_;  // per parameter; undefined while it had no gradient
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_VACANT_RANK_COVER_H_
