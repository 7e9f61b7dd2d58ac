#include "worker/sampler.h"

#include <algorithm>
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

StepBatches AssignBatches(const std::vector<uint32_t>& vacant, int rank, int world_size) {
  std::vector<bool> is_vacant(std::max(0, world_size), false);
  for (uint32_t v : vacant) {
    if (v < is_vacant.size()) is_vacant[v] = true;
  }
  StepBatches out;
  if (rank < 0 || rank >= world_size) return out;
  if (is_vacant[rank]) {
    out.own = false;
    return out;
  }
  std::vector<int> active, gone;
  for (int r = 0; r < world_size; ++r) (is_vacant[r] ? gone : active).push_back(r);
  const size_t me = std::find(active.begin(), active.end(), rank) - active.begin();
  for (size_t j = 0; j < gone.size(); ++j) {
    if (j % active.size() == me) out.covered.push_back(gone[j]);
  }
  return out;
}

}  // namespace pstrain
