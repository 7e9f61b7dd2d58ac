// DistributedSampler semantics (as torch.utils.data.DistributedSampler with
// drop_last=False): every epoch the indices 0..n-1 are shuffled from
// seed + epoch, padded by wrapping around to a multiple of the world size,
// and rank r takes every world-th index starting at r. Each rank sees an
// equal-length, disjoint slice (up to the padding), and the union covers the
// dataset.
#ifndef PSTRAIN_WORKER_SAMPLER_H_
#define PSTRAIN_WORKER_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace pstrain {

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, uint64_t seed,
                     bool shuffle = true);

  // Indices of this rank for `epoch`, in visiting order.
  std::vector<int64_t> Indices(int epoch) const;
  int64_t per_rank() const { return per_rank_; }

 private:
  int64_t n_;
  int rank_;
  int world_;
  uint64_t seed_;
  bool shuffle_;
  int64_t per_rank_;
};

// Which batches a rank trains in a SYNC parameter-server step while some
// ranks are vacant (lost, not yet replaced): each vacant rank's batch of the
// step goes to the active ranks in turn -- vacant[j] to active[j mod
// |active|] -- so every batch of the epoch is still trained once. A rank the
// view itself calls vacant (a replacement joining the step in flight, whose
// batch a survivor already took) trains none. `vacant` comes from the
// shards (the same view for every worker); ranks outside [0, world) are
// ignored.
struct StepBatches {
  bool own = true;           // this rank's own batch
  std::vector<int> covered;  // vacant ranks whose batch it trains too
};
StepBatches AssignBatches(const std::vector<uint32_t>& vacant, int rank, int world_size);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_SAMPLER_H_
