#include "worker/sampler.h"

#include <numeric>
#include <random>

namespace pstrain {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size,
                                       uint64_t seed, bool shuffle)
    : n_(dataset_size),
      rank_(rank),
      world_(world_size),
      seed_(seed),
      shuffle_(shuffle),
      per_rank_((dataset_size + world_size - 1) / world_size) {}

std::vector<int64_t> DistributedSampler::Indices(int epoch) const {
  std::vector<int64_t> all(n_);
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_) {
    // Fisher-Yates with a fixed generator, so every rank and every platform
    // computes the same permutation.
    std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
    for (int64_t i = n_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(all[i], all[j]);
    }
  }
  std::vector<int64_t> mine;
  mine.reserve(per_rank_);
  const int64_t total = per_rank_ * world_;
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(n_ == 0 ? 0 : all[i % n_]);
  return mine;
}

}  // namespace pstrain
