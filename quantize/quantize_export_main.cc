// pstrain-quantize: a built-in model's fp32 weights (what `pstrain export`
// writes) as an int8 TorchScript module PyTorch's torch.jit.load runs
// (quantize/int8_export.h), with the sizes and one-thread latencies of the
// fp32 and int8 modules printed as one JSON line.
//
// MODEL is mlp, mlp_wide, lenet or auto (told by the parameter names).
//
//   pstrain-quantize MODEL WEIGHTS OUT dynamic|static [--engine E]
//       [--calibration FILE] [--per_tensor] [--fp32_out FILE]
//
// FILE for --calibration is a torch.save dict whose "inputs" is an (N, ...)
// float tensor of example inputs, normalised as in training.
#include <ATen/Functions.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "quantize/int8_export.h"

namespace pstrain {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pstrain-quantize: %s\n", s.ToString().c_str());
  return 1;
}

int Run(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: %s MODEL WEIGHTS OUT dynamic|static [--engine E] [--calibration FILE] [--per_tensor] "
                 "[--fp32_out FILE]\n",
                 argv[0]);
    return 2;
  }
  std::string model = argv[1];
  const std::string weights_path = argv[2], out_path = argv[3];
  Int8Options options;
  std::string calibration_path, fp32_out;
  for (int i = 5; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--engine") && has_value) {
      options.engine = argv[++i];
    } else if (!std::strcmp(argv[i], "--calibration") && has_value) {
      calibration_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--fp32_out") && has_value) {
      fp32_out = argv[++i];
    } else if (!std::strcmp(argv[i], "--per_tensor")) {
      options.per_channel_weights = false;
    } else {
      std::fprintf(stderr, "pstrain-quantize: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  auto mode = ParseInt8Mode(argv[4]);
  if (!mode.ok()) return Fail(mode.status());
  auto weights = ReadWeightsFile(weights_path);
  if (!weights.ok()) return Fail(weights.status());
  if (model == "auto") {
    auto inferred = InferModel(*weights);
    if (!inferred.ok()) return Fail(inferred.status());
    model = *inferred;
  }
  if (!calibration_path.empty()) {
    auto calibration = ReadWeightsFile(calibration_path);
    if (!calibration.ok()) return Fail(calibration.status());
    for (const auto& [name, t] : *calibration) {
      if (name == "inputs") options.calibration = t;
    }
    if (!options.calibration.defined()) {
      return Fail(absl::InvalidArgumentError(calibration_path + " has no \"inputs\" tensor"));
    }
  }
  // A QAT job's weights: static mode converts with the learned scales.
  bool qat = false;
  if (*mode == Int8Mode::kStatic) {
    auto learned = UseLearnedQParams(model, *weights, &options);
    if (!learned.ok()) return Fail(learned.status());
    qat = *learned;
  }
  if (*mode == Int8Mode::kStatic && !qat && calibration_path.empty()) {
    return Fail(absl::InvalidArgumentError("static mode needs --calibration FILE (or the weights of a QAT job)"));
  }
  auto int8 = BuildInt8Module(model, *weights, *mode, options);
  if (!int8.ok()) return Fail(int8.status());
  auto fp32 = BuildInt8Module(model, *weights, Int8Mode::kFloat, options);
  if (!fp32.ok()) return Fail(fp32.status());
  if (absl::Status s = WriteFileAtomically(out_path, int8->bytes); !s.ok()) return Fail(s);
  if (!fp32_out.empty()) {
    if (absl::Status s = WriteFileAtomically(fp32_out, fp32->bytes); !s.ok()) return Fail(s);
  }
  // One example's shape: LeNet's images, or the MLP's flat inputs.
  int64_t in_features = 784;
  for (const auto& [name, t] : *weights) {
    if (name == "fc1.weight" && model != "lenet") in_features = t.size(1);
  }
  std::string latency;
  for (int64_t batch : {1, 64}) {
    const at::Tensor x = model == "lenet" ? at::randn({batch, 1, 28, 28}) : at::randn({batch, in_features});
    const int repeats = batch == 1 ? 2000 : 200;
    auto t32 = TimeForward(fp32->bytes, x, options.engine, repeats);
    if (!t32.ok()) return Fail(t32.status());
    auto t8 = TimeForward(int8->bytes, x, options.engine, repeats);
    if (!t8.ok()) return Fail(t8.status());
    absl::StrAppendFormat(&latency, "%s\"batch%d_ms\": {\"fp32\": %.4f, \"int8\": %.4f}", batch == 1 ? "" : ", ", batch,
                          *t32 * 1e3, *t8 * 1e3);
  }
  auto quote_list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) absl::StrAppend(&s, s.empty() ? "" : ", ", "\"", x, "\"");
    return s;
  };
  std::printf(
      "{\"model\": \"%s\", \"mode\": \"%s\", \"qat_scales\": %s, \"engine\": \"%s\", \"out\": \"%s\", \"int8_bytes\": "
      "%zu, "
      "\"fp32_bytes\": %zu, \"int8_layers\": [%s], \"fp32_layers\": [%s], \"threads\": 1, %s}\n",
      model.c_str(), argv[4], qat ? "true" : "false", options.engine.c_str(), out_path.c_str(), int8->bytes.size(),
      fp32->bytes.size(), quote_list(int8->int8_layers).c_str(), quote_list(int8->fp32_layers).c_str(),
      latency.c_str());
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) { return pstrain::Run(argc, argv); }
