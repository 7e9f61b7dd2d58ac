// TensorOptimizer (ATen ops, where an all-reduce worker's parameters live)
// against the shards' ApplyOptimizer loops: same values and state after
// several steps, for every optimizer and its options.
#include "worker/tensor_optimizer.h"

#include <ATen/Functions.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "table/optimizer.h"

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

}  // namespace
}  // namespace pstrain
