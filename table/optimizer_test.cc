// The shard's optimizers against LibTorch's torch::optim on the same inputs.
#include "table/optimizer.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstring>
#include <memory>

namespace pstrain {
namespace {

struct OptCase {
  std::string name;
  OptimizerConfig config;
};

std::unique_ptr<torch::optim::Optimizer> TorchOptimizer(const OptimizerConfig& c,
                                                        std::vector<at::Tensor> params) {
  switch (c.kind()) {
    case OptimizerConfig::SGD:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(c.lr())
                      .momentum(c.momentum())
                      .dampening(c.dampening())
                      .nesterov(c.nesterov())
                      .weight_decay(c.weight_decay()));
    case OptimizerConfig::ADAM:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(c.lr())
                      .betas({c.beta1(), c.beta2()})
                      .eps(c.eps())
                      .weight_decay(c.weight_decay()));
    case OptimizerConfig::ADAMW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(c.lr())
                      .betas({c.beta1(), c.beta2()})
                      .eps(c.eps())
                      .weight_decay(c.weight_decay()));
    case OptimizerConfig::ADAGRAD:
      return std::make_unique<torch::optim::Adagrad>(
          params, torch::optim::AdagradOptions(c.lr())
                      .lr_decay(c.lr_decay())
                      .eps(c.eps())
                      .initial_accumulator_value(c.initial_accumulator_value())
                      .weight_decay(c.weight_decay()));
    default:
      return nullptr;
  }
}

template <typename T>
void RunCase(const OptCase& oc, c10::ScalarType type) {
  OptimizerConfig config = oc.config;
  ASSERT_TRUE(NormalizeOptimizerConfig(&config).ok());
  const int64_t n = 4097;
  at::manual_seed(3);
  at::Tensor p0 = at::randn({n}, at::TensorOptions().dtype(type));
  at::Tensor theirs = p0.clone().set_requires_grad(true);
  auto opt = TorchOptimizer(config, {theirs});
  ASSERT_NE(opt, nullptr);

  std::vector<T> ours(p0.data_ptr<T>(), p0.data_ptr<T>() + n);
  const int slots = OptimizerStateSlots(config.kind());
  std::vector<std::vector<T>> state(slots, std::vector<T>(n, 0));
  if (config.kind() == OptimizerConfig::ADAGRAD) {
    std::fill(state[0].begin(), state[0].end(), static_cast<T>(config.initial_accumulator_value()));
  }
  std::vector<T*> state_ptrs;
  for (auto& s : state) state_ptrs.push_back(s.data());

  for (int step = 1; step <= 12; ++step) {
    at::Tensor g = at::randn({n}, at::TensorOptions().dtype(type));
    // Ours receives the gradient doubled and scaled by 1/2, as a SYNC shard
    // applies the sum of two workers' gradients.
    at::Tensor doubled = g * 2;
    // Alternate in-place and out-of-place (copy-on-write) updates.
    if (step % 2 == 0) {
      ApplyOptimizer<T>(config, step, ours.data(), ours.data(), doubled.data_ptr<T>(),
                        state_ptrs.data(), n, 0.5);
    } else {
      std::vector<T> next(n);
      ApplyOptimizer<T>(config, step, ours.data(), next.data(), doubled.data_ptr<T>(),
                        state_ptrs.data(), n, 0.5);
      ours = std::move(next);
    }
    theirs.mutable_grad() = g.clone();
    opt->step();
  }
  at::Tensor ours_t = at::from_blob(ours.data(), {n}, at::TensorOptions().dtype(type));
  const double rtol = type == c10::ScalarType::Float ? 1e-5 : 1e-10;
  const double atol = type == c10::ScalarType::Float ? 1e-6 : 1e-12;
  EXPECT_TRUE(at::allclose(ours_t, theirs.detach(), rtol, atol))
      << oc.name << ": max abs diff " << (ours_t - theirs.detach()).abs().max().item<double>();
}

OptimizerConfig Sgd(double lr, double momentum, double dampening, bool nesterov, double wd) {
  OptimizerConfig c;
  c.set_kind(OptimizerConfig::SGD);
  c.set_lr(lr);
  c.set_momentum(momentum);
  c.set_dampening(dampening);
  c.set_nesterov(nesterov);
  c.set_weight_decay(wd);
  return c;
}

OptimizerConfig Adam(OptimizerConfig::Kind kind, double lr, double wd) {
  OptimizerConfig c;
  c.set_kind(kind);
  c.set_lr(lr);
  c.set_weight_decay(wd);
  return c;
}

