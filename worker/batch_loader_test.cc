#include "worker/batch_loader.h"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

namespace pstrain {
namespace {

// The loader's batches are the sampler's slices, in the trainer's order,
// from a resumed position on, across epochs; the last one may be short.
TEST(BatchLoader, WalksTheSamplersSlicesInOrder) {
  Dataset data = MakeSynthetic(100, 10, 1);
  DistributedSampler sampler(data.size(), /*rank=*/1, /*world_size=*/2, /*seed=*/5);  // 50 per rank
  BatchPlan plan;
  plan.batch_size = 16;  // micro-batches of 16, 16, 16, 2
  plan.start_epoch = 1;
  plan.start_micro = 2;
  plan.epochs = 3;
  plan.micro_per_epoch = 4;
  BatchLoader loader(data, sampler, plan);
  for (int epoch = 1; epoch < 3; ++epoch) {
    const std::vector<int64_t> order = sampler.Indices(epoch);
    for (int64_t m = epoch == 1 ? 2 : 0; m < 4; ++m) {
      auto b = loader.Next(epoch, m);
      ASSERT_TRUE(b.ok()) << b.status();
      const int64_t len = std::min<int64_t>(16, 50 - m * 16);
      at::Tensor idx = at::from_blob(const_cast<int64_t*>(order.data() + m * 16), {len}, at::kLong);
      EXPECT_TRUE(b->inputs.equal(data.inputs.index_select(0, idx))) << epoch << "/" << m;
      EXPECT_TRUE(b->labels.equal(data.labels.index_select(0, idx))) << epoch << "/" << m;
    }
  }
}

TEST(BatchLoader, OutOfOrderIsAnErrorAndStoppingEarlyDoesNotHang) {
  Dataset data = MakeSynthetic(64, 10, 1);
  DistributedSampler sampler(data.size(), 0, 1, 5);
  BatchPlan plan;
  plan.batch_size = 8;
  plan.epochs = 100;
  plan.micro_per_epoch = 8;
  BatchLoader loader(data, sampler, plan);
  ASSERT_TRUE(loader.Next(0, 0).ok());
  EXPECT_EQ(loader.Next(0, 5).status().code(), absl::StatusCode::kInternal);
  // The destructor stops a loader with 99 epochs to go.
}

}  // namespace
}  // namespace pstrain
