#include "worker/vacant_rank_cover.h"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

namespace pstrain {
namespace {

// Each batch's gradients are set aside and zeroed; Restore puts back their
// sum, and the next step's sum starts from zero.
TEST(VacantRankCover, SetsAsideEachBatchAndRestoresTheSum) {
  Dataset data = MakeSynthetic(16, 4, 1);
  VacantRankCover cover(data, /*rank=*/0, /*world_size=*/2, /*seed=*/1, /*batch_size=*/4);
  std::vector<at::Tensor> params = {at::zeros({3}).requires_grad_(), at::zeros({2}).requires_grad_()};
  // The second parameter gets no gradient until the second batch.
  params[0].mutable_grad() = at::full({3}, 1.0);
  cover.SetAside(params);
  EXPECT_TRUE(params[0].grad().equal(at::zeros({3})));
  params[0].mutable_grad().fill_(2.0);
  params[1].mutable_grad() = at::full({2}, 5.0);
  cover.SetAside(params);
  params[0].mutable_grad().fill_(4.0);
  params[1].mutable_grad().fill_(1.0);
  cover.SetAside(params);
  cover.Restore(params);
  EXPECT_TRUE(params[0].grad().equal(at::full({3}, 7.0)));
  EXPECT_TRUE(params[1].grad().equal(at::full({2}, 6.0)));
  // A new step: nothing left over from this one.
  params[0].mutable_grad().fill_(3.0);
  params[1].mutable_grad().fill_(0.5);
  cover.SetAside(params);
  cover.Restore(params);
  EXPECT_TRUE(params[0].grad().equal(at::full({3}, 3.0)));
  EXPECT_TRUE(params[1].grad().equal(at::full({2}, 0.5)));
}

// A vacant rank's batch is the one its own worker would have drawn.
TEST(VacantRankCover, AssignsVacantRanksAndGathersTheirBatches) {
  Dataset data = MakeSynthetic(40, 4, 1);
  VacantRankCover cover(data, /*rank=*/0, /*world_size=*/4, /*seed=*/3, /*batch_size=*/5);
  const StepBatches batches = cover.Assign({2});
  EXPECT_TRUE(batches.own);
  EXPECT_EQ(batches.covered, std::vector<int>{2});
  auto batch = cover.Batch(2, /*epoch=*/1, /*micro=*/1);
  ASSERT_TRUE(batch.ok()) << batch.status();
  DistributedSampler sampler(data.size(), /*rank=*/2, /*world_size=*/4, /*seed=*/3);
  const std::vector<int64_t> order = sampler.Indices(1);
  at::Tensor idx = at::from_blob(const_cast<int64_t*>(order.data() + 5), {5}, at::kLong);
  EXPECT_TRUE(batch->labels.equal(data.labels.index_select(0, idx)));
  EXPECT_FALSE(cover.Batch(7, 0, 0).ok());
}

}  // namespace
}  // namespace pstrain
