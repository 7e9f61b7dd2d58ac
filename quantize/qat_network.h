// Quantization-aware training's forward for a built-in model: its Linear
// and Conv layers with fake-quantized weights, and fake quantization of the
// activations where PyTorch's FX prepare_qat_fx puts it with the default
// QAT qconfig of the onednn/qnnpack engines (version 0: FakeQuantize with
// moving-average min/max observers): after the input, after each layer
// (after its ReLU), again after a max-pool (sharing the layer's observer),
// and after a flatten between layers. tests/qat_network_test checks the
// outputs, gradients and every observer against PyTorch's prepared model
// over training steps, bit for bit.
//
// The parameters are the model's own tensors (shared, not copied): the
// training loop updates them in place as it does without quantization.
#ifndef PSTRAIN_QUANTIZE_QAT_NETWORK_H_
#define PSTRAIN_QUANTIZE_QAT_NETWORK_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "quantize/builtin_layers.h"
#include "quantize/fake_quant.h"

namespace pstrain {

class QatNetwork {
 public:
  // `params`: the model's named parameters (<layer>.weight, <layer>.bias).
  // INVALID_ARGUMENT for a model that is not built in or parameters that do
  // not fit it (named).
  static absl::StatusOr<std::unique_ptr<QatNetwork>> Create(
      const std::string& model, const std::vector<std::pair<std::string, at::Tensor>>& params,
      bool per_channel_weights);

  at::Tensor Forward(const at::Tensor& x);

  // start_step / freeze_observers_step of the spec: every quantizer at once.
  void EnableFakeQuant(bool on);
  void EnableObservers(bool on);
  // Every activation quantizer's observer takes the batch range through
  // `reducer` (the weights' need not: every worker holds the same).
  void SetActivationRangeReducer(const BatchRangeReducer& reducer);
  void To(const c10::Device& device);

  // Every quantizer's min_val, max_val, scale, zero_point: "input.", then
  // per layer "<layer>.weight_fq." and "<layer>.out.", "<layer>.flatten."
  // (in forward order).
  std::vector<std::pair<std::string, at::Tensor>> NamedBuffers();
  // What the static int8 export converts with (Int8Options): the input's
  // and each layer's output quantizer's (scale, zero point), and each
  // layer's weight quantizer's scales and zero points.
  std::vector<std::pair<double, int64_t>> ActivationQParams() const;
  std::vector<std::pair<at::Tensor, at::Tensor>> WeightQParams() const;

  // The activation quantizers in forward order (input first), what the
  // static int8 export needs: out_quantizer(i) is layer i's output's.
  FakeQuantize& input_quantizer() { return *input_; }
  FakeQuantize& output_quantizer(size_t layer) { return *layers_[layer].out; }

 private:
  struct Layer {
    QuantLayer spec;
    at::Tensor weight, bias;
    std::unique_ptr<FakeQuantize> weight_fq, out, flatten;
  };
  QatNetwork() = default;

  std::unique_ptr<FakeQuantize> input_;
  std::vector<Layer> layers_;
};

}  // namespace pstrain

#endif  // PSTRAIN_QUANTIZE_QAT_NETWORK_H_
