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

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_SAMPLER_H_
