// Fake quantization for quantization-aware training, computed as PyTorch's
// torch.ao.quantization.FakeQuantize computes it with a moving-average
// min/max observer (MovingAverageMinMaxObserver, or its per-channel twin for
// weights): the same ATen operations in the same order, so the results agree
// bit for bit at fp32 (quantize/fake_quant_test checks against PyTorch 1.13).
//
// Only ATen's fake_quantize_per_{tensor,channel}_affine (float in, float out,
// straight-through gradient) is used here; nothing depends on the legacy
// quantized:: ops, which live in quantize/int8_export alone.
//
// Not thread-safe: one FakeQuantize belongs to one model on one thread.
#ifndef PSTRAIN_QUANTIZE_FAKE_QUANT_H_
#define PSTRAIN_QUANTIZE_FAKE_QUANT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace pstrain {

enum class QuantScheme { kPerTensorAffine, kPerTensorSymmetric, kPerChannelSymmetric };

// What one fake quantizer does. The defaults of PyTorch's QAT qconfig for
// the onednn and qnnpack engines: activations quint8 [0, 255] per-tensor
// affine; weights qint8 [-128, 127] symmetric, per channel (axis 0) or per
// tensor.
struct QuantConfig {
  QuantScheme scheme = QuantScheme::kPerTensorAffine;
  bool signed_int8 = false;  // qint8 when true, quint8 otherwise
  int64_t quant_min = 0;
  int64_t quant_max = 255;
  int64_t ch_axis = 0;
  double averaging_constant = 0.01;

  static QuantConfig Activation();
  static QuantConfig Weight(bool per_channel);
  bool per_channel() const { return scheme == QuantScheme::kPerChannelSymmetric; }
  bool symmetric() const { return scheme != QuantScheme::kPerTensorAffine; }
};

// Turns one batch's (min, max) into those of every worker's batch at the
// same step (all-reduce mode: worker/qat_model.h), in place, before they
// move the observer, so every worker's observer sees the global batch. It
// is called on every observation, also of an empty batch (+inf, -inf); it
// throws c10::Error when it cannot (the step fails).
using BatchRangeReducer = std::function<void(at::Tensor& min, at::Tensor& max)>;

// PyTorch's MovingAverage(PerChannel)MinMaxObserver: the first batch sets
// min/max, later ones move them by averaging_constant toward the batch's.
// min_val/max_val are float32 buffers, shape [] per tensor or [channels] per
// channel, +inf/-inf until the first observation.
class MovingAverageMinMaxObserver {
 public:
  // `channels` is the size of the channel axis (per-channel only).
  MovingAverageMinMaxObserver(const QuantConfig& config, int64_t channels = 0);

  void Observe(const at::Tensor& x);
  bool observed() const;
  void SetBatchRangeReducer(BatchRangeReducer reducer) { reducer_ = std::move(reducer); }
  // calculate_qparams: scale (float32) and zero point (int32), shape [1] per
  // tensor or [channels]. A zero range gives scale = float32 eps, as
  // PyTorch's observers do; an unobserved one gives scale 1, zero point 0.
  std::pair<at::Tensor, at::Tensor> QParams() const;

  const QuantConfig& config() const { return config_; }
  at::Tensor& min_val() { return min_val_; }
  at::Tensor& max_val() { return max_val_; }

 private:
  QuantConfig config_;
  at::Tensor min_val_, max_val_;
  BatchRangeReducer reducer_;
};

// PyTorch's FakeQuantize: observe (when enabled), refresh scale and zero
// point from the observer, then fake-quantize (when enabled). The buffers
// (min_val, max_val, scale, zero_point) are the state a checkpoint keeps
// and that workers synchronise.
class FakeQuantize {
 public:
  FakeQuantize(const QuantConfig& config, int64_t channels = 0);

  at::Tensor Forward(const at::Tensor& x);
  // Moves the buffers (observer min/max, scale, zero point) to `device`.
  void To(const c10::Device& device);
  void EnableObserver(bool on) { observer_enabled_ = on; }
  void EnableFakeQuant(bool on) { fake_quant_enabled_ = on; }
  bool observer_enabled() const { return observer_enabled_; }
  void SetBatchRangeReducer(BatchRangeReducer reducer) { observer_.SetBatchRangeReducer(std::move(reducer)); }

  MovingAverageMinMaxObserver& observer() { return observer_; }
  const at::Tensor& scale() const { return scale_; }
  const at::Tensor& zero_point() const { return zero_point_; }
  // "min_val", "max_val", "scale", "zero_point", each prefixed by `prefix`.
  std::vector<std::pair<std::string, at::Tensor>> NamedBuffers(const std::string& prefix);

 private:
  MovingAverageMinMaxObserver observer_;
  at::Tensor scale_, zero_point_;
  bool observer_enabled_ = true;
  bool fake_quant_enabled_ = true;
};

}  // namespace pstrain

#endif  // PSTRAIN_QUANTIZE_FAKE_QUANT_H_
