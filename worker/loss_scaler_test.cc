// LossScaler: the unscale is exact (a power of two), every kind of
// non-finite value is caught in any gradient of the list, and the scale
// follows GradScaler's rules (back off on overflow, grow after a run of
// clean steps, never past fp32's range); a run of overflows fails.
#include "worker/loss_scaler.h"

#include <ATen/Functions.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/torch_compat.h"
#include "worker/device.h"

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

// On the device (LibTorch 2.4+): the same unscale, the same scale after
// every step and the same counts as the host's, learnt at Settle; a run of
// overflows fails there and stays failed; the scale moves only where
// float32 holds it, and back with its count of clean steps. The host's
// rules run on the CPU as the reference.
void ExpectTheDeviceFollowsTheHostsRules(const c10::Device& d) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  o.max_consecutive_skips = 4;
  LossScaler host(o), device(o);
  ASSERT_TRUE(device.MoveToDevice(d));
  EXPECT_TRUE(device.on_device());
  // clean x2, overflow, clean x3 (grows), overflow x2, clean
  const std::vector<bool> finite = {true, true, false, true, true, true, false, false, true};
  for (size_t i = 0; i < finite.size(); ++i) {
    SCOPED_TRACE(i);
    at::manual_seed(static_cast<int>(i));
    at::Tensor g = at::randn({100}), m = at::randn({10});
    if (!finite[i]) g[7] = INFINITY;
    std::vector<at::Tensor> hs{g.mul(host.scale() * 2)}, hm{m.mul(host.scale())};
    std::vector<at::Tensor> ds{g.mul(device.CurrentScale() * 2).to(d)}, dm{m.mul(device.CurrentScale()).to(d)};
    const bool host_finite = host.UnscaleAndCheck(hs, 2.0) && host.UnscaleAndCheck(hm);
    ASSERT_EQ(host_finite, finite[i]);
    ASSERT_TRUE(host.Update(host_finite).ok());
    at::Tensor found = device.UnscaleCheckAndUpdateOnDevice(ds, 2.0, dm);
    EXPECT_EQ(found.device(), d);
    EXPECT_EQ(found.item<float>(), finite[i] ? 0.0f : 1.0f);
    if (finite[i]) {
      EXPECT_TRUE(at::equal(ds[0].cpu(), hs[0]) && at::equal(dm[0].cpu(), hm[0])) << "unscaled differently";
    }
    ASSERT_TRUE(device.Settle().ok());
    EXPECT_EQ(device.scale(), host.scale());
    EXPECT_EQ(device.skipped_steps(), host.skipped_steps());
  }
  EXPECT_EQ(host.skipped_steps(), 3);
  // Back to the host with its count of clean steps: the same next growth.
  device.MoveToHost();
  EXPECT_FALSE(device.on_device());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(host.Update(true).ok());
    ASSERT_TRUE(device.Update(true).ok());
    EXPECT_EQ(device.scale(), host.scale()) << i;
  }
  // At the top of float32's range, with a divisor: scale x divisor is Inf in
  // float32, the unscale must not be by its reciprocal (0).
  o.init_scale = 0x1p127;
  LossScaler top(o);
  ASSERT_TRUE(top.MoveToDevice(d));
  at::Tensor g = at::randn({50}).clamp(-1, 1);  // g x 2^127 stays finite
  std::vector<at::Tensor> sums{g.mul(0x1p127).to(d)};
  EXPECT_EQ(top.UnscaleCheckAndUpdateOnDevice(sums, 2.0, {}).item<float>(), 0.0f);
  EXPECT_TRUE(at::allclose(sums[0].cpu(), g.div(2.0))) << "unscaled by " << sums[0].cpu().div(g).mean().item<double>();
  o.init_scale = 1024;
  // A run of overflows: told at Settle, and from then on.
  LossScaler diverging(o);
  ASSERT_TRUE(diverging.MoveToDevice(d));
  for (int i = 0; i < 4; ++i) {
    std::vector<at::Tensor> bad{at::full({3}, NAN, at::TensorOptions().device(d))};
    diverging.UnscaleCheckAndUpdateOnDevice(bad, 1.0, {});
  }
  absl::Status s = diverging.Settle();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("4 steps in a row"), std::string::npos) << s;
  EXPECT_EQ(diverging.Settle().code(), absl::StatusCode::kFailedPrecondition) << "the failure must stick";
  // A scale float32 cannot hold stays on the host.
  o.init_scale = 0x1p135;
  LossScaler huge(o);
  EXPECT_FALSE(huge.MoveToDevice(d));
  EXPECT_FALSE(huge.on_device());
}

TEST(LossScalerTest, OnTheDeviceFollowsTheHostsRulesAndTellsAtSettle) {
  if (!kHasFusedSgd) {
    GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION << ") has no fused optimizer (2.4 on), so the scaler never "
                 << "moves to the device (make test-torch2 runs this)";
  }
  ExpectTheDeviceFollowsTheHostsRules(c10::Device(c10::kCPU));  // the CPU's kernels as the device
}

// The same on CUDA: GradScaler's kernels there (_amp_update_scale_ on a
// 0-dim scale, the fused unscale-and-check).
TEST(LossScalerTest, OnTheGpuFollowsTheHostsRulesAndTellsAtSettle) {
  if (!kHasFusedSgd) GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION << ") has no fused optimizer (2.4 on)";
  if (CudaDevices() == 0) {
    GTEST_SKIP() << "no CUDA device here (tools/gpu/run.sh tests runs this on a GPU machine)";
  }
  ExpectTheDeviceFollowsTheHostsRules(c10::Device(c10::kCUDA, 0));
}

}  // namespace
}  // namespace pstrain
