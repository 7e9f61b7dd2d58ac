// LossScaler: the unscale is exact (a power of two), every kind of
// non-finite value is caught in any gradient of the list, and the scale
// follows GradScaler's rules (back off on overflow, grow after a run of
// clean steps, never past fp32's range); a run of overflows fails.
#include "worker/loss_scaler.h"

#include <ATen/Functions.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <limits>

namespace pstrain {
namespace {

TEST(LossScalerTest, UnscalesExactlyAndFindsEveryNonFiniteValue) {
  LossScaler scaler;  // 65536
  at::Tensor a = at::randn({1000});
  at::Tensor b = at::randn({7, 3}, at::kDouble);
  const at::Tensor a0 = a.clone(), b0 = b.clone();
  std::vector<at::Tensor> grads{a.mul(65536.0), at::Tensor(), b.mul(65536.0)};
  EXPECT_TRUE(scaler.UnscaleAndCheck(grads));
  EXPECT_TRUE(at::equal(grads[0], a0)) << "a power of two unscales exactly";
  EXPECT_TRUE(at::equal(grads[2], b0));
  // With a divisor (all-reduce's world size) as well.
  std::vector<at::Tensor> summed{a0.mul(65536.0 * 4)};
  EXPECT_TRUE(scaler.UnscaleAndCheck(summed, 4.0));
  EXPECT_TRUE(at::equal(summed[0], a0));

  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {inf, -inf, nan}) {
    for (size_t which : {0u, 2u}) {
      std::vector<at::Tensor> g{at::randn({50}), at::randn({3, 3}), at::randn({50})};
      g[which].view({-1})[which == 0 ? 0 : 49] = bad;  // first and last elements
      EXPECT_FALSE(scaler.UnscaleAndCheck(g)) << bad << " in gradient " << which;
    }
  }
  // Finite gradients whose unscaled values are tiny are still finite.
  std::vector<at::Tensor> tiny{at::full({4}, 1e-30f)};
  EXPECT_TRUE(scaler.UnscaleAndCheck(tiny));
  // Nothing to check is clean.
  EXPECT_TRUE(scaler.UnscaleAndCheck({}));
}

TEST(LossScalerTest, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScaler scaler(o);
  ASSERT_TRUE(scaler.Update(false).ok());
  EXPECT_EQ(scaler.scale(), 512);
  ASSERT_TRUE(scaler.Update(true).ok());
  ASSERT_TRUE(scaler.Update(true).ok());
  EXPECT_EQ(scaler.scale(), 512);
  ASSERT_TRUE(scaler.Update(true).ok());
  EXPECT_EQ(scaler.scale(), 1024) << "three clean steps double it";
  // An overflow restarts the count of clean steps.
  ASSERT_TRUE(scaler.Update(true).ok());
  ASSERT_TRUE(scaler.Update(true).ok());
  ASSERT_TRUE(scaler.Update(false).ok());
  EXPECT_EQ(scaler.scale(), 512);
  ASSERT_TRUE(scaler.Update(true).ok());
  ASSERT_TRUE(scaler.Update(true).ok());
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(LossScalerTest, NeverGrowsPastFloat32sRange) {
  LossScalerOptions o;
  o.init_scale = 0x1p126;
  o.growth_interval = 1;
  LossScaler scaler(o);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(scaler.Update(true).ok());
  EXPECT_EQ(scaler.scale(), 0x1p127);
  EXPECT_TRUE(std::isfinite(static_cast<float>(scaler.scale())));
}

TEST(LossScalerTest, ARunOfOverflowsFailsWithAnActionableMessage) {
  LossScalerOptions o;
  o.max_consecutive_skips = 5;
  LossScaler scaler(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(scaler.Update(false).ok()) << i;
  ASSERT_TRUE(scaler.Update(true).ok()) << "a clean step ends the run";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(scaler.Update(false).ok()) << i;
  absl::Status s = scaler.Update(false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("5 steps in a row"), std::string::npos) << s;
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s;
  EXPECT_EQ(scaler.skipped_steps(), 9);
}

}  // namespace
}  // namespace pstrain
