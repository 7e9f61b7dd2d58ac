// quantize/qat_network against PyTorch's QAT: the same built-in model and
// steps (forward, cross entropy, backward, an SGD update) recorded here and
// replayed by tests/check_qat_network.py through prepare_qat_fx's model give
// the same logits, gradients and quantizer states bit for bit at fp32 --
// with inputs that collapse a range, outliers and a frozen observer.
#include "quantize/qat_network.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "quantize/int8_export.h"
#include "common/weights_file.h"

namespace pstrain {
namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

NamedTensors Params(const std::string& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  if (model == "lenet") {
    shapes = {
        {"conv1", {6, 1, 5, 5}}, {"conv2", {16, 6, 5, 5}}, {"fc1", {120, 400}}, {"fc2", {84, 120}}, {"fc3", {10, 84}}};
  } else {
    shapes = {{"fc1", {256, 784}}, {"fc2", {128, 256}}, {"fc3", {10, 128}}};
  }
  NamedTensors out;
  for (const auto& [name, shape] : shapes) {
    out.emplace_back(name + ".weight", (at::randn(shape) * 0.1).requires_grad_(true));
    out.emplace_back(name + ".bias", (at::randn({shape[0]}) * 0.1).requires_grad_(true));
  }
  return out;
}

class QatNetworkTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QatNetworkTest, MatchesPyTorchPrepareQatFxBitForBit) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is missing (make setup installs it)";
  }
  const std::string model = GetParam();
  at::manual_seed(36);
  NamedTensors params = Params(model);
  NamedTensors record;
  for (const auto& [name, p] : params) record.emplace_back("init/" + name, p.detach().clone());
  auto net = QatNetwork::Create(model, params, /*per_channel_weights=*/true);
  ASSERT_TRUE(net.ok()) << net.status();
  const int kSteps = 6;
  for (int k = 0; k < kSteps; ++k) {
    at::Tensor x = at::randn({8, 1, 28, 28});
    if (k == 2) x = x * 6;              // outliers past the averaged ranges
    if (k == 3) x = at::zeros_like(x);  // a collapsed input range
    const at::Tensor y = at::randint(0, 10, {8});
    const bool observe = k < kSteps - 1;  // the last step with observers frozen
    (*net)->EnableObservers(observe);
    at::Tensor out = (*net)->Forward(x);
    at::cross_entropy_loss(out, y).backward();
    const std::string p = "step/" + std::to_string(k) + "/";
    record.emplace_back(p + "observe", at::full({1}, observe ? 1 : 0, at::kInt));
    record.emplace_back(p + "x", x);
    record.emplace_back(p + "y", y);
    record.emplace_back(p + "out", out.detach().clone());
    for (auto& [name, t] : (*net)->NamedBuffers()) record.emplace_back(p + name.substr(0, name.size()), t.clone());
    at::NoGradGuard no_grad;
    for (auto& [name, param] : params) {
      record.emplace_back(p + "grad/" + name, param.grad().clone());
      param.add_(param.grad(), -0.05);
      param.mutable_grad().zero_();
    }
  }
  const std::string path = ::testing::TempDir() + "/qat_record_" + model + ".pt";
  ASSERT_TRUE(SaveWeights(record, path).ok());
  const std::string cmd = "cd tests && /usr/bin/python3 check_qat_network.py " + path + " " + model;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

INSTANTIATE_TEST_SUITE_P(BuiltInModels, QatNetworkTest, ::testing::Values("mlp", "lenet"));

TEST(QatNetworkRefusalTest, UnknownModelAndMissingParametersAreNamed) {
  auto unknown = QatNetwork::Create("torchscript:net.pt", {}, true);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  NamedTensors params = Params("mlp");
  params.erase(params.begin() + 3);  // fc2.bias
  auto missing = QatNetwork::Create("mlp", params, true);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("fc2.bias"), std::string::npos) << missing.status();
}

// With fake quantization off the network is the fp32 model.
TEST(QatNetworkRefusalTest, FakeQuantOffIsTheFloatModel) {
  at::manual_seed(1);
  NamedTensors params = Params("mlp");
  auto net = QatNetwork::Create("mlp", params, false);
  ASSERT_TRUE(net.ok());
  (*net)->EnableFakeQuant(false);
  const at::Tensor x = at::randn({4, 784});
  at::Tensor h = at::relu(at::linear(x, params[0].second, params[1].second));
  h = at::relu(at::linear(h, params[2].second, params[3].second));
  h = at::linear(h, params[4].second, params[5].second);
  EXPECT_TRUE(at::equal((*net)->Forward(x), h));
}

// A QAT network's learned quantizers convert to a static int8 module (as
// PyTorch's convert does) that computes what the fake-quantized network
// computes: int8 kernels round where fp32 fake quantization does, so the
// logits differ by at most a couple of output steps and the classes agree.
TEST_P(QatNetworkTest, LearnedScalesConvertToAStaticInt8ModuleThatAgrees) {
  const std::string model = GetParam();
  at::manual_seed(7);
  NamedTensors params = Params(model);
  auto net = QatNetwork::Create(model, params, /*per_channel_weights=*/true);
  ASSERT_TRUE(net.ok()) << net.status();
  for (int k = 0; k < 20; ++k) {  // training steps: the observers settle
    (*net)->Forward(at::randn({16, 1, 28, 28})).logsumexp(1).sum().backward();
    at::NoGradGuard no_grad;
    for (auto& [name, p] : params) {
      p.add_(p.grad(), -0.01);
      p.mutable_grad().zero_();
    }
  }
  (*net)->EnableObservers(false);  // freeze_observers_step
  Int8Options options;
  options.activation_qparams = (*net)->ActivationQParams();
  options.weight_qparams = (*net)->WeightQParams();
  auto int8 = BuildInt8Module(model, params, Int8Mode::kStatic, options);
  ASSERT_TRUE(int8.ok()) << int8.status();
  EXPECT_TRUE(int8->fp32_layers.empty());
  std::istringstream in(int8->bytes);
  torch::jit::Module m = torch::jit::load(in);
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({256, 1, 28, 28});
  const at::Tensor want = (*net)->Forward(x);
  const at::Tensor got = m.forward({model == "lenet" ? x : x.flatten(1)}).toTensor();
  const double out_scale = options.activation_qparams.back().first;
  EXPECT_LE((got - want).abs().max().item<double>(), 3 * out_scale + 1e-6);
  const double agree = got.argmax(1).eq(want.argmax(1)).to(at::kFloat).mean().item<double>();
  EXPECT_GE(agree, 0.97);
}

TEST(QatNetworkRefusalTest, LearnedQParamsMustFitTheModel) {
  Int8Options options;
  options.activation_qparams = {{0.1, 0}};
  auto m = BuildInt8Module("mlp", Params("mlp"), Int8Mode::kStatic, options);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
