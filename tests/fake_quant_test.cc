// quantize/fake_quant against PyTorch's own FakeQuantize: the same inputs,
// recorded here and replayed by tests/check_fake_quant.py, give the same
// outputs, straight-through gradients, observer min/max, scales and zero
// points bit for bit at fp32, including collapsed (zero) ranges, one-signed
// inputs, outliers and a frozen observer.
#include "quantize/fake_quant.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/weights_file.h"

namespace pstrain {
namespace {

// Input `kind` of shape `shape`; draws from the global generator.
at::Tensor Input(int kind, at::IntArrayRef shape) {
  switch (kind) {
    case 0:
      return at::randn(shape) * 3;
    case 1:
      return at::randn(shape) * 3 + 1;
    case 2:
      return at::zeros(shape);  // zero range
    case 3:
      return at::full(shape, 1.5f);  // constant, positive only
    case 4:
      return at::randn(shape) * 1e-3;  // tiny range
    case 5:
      return at::randn(shape) * 50;  // outliers beyond the averaged range
    case 6:
      return -at::randn(shape).abs();  // negative only
    default: {                         // one channel (axis 0) all zeros, the rest normal
      at::Tensor x = at::randn(shape);
      x[1].zero_();
      return x;
    }
  }
}

struct Case {
  std::string name;
  QuantConfig config;
  int64_t channels;
  std::vector<int64_t> shape;
  std::vector<int> kinds;  // one input kind per step
};

TEST(FakeQuantTest, MatchesPyTorchFakeQuantizeBitForBit) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is missing (make setup installs it)";
  }
  const std::vector<Case> cases = {
      {"act", QuantConfig::Activation(), 0, {4, 6, 3}, {0, 1, 2, 3, 4, 5, 6, 0, 1}},
      {"act_zero_first", QuantConfig::Activation(), 0, {16}, {2, 3, 6, 0, 5}},
      {"act_positive", QuantConfig::Activation(), 0, {5, 7}, {3, 1, 1, 4}},
      {"wpt", QuantConfig::Weight(false), 0, {8, 5}, {0, 1, 2, 5, 6, 7, 0}},
      {"wpc", QuantConfig::Weight(true), 8, {8, 5}, {7, 0, 1, 2, 5, 6, 4, 0}},
      {"wpc_conv", QuantConfig::Weight(true), 6, {6, 2, 5, 5}, {0, 7, 5, 1, 0}},
  };
  at::manual_seed(36);
  std::vector<std::pair<std::string, at::Tensor>> record;
  int recorded_steps = 0;
  for (const Case& c : cases) {
    FakeQuantize fq(c.config, c.channels);
    for (size_t step = 0; step < c.kinds.size(); ++step) {
      // The last step of each case runs with the observer frozen.
      const bool observe = step + 1 < c.kinds.size();
      fq.EnableObserver(observe);
      at::Tensor x = Input(c.kinds[step], c.shape).requires_grad_(true);
      at::Tensor g = at::randn(c.shape);
      at::Tensor y = fq.Forward(x);
      (y * g).sum().backward();
      const std::string p = c.name + "/" + std::to_string(step) + "/";
      record.emplace_back(p + "observe", at::full({1}, observe ? 1 : 0, at::kInt));
      record.emplace_back(p + "in", x.detach().clone());
      record.emplace_back(p + "g", g);
      record.emplace_back(p + "out", y.detach().clone());
      record.emplace_back(p + "grad", x.grad().clone());
      for (auto& [name, t] : fq.NamedBuffers(p)) record.emplace_back(name, t.clone());
      ++recorded_steps;
    }
  }
  ASSERT_EQ(recorded_steps, 38);
  const std::string path = ::testing::TempDir() + "/fake_quant_record.pt";
  ASSERT_TRUE(SaveWeights(record, path).ok());
  const std::string cmd = "/usr/bin/python3 tests/check_fake_quant.py " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A zero range gives float32 eps as the scale (PyTorch's observers clamp
// the scale there), not a division by zero; an unobserved one scale 1.
TEST(FakeQuantTest, CollapsedAndUnobservedRangesGiveFiniteScales) {
  MovingAverageMinMaxObserver obs(QuantConfig::Activation());
  EXPECT_FALSE(obs.observed());
  auto [s0, z0] = obs.QParams();
  EXPECT_EQ(s0.item<float>(), 1.0f);
  EXPECT_EQ(z0.item<int>(), 0);
  obs.Observe(at::zeros({10}));
  EXPECT_TRUE(obs.observed());
  auto [s1, z1] = obs.QParams();
  EXPECT_EQ(s1.item<float>(), std::numeric_limits<float>::epsilon());
  EXPECT_EQ(z1.item<int>(), 0);
  FakeQuantize fq(QuantConfig::Weight(true), 3);
  at::Tensor y = fq.Forward(at::zeros({3, 4}));
  EXPECT_TRUE(at::equal(y, at::zeros({3, 4})));
  EXPECT_TRUE(at::isfinite(fq.scale()).all().item<bool>());
}

}  // namespace
}  // namespace pstrain
