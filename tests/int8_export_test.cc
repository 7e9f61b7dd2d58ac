// quantize/int8_export end to end with PyTorch: models trained on
// Fashion-MNIST by tests/quantize_models.py, exported in int8 here (dynamic
// and static), loaded by Python's torch.jit.load and scored on the 10,000
// test images within 1.0 point of the fp32 weights. And the refusals: an
// unknown model, weights that do not fit, an engine LibTorch lacks, static
// mode without calibration inputs.
#include "quantize/int8_export.h"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/file_util.h"

namespace pstrain {
namespace {

bool HavePythonTorch() { return std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0; }
bool HaveFashionMnist() {
  return std::system("test -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz") == 0;
}

class Int8ExportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8ExportTest, PythonLoadsTheModulesAndTheyScoreWithinOnePoint) {
  if (!HavePythonTorch()) GTEST_SKIP() << "python3-torch is missing (make setup installs it)";
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is missing under /usr/share/datasets (make setup)";
  const std::string model = GetParam(), dir = ::testing::TempDir();
  const std::string train = "/usr/bin/python3 tests/quantize_models.py train " + model + " " + dir + " 2";
  ASSERT_EQ(std::system(train.c_str()), 0) << train;
  auto weights = ReadWeightsFile(dir + "/" + model + ".pt");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto calibration = ReadWeightsFile(dir + "/calibration.pt");
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  Int8Options options;
  for (const auto& [name, t] : *calibration) {
    if (name == "inputs") options.calibration = t;
  }
  ASSERT_TRUE(options.calibration.defined());
  std::string modules;
  size_t fp32_bytes = 0;
  for (Int8Mode mode : {Int8Mode::kFloat, Int8Mode::kDynamic, Int8Mode::kStatic}) {
    auto m = BuildInt8Module(model, *weights, mode, options);
    ASSERT_TRUE(m.ok()) << m.status();
    if (mode == Int8Mode::kFloat) fp32_bytes = m->bytes.size();
    if (mode == Int8Mode::kDynamic && model == "lenet") {
      EXPECT_EQ(m->fp32_layers, (std::vector<std::string>{"conv1", "conv2"}));  // dynamic mode keeps Conv fp32
    }
    if (mode == Int8Mode::kStatic) {
      EXPECT_TRUE(m->fp32_layers.empty());
    }
    if (mode != Int8Mode::kFloat && model == "mlp") {
      EXPECT_LE(m->bytes.size(), fp32_bytes * 30 / 100) << "int8 export over 30% of fp32";
    }
    const std::string path = dir + "/" + model + "-" + std::to_string(static_cast<int>(mode)) + ".pt";
    ASSERT_TRUE(WriteFileAtomically(path, m->bytes).ok());
    modules += " " + path;
  }
  const std::string score =
      "/usr/bin/python3 tests/quantize_models.py score " + model + " " + dir + "/" + model + ".pt 1.0" + modules;
  EXPECT_EQ(std::system(score.c_str()), 0) << score;
}

INSTANTIATE_TEST_SUITE_P(BuiltInModels, Int8ExportTest, ::testing::Values("mlp", "lenet"));

NamedTensors MlpWeights() {
  return {{"fc1.weight", at::randn({16, 784})}, {"fc1.bias", at::zeros({16})},      {"fc2.weight", at::randn({8, 16})},
          {"fc2.bias", at::zeros({8})},         {"fc3.weight", at::randn({10, 8})}, {"fc3.bias", at::zeros({10})}};
}

TEST(Int8ExportRefusalTest, UnknownModelIsNamedWithTheKnownOnes) {
  auto m = BuildInt8Module("torchscript:net.pt", MlpWeights(), Int8Mode::kDynamic, {});
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("mlp, mlp_wide and lenet"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("torchscript:net.pt"), std::string::npos) << m.status();
}

TEST(Int8ExportRefusalTest, WeightsThatDoNotFitNameTheLayer) {
  NamedTensors w = MlpWeights();
  w.erase(w.begin() + 2);  // fc2.weight
  auto m = BuildInt8Module("mlp", w, Int8Mode::kDynamic, {});
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("fc2.weight"), std::string::npos) << m.status();
  auto lenet = BuildInt8Module("lenet", MlpWeights(), Int8Mode::kDynamic, {});
  ASSERT_EQ(lenet.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lenet.status().message().find("conv1.weight"), std::string::npos) << lenet.status();
}

TEST(Int8ExportRefusalTest, MissingEngineNamesTheEnginesThatExist) {
  Int8Options options;
  options.engine = "fbgemm";  // not in Debian's LibTorch 1.13
  auto m = BuildInt8Module("mlp", MlpWeights(), Int8Mode::kDynamic, options);
  if (m.ok()) GTEST_SKIP() << "this LibTorch has FBGEMM";
  ASSERT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("it has:"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("qnnpack"), std::string::npos) << m.status();
  options.engine = "tpu8";
  EXPECT_EQ(BuildInt8Module("mlp", MlpWeights(), Int8Mode::kDynamic, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Int8ExportRefusalTest, StaticModeNeedsCalibrationInputs) {
  auto m = BuildInt8Module("mlp", MlpWeights(), Int8Mode::kStatic, {});
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("calibration"), std::string::npos) << m.status();
  EXPECT_EQ(ParseInt8Mode("qat").status().code(), absl::StatusCode::kInvalidArgument);
}

// A constant input collapses the activation range: scales stay finite (eps)
// and the module still runs.
TEST(Int8ExportRefusalTest, CollapsedCalibrationRangeStillExports) {
  Int8Options options;
  options.calibration = at::zeros({4, 784});
  auto m = BuildInt8Module("mlp", MlpWeights(), Int8Mode::kStatic, options);
  ASSERT_TRUE(m.ok()) << m.status();
  auto t = TimeForward(m->bytes, at::zeros({2, 784}), "onednn", 1);
  ASSERT_TRUE(t.ok()) << t.status();
}

}  // namespace
}  // namespace pstrain
