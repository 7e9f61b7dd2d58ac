// TensorOptimizer (ATen ops, where an all-reduce worker's parameters live)
// against the shards' ApplyOptimizer loops: same values and state after
// several steps, for every optimizer and its options.
#include "worker/tensor_optimizer.h"

#include <ATen/Functions.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/torch_compat.h"
#include "table/optimizer.h"
#include "worker/device.h"

namespace pstrain {
namespace {

OptimizerConfig Config(OptimizerConfig::Kind kind, double wd, double momentum, bool nesterov) {
  OptimizerConfig c;
  c.set_kind(kind);
  c.set_lr(0.05);
  c.set_weight_decay(wd);
  c.set_momentum(momentum);
  c.set_nesterov(nesterov);
  c.set_dampening(nesterov ? 0 : 0.1);
  c.set_lr_decay(kind == OptimizerConfig::ADAGRAD ? 0.01 : 0);
  EXPECT_TRUE(NormalizeOptimizerConfig(&c).ok());
  return c;
}

TEST(TensorOptimizer, EqualsTheShardsArithmetic) {
  const OptimizerConfig configs[] = {
      Config(OptimizerConfig::SGD, 0, 0, false),     Config(OptimizerConfig::SGD, 0.01, 0.9, false),
      Config(OptimizerConfig::SGD, 0.01, 0.9, true), Config(OptimizerConfig::ADAM, 0.01, 0, false),
      Config(OptimizerConfig::ADAMW, 0.01, 0, false), Config(OptimizerConfig::ADAGRAD, 0.01, 0, false),
  };
  for (const OptimizerConfig& config : configs) {
    at::manual_seed(3);
    at::Tensor start = at::randn({257}, at::kDouble);
    at::Tensor p = start.clone();
    TensorOptimizer opt(config, {p});
    std::vector<double> ref(start.data_ptr<double>(), start.data_ptr<double>() + start.numel());
    const int slots = OptimizerStateSlots(config.kind());
    std::vector<std::vector<double>> state(slots, std::vector<double>(ref.size(), 0.0));
    if (config.kind() == OptimizerConfig::ADAGRAD) state[0].assign(ref.size(), config.initial_accumulator_value());
    std::vector<double*> state_ptrs;
    for (auto& s : state) state_ptrs.push_back(s.data());
    for (int step = 1; step <= 5; ++step) {
      at::Tensor g = at::randn({257}, at::kDouble);
      const double lr = step == 3 ? 0.02 : 0;  // one step with a scheduled rate
      opt.Step({g}, lr);
      OptimizerConfig c = config;
      if (lr > 0) c.set_lr(lr);
      ApplyOptimizer<double>(c, step, ref.data(), ref.data(), g.data_ptr<double>(), state_ptrs.data(), ref.size(), 1.0);
    }
    at::Tensor expected = at::from_blob(ref.data(), {257}, at::kDouble);
    EXPECT_TRUE(at::allclose(p, expected, 1e-12, 1e-12))
        << OptimizerConfig::Kind_Name(config.kind()) << " differs by " << p.sub(expected).abs().max().item<double>();
    for (int k = 0; k < slots; ++k) {
      at::Tensor s = at::from_blob(state[k].data(), {257}, at::kDouble);
      EXPECT_TRUE(at::allclose(opt.state(0)[k], s, 1e-12, 1e-12)) << OptimizerConfig::Kind_Name(config.kind()) << " slot " << k;
    }
    EXPECT_EQ(opt.step(), 5);
  }
}

// The all-reduce exchange's step on a device that never tells the host
// whether the gradients were finite: with found 0 it is Step, with found 1
// nothing changes, bit for bit.
TEST(TensorOptimizer, StepUnlessFoundSkipsOnTheDeviceAndOtherwiseIsStep) {
  if (!kHasFusedSgd) {
    GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION << ") has no fused SGD (2.4 on): the all-reduce exchange "
                 << "checks the gradients on the host instead (make test-torch2 runs this)";
  }
  for (bool nesterov : {false, true}) {
    const OptimizerConfig config = Config(OptimizerConfig::SGD, 0.01, 0.9, nesterov);
    at::manual_seed(5);
    std::vector<at::Tensor> a{at::randn({3, 5}, at::kDouble), at::randn({7}, at::kDouble)};
    std::vector<at::Tensor> b{a[0].clone(), a[1].clone()};
    TensorOptimizer fused(config, a), plain(config, b);
    EXPECT_FALSE(fused.CanStepUnlessFound()) << "the first update sets the momentum buffers on the host's path";
    std::vector<at::Tensor> g{at::randn({3, 5}, at::kDouble), at::randn({7}, at::kDouble)};
    fused.Step(g, 0);
    plain.Step(g, 0);
    ASSERT_TRUE(fused.CanStepUnlessFound());
    const at::Tensor no = at::zeros({}, at::kFloat), yes = at::ones({}, at::kFloat);
    for (int step = 2; step <= 5; ++step) {
      g = {at::randn({3, 5}, at::kDouble), at::randn({7}, at::kDouble)};
      fused.StepUnlessFound(g, step == 3 ? 0.02 : 0, no);
      plain.Step(g, step == 3 ? 0.02 : 0);
      // A non-finite step in between, flagged: nothing may move.
      std::vector<at::Tensor> before{a[0].clone(), a[1].clone(), fused.state(0)[0].clone(), fused.state(1)[0].clone()};
      std::vector<at::Tensor> bad{at::full({3, 5}, NAN, at::kDouble), at::full({7}, INFINITY, at::kDouble)};
      fused.StepUnlessFound(bad, 0, yes);
      EXPECT_TRUE(at::equal(a[0], before[0]) && at::equal(a[1], before[1])) << "a flagged step changed the values";
      EXPECT_TRUE(at::equal(fused.state(0)[0], before[2]) && at::equal(fused.state(1)[0], before[3]))
          << "a flagged step changed the momentum";
    }
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(at::allclose(a[i], b[i], 1e-12, 1e-12)) << "nesterov " << nesterov << " param " << i << " differs by "
                                                          << a[i].sub(b[i]).abs().max().item<double>();
      EXPECT_TRUE(at::allclose(fused.state(i)[0], plain.state(i)[0], 1e-12, 1e-12));
    }
  }
  // Mixed dtypes cannot go through one fused kernel: the host's path.
  TensorOptimizer mixed(Config(OptimizerConfig::SGD, 0, 0.9, false), {at::zeros({2}), at::zeros({2}, at::kDouble)});
  mixed.Step({at::ones({2}), at::ones({2}, at::kDouble)}, 0);
  EXPECT_FALSE(mixed.CanStepUnlessFound());
  // Adagrad has no device-decided skip (LibTorch's fused Adagrad is the
  // CPU's only).
  TensorOptimizer adagrad(Config(OptimizerConfig::ADAGRAD, 0, 0, false), {at::zeros({2})});
  adagrad.Step({at::ones({2})}, 0);
  EXPECT_FALSE(adagrad.CanStepUnlessFound());
}

// Adam and AdamW decided on the device: with found 0 as Step (to rounding:
// the fused kernel's order of operations), with found 1 nothing changes and
// the step does not count (the bias corrections depend on the count); Step
// afterwards goes on from the device's count.
void ExpectAdamStepUnlessFoundSkipsAndCountsWhatItApplied(const c10::Device& device) {
  const auto on = at::TensorOptions().dtype(at::kDouble).device(device);
  for (OptimizerConfig::Kind kind : {OptimizerConfig::ADAM, OptimizerConfig::ADAMW}) {
    for (double wd : {0.0, 0.01}) {
      SCOPED_TRACE(::testing::Message() << OptimizerConfig::Kind_Name(kind) << " weight decay " << wd);
      const OptimizerConfig config = Config(kind, wd, 0, false);
      at::manual_seed(6);
      std::vector<at::Tensor> a{at::randn({3, 5}, on), at::randn({7}, on)};
      std::vector<at::Tensor> b{a[0].clone(), a[1].clone()};
      TensorOptimizer fused(config, a), plain(config, b);
      ASSERT_TRUE(fused.CanStepUnlessFound()) << "Adam needs no first update on the host";
      const at::Tensor no = at::zeros({}, on.dtype(at::kFloat)), yes = at::ones({}, on.dtype(at::kFloat));
      for (int step = 1; step <= 4; ++step) {
        std::vector<at::Tensor> g{at::randn({3, 5}, on), at::randn({7}, on)};
        fused.StepUnlessFound(g, step == 2 ? 0.02 : 0, no);
        plain.Step(g, step == 2 ? 0.02 : 0);
        std::vector<at::Tensor> before{a[0].clone(), a[1].clone()};
        for (int i = 0; i < 2; ++i) {
          for (int k = 0; k < 2; ++k) before.push_back(fused.state(i)[k].clone());
        }
        std::vector<at::Tensor> bad{at::full({3, 5}, NAN, on), at::full({7}, INFINITY, on)};
        fused.StepUnlessFound(bad, 0, yes);
        EXPECT_TRUE(at::equal(a[0], before[0]) && at::equal(a[1], before[1])) << "a flagged step changed the values";
        for (int i = 0; i < 2; ++i) {
          for (int k = 0; k < 2; ++k) {
            EXPECT_TRUE(at::equal(fused.state(i)[k], before[2 + 2 * i + k])) << "a flagged step changed slot " << k;
          }
        }
        EXPECT_EQ(fused.step(), step) << "a flagged step counted";
      }
      // The host's path after the device's goes on from the device's count.
      std::vector<at::Tensor> g{at::randn({3, 5}, on), at::randn({7}, on)};
      fused.Step(g, 0);
      plain.Step(g, 0);
      EXPECT_EQ(fused.step(), 5);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(at::allclose(a[i], b[i], 1e-12, 1e-12))
            << "param " << i << " differs by " << a[i].sub(b[i]).abs().max().item<double>();
        for (int k = 0; k < 2; ++k) EXPECT_TRUE(at::allclose(fused.state(i)[k], plain.state(i)[k], 1e-12, 1e-12));
      }
      // Where the count would leave float32's exact integers: the host's path.
      fused.set_step((int64_t{1} << 24) - 1);
      EXPECT_FALSE(fused.CanStepUnlessFound());
    }
  }
}

TEST(TensorOptimizer, AdamStepUnlessFoundSkipsOnTheDeviceAndCountsWhatItApplied) {
  if (!kHasFusedAdam) {
    GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION << ") has no fused Adam (2.4 on): the all-reduce exchange "
                 << "checks the gradients on the host instead (make test-torch2 runs this)";
  }
  ExpectAdamStepUnlessFoundSkipsAndCountsWhatItApplied(c10::Device(c10::kCPU));
}

// The same with CUDA's fused kernels.
TEST(TensorOptimizer, AdamStepUnlessFoundOnTheGpu) {
  if (!kHasFusedAdam || CudaDevices() == 0) {
    GTEST_SKIP() << "no CUDA device: this LibTorch has no CUDA (Debian's 1.13 is CPU-only) or the machine no GPU "
                    "or driver; tools/gpu/run.sh runs this test on a GPU machine";
  }
  ExpectAdamStepUnlessFoundSkipsAndCountsWhatItApplied(c10::Device(c10::kCUDA, 0));
}

}  // namespace
}  // namespace pstrain
