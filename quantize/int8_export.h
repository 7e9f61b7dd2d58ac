// The int8 export: a trained built-in model's fp32 weights as a TorchScript
// module with int8 layers that PyTorch's torch.jit.load runs. The one place
// that uses LibTorch's legacy quantized:: ops (quantized::linear_prepack,
// linear_dynamic, linear, conv2d...): PyTorch is moving them to torchao and
// plans to remove them, so replacing this file is the whole migration.
//
// Modes (PyTorch's names):
//   dynamic: Linear layers int8 (weights quantized ahead, activations per
//            batch at run time); Conv layers stay fp32 and are reported.
//   static:  Linear and Conv layers int8 with activation scales calibrated
//            on example inputs; the module takes and returns fp32 tensors.
// Weights are qint8, symmetric, per output channel by default.
#ifndef PSTRAIN_QUANTIZE_INT8_EXPORT_H_
#define PSTRAIN_QUANTIZE_INT8_EXPORT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/weights_file.h"

namespace pstrain {


enum class Int8Mode { kFloat, kDynamic, kStatic };

// "fp32", "dynamic", "static"; INVALID_ARGUMENT for anything else.
absl::StatusOr<Int8Mode> ParseInt8Mode(const std::string& text);

struct Int8Options {
  std::string engine = "onednn";  // a quantized engine of this LibTorch
  bool per_channel_weights = true;
  // static: example inputs (N, input shape...) whose activation ranges set
  // the scales; ignored by the other modes.
  at::Tensor calibration;
  // static, converting a QAT model (QatNetwork's learned quantizers) in
  // place of calibration: (scale, zero point) of the input and of each
  // layer's output, and each layer's weight scales and zero points.
  std::vector<std::pair<double, int64_t>> activation_qparams;
  std::vector<std::pair<at::Tensor, at::Tensor>> weight_qparams;
};

struct Int8Module {
  std::string bytes;                     // the TorchScript archive
  std::vector<std::string> int8_layers;  // layers that run in int8
  std::vector<std::string> fp32_layers;  // layers kept in fp32 (named)
};

// The built-in model whose parameter names `weights` has: "lenet" with
// conv1/conv2 and fc1..fc3, "mlp" with fc1..fc3 only; INVALID_ARGUMENT,
// naming a parameter neither has, otherwise.
absl::StatusOr<std::string> InferModel(const NamedTensors& weights);

// A QAT job's final weights carry its quantizers ("qat.input.scale", ...,
// worker/qat_model.h): fills options' activation_qparams and weight_qparams
// from them and returns true; false when `weights` has none.
absl::StatusOr<bool> UseLearnedQParams(const std::string& model, const NamedTensors& weights, Int8Options* options);

// Builds the module for built-in model `model` ("mlp", "mlp_wide",
// "lenet") from its fp32 weights. Errors: INVALID_ARGUMENT for another
// model (naming what is known) or weights that do not fit it (naming the
// layer); FAILED_PRECONDITION when options.engine is not in this LibTorch
// (naming those that are).
absl::StatusOr<Int8Module> BuildInt8Module(const std::string& model, const NamedTensors& weights, Int8Mode mode,
                                           const Int8Options& options);

// Mean seconds per forward of the module in `bytes` on `input`, on one
// thread with `engine`, after warm-up.
absl::StatusOr<double> TimeForward(const std::string& bytes, const at::Tensor& input, const std::string& engine,
                                   int repeats);

}  // namespace pstrain

#endif  // PSTRAIN_QUANTIZE_INT8_EXPORT_H_