OptimizerConfig Adagrad(double lr, double lr_decay, double init, double wd) {
  OptimizerConfig c;
  c.set_kind(OptimizerConfig::ADAGRAD);
  c.set_lr(lr);
  c.set_lr_decay(lr_decay);
  c.set_initial_accumulator_value(init);
  c.set_weight_decay(wd);
  return c;
}

class OptimizerTest : public ::testing::TestWithParam<OptCase> {};

TEST_P(OptimizerTest, MatchesTorchOptimFloat32) { RunCase<float>(GetParam(), c10::ScalarType::Float); }
TEST_P(OptimizerTest, MatchesTorchOptimFloat64) {
  RunCase<double>(GetParam(), c10::ScalarType::Double);
}

// The float32 loops' portable and AVX2 builds give the same bits: values,
// state and the finiteness verdict, over steps, with a gradient at an odd
// address (as read from a received slice) and a length no vector divides.
TEST_P(OptimizerTest, Avx2AndPortableBuildsAgreeBitForBit) {
  if (!optimizer_internal::HasAvx2()) GTEST_SKIP() << "this CPU has no AVX2: only the portable build runs here";
  const size_t n = 10'007;
  std::vector<float> value[2], state[2][2];
  std::vector<uint8_t> grad_bytes(n * 4 + 1);
  for (int v = 0; v < 2; ++v) {
    value[v] = std::vector<float>(n);
    for (size_t i = 0; i < n; ++i) value[v][i] = std::sin(0.37f * i);
    for (auto& st : state[v]) st.assign(n, GetParam().config.kind() == OptimizerConfig::ADAGRAD ? 0.1f : 0.0f);
  }
  for (int step = 1; step <= 5; ++step) {
    for (size_t i = 0; i < n; ++i) {
      float g = std::cos(0.011f * i * step) * (i % 97 == 0 ? 1e3f : 1.0f);
      std::memcpy(grad_bytes.data() + 1 + 4 * i, &g, 4);
    }
    bool ok[2];
    for (int v = 0; v < 2; ++v) {
      float* st[2] = {state[v][0].data(), state[v][1].data()};
      std::vector<float> out(n);
      ok[v] = (v == 0 ? optimizer_internal::ApplyFloatPortable : optimizer_internal::ApplyFloatAvx2)(
          GetParam().config, step, value[v].data(), out.data(), grad_bytes.data() + 1, st, n, 0.5);
      value[v] = out;
    }
    EXPECT_EQ(ok[0], ok[1]);
    ASSERT_EQ(std::memcmp(value[0].data(), value[1].data(), n * 4), 0) << "step " << step;
    for (int k = 0; k < 2; ++k) ASSERT_EQ(std::memcmp(state[0][k].data(), state[1][k].data(), n * 4), 0);
  }
  EXPECT_NE(value[0][5], std::sin(0.37f * 5));  // it did update
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OptimizerTest,
    ::testing::Values(OptCase{"sgd", Sgd(0.1, 0, 0, false, 0)},
                      OptCase{"sgd_momentum", Sgd(0.05, 0.9, 0, false, 0)},
                      OptCase{"sgd_dampening_wd", Sgd(0.05, 0.9, 0.3, false, 1e-2)},
                      OptCase{"sgd_nesterov_wd", Sgd(0.05, 0.9, 0, true, 5e-4)},
                      OptCase{"adam", Adam(OptimizerConfig::ADAM, 1e-3, 0)},
                      OptCase{"adam_wd", Adam(OptimizerConfig::ADAM, 1e-2, 1e-2)},
                      OptCase{"adamw", Adam(OptimizerConfig::ADAMW, 1e-2, 1e-2)},
                      OptCase{"adagrad", Adagrad(0.1, 0, 0, 0)},
                      OptCase{"adagrad_decay_init_wd", Adagrad(0.1, 0.01, 0.1, 1e-3)}),
    [](const auto& info) { return info.param.name; });

TEST(OptimizerConfigTest, RejectsBadSettingsNamingTheField) {
  OptimizerConfig c;
  EXPECT_NE(NormalizeOptimizerConfig(&c).message().find("optimizer.kind"), absl::string_view::npos);
  c = Sgd(-1, 0, 0, false, 0);
  EXPECT_NE(NormalizeOptimizerConfig(&c).message().find("optimizer.lr"), absl::string_view::npos);
  c = Sgd(0.1, 0, 0, true, 0);
  EXPECT_NE(NormalizeOptimizerConfig(&c).message().find("nesterov"), absl::string_view::npos);
  c = Adam(OptimizerConfig::ADAM, 0.1, 0);
  c.set_beta1(1.5);
  EXPECT_NE(NormalizeOptimizerConfig(&c).message().find("beta1"), absl::string_view::npos);
}

}  // namespace
}  // namespace pstrain
