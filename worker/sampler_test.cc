#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <set>

namespace pstrain {
namespace {

TEST(DistributedSamplerTest, RanksAreEqualLengthDisjointAndCoverTheDataset) {
  for (int64_t n : {1, 7, 100, 1001}) {
    for (int world : {1, 2, 3, 8}) {
      std::multiset<int64_t> seen;
      size_t length = 0;
      for (int r = 0; r < world; ++r) {
        DistributedSampler s(n, r, world, 5);
        auto idx = s.Indices(0);
        if (r == 0) length = idx.size();
        EXPECT_EQ(idx.size(), length) << "n=" << n << " world=" << world;
        EXPECT_EQ(static_cast<int64_t>(idx.size()), s.per_rank());
        seen.insert(idx.begin(), idx.end());
      }
      // Every index appears, and only the wrap-around padding repeats one.
      for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
      const size_t padding = length * world - n;
      EXPECT_LT(padding, static_cast<size_t>(world));
      EXPECT_EQ(seen.size(), static_cast<size_t>(n) + padding);
    }
  }
}

TEST(DistributedSamplerTest, ReshufflesEveryEpochDeterministically) {
  DistributedSampler a(1000, 1, 4, 9), b(1000, 1, 4, 9);
  EXPECT_EQ(a.Indices(3), b.Indices(3));
  EXPECT_NE(a.Indices(0), a.Indices(1));
  // The same seed + epoch gives the same permutation whatever the epoch split.
  DistributedSampler shifted(1000, 1, 4, 10);
  EXPECT_EQ(a.Indices(1), shifted.Indices(0));
}

TEST(DistributedSamplerTest, WithoutShuffleRanksInterleave) {
  DistributedSampler s(10, 1, 3, 0, /*shuffle=*/false);
  EXPECT_EQ(s.Indices(0), (std::vector<int64_t>{1, 4, 7, 0}));
}

// Every batch of a step is trained once, whatever is vacant.
TEST(AssignBatchesTest, EveryVacantBatchGoesToExactlyOneActiveRank) {
  for (int world = 1; world <= 6; ++world) {
    for (uint32_t mask = 0; mask + 1 < (1u << world); ++mask) {  // at least one rank active
      std::vector<uint32_t> vacant;
      for (int r = 0; r < world; ++r) {
        if (mask & (1u << r)) vacant.push_back(r);
      }
      std::vector<int> trained(world, 0);
      size_t most = 0, least = SIZE_MAX;
      for (int r = 0; r < world; ++r) {
        StepBatches b = AssignBatches(vacant, r, world);
        EXPECT_EQ(b.own, !(mask & (1u << r)));
        if (b.own) ++trained[r];
        if (!b.own) EXPECT_TRUE(b.covered.empty());
        for (int v : b.covered) ++trained[v];
        if (b.own) {
          most = std::max(most, b.covered.size());
          least = std::min(least, b.covered.size());
        }
      }
      for (int r = 0; r < world; ++r) EXPECT_EQ(trained[r], 1) << "world " << world << " mask " << mask;
      EXPECT_LE(most - least, 1u);  // spread evenly
    }
  }
  // Out-of-range ranks in the view are ignored.
  EXPECT_TRUE(AssignBatches({7, 99}, 0, 2).covered.empty());
  EXPECT_TRUE(AssignBatches({}, 1, 2).own);
}

}  // namespace
}  // namespace pstrain
