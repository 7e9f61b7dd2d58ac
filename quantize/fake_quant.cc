#include "quantize/fake_quant.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/GradMode.h>

#include <limits>

namespace pstrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

QuantConfig QuantConfig::Activation() { return QuantConfig{}; }

QuantConfig QuantConfig::Weight(bool per_channel) {
  QuantConfig c;
  c.scheme = per_channel ? QuantScheme::kPerChannelSymmetric : QuantScheme::kPerTensorSymmetric;
  c.signed_int8 = true;
  c.quant_min = -128;
  c.quant_max = 127;
  return c;
}

MovingAverageMinMaxObserver::MovingAverageMinMaxObserver(const QuantConfig& config, int64_t channels)
    : config_(config) {
  const std::vector<int64_t> shape = config.per_channel() ? std::vector<int64_t>{channels} : std::vector<int64_t>{};
  min_val_ = at::full(shape, kInf, at::kFloat);
  max_val_ = at::full(shape, -kInf, at::kFloat);
}

bool MovingAverageMinMaxObserver::observed() const {
  if (min_val_.numel() == 0) return false;
  // Every channel is set by the first observation, so one tells for all.
  const at::Tensor mn = min_val_.reshape({-1})[0], mx = max_val_.reshape({-1})[0];
  return !(mn.item<float>() == kInf && mx.item<float>() == -kInf);
}

void MovingAverageMinMaxObserver::Observe(const at::Tensor& x_orig) {
  if (x_orig.numel() == 0 && !reducer_) return;
  c10::NoGradGuard no_grad;
  at::Tensor x = x_orig.detach().to(at::kFloat);
  at::Tensor mn, mx;
  if (x.numel() == 0) {
    // Nothing seen here; the other workers' batches may hold something.
    mn = at::full_like(min_val_, kInf);
    mx = at::full_like(max_val_, -kInf);
  } else if (config_.per_channel()) {
    std::vector<int64_t> axes(x.dim());
    for (int64_t i = 0; i < x.dim(); ++i) axes[i] = i;
    axes[config_.ch_axis] = 0;
    axes[0] = config_.ch_axis;
    x = x.permute(axes).flatten(1);
    std::tie(mn, mx) = at::aminmax(x, 1);
  } else {
    std::tie(mn, mx) = at::aminmax(x);
  }
  if (reducer_) {
    reducer_(mn, mx);
    if (!at::isfinite(mn).all().item<bool>()) return;  // no worker saw anything
  }
  if (observed()) {
    // min + c * (cur - min), the order PyTorch's observers compute it in.
    mn = min_val_ + (mn - min_val_) * config_.averaging_constant;
    mx = max_val_ + (mx - max_val_) * config_.averaging_constant;
  }
  min_val_.resize_(mn.sizes());
  max_val_.resize_(mx.sizes());
  min_val_.copy_(mn);
  max_val_.copy_(mx);
}

std::pair<at::Tensor, at::Tensor> MovingAverageMinMaxObserver::QParams() const {
  c10::NoGradGuard no_grad;
  if (!observed()) {
    const int64_t n = config_.per_channel() ? min_val_.numel() : 1;
    return {at::ones({n}, at::kFloat), at::zeros({n}, at::kInt)};
  }
  at::Tensor min_neg = at::min(min_val_, at::zeros_like(min_val_));
  at::Tensor max_pos = at::max(max_val_, at::zeros_like(max_val_));
  const at::Tensor eps = at::full({1}, std::numeric_limits<float>::epsilon(), at::kFloat);
  at::Tensor scale, zero_point;
  const double range = static_cast<double>(config_.quant_max - config_.quant_min);
  if (config_.symmetric()) {
    max_pos = at::max(-min_neg, max_pos);
    scale = at::max(max_pos / (range / 2), eps);
    // qint8: zero point 0; quint8 with PyTorch's customised range: the
    // rounded-down midpoint.
    const int64_t zp = config_.signed_int8 ? 0 : (config_.quant_min + config_.quant_max) / 2;
    zero_point = at::full(min_neg.sizes(), zp, at::kLong);
  } else {
    scale = at::max((max_pos - min_neg) / range, eps);
    zero_point = at::rsub(at::round(min_neg / scale).to(at::kInt), config_.quant_min);
    zero_point = at::clamp(zero_point, config_.quant_min, config_.quant_max);
  }
  if (scale.dim() == 0) scale = scale.reshape({1});
  if (zero_point.dim() == 0) zero_point = zero_point.reshape({1});
  return {scale.to(at::kFloat), zero_point.to(at::kInt)};
}

FakeQuantize::FakeQuantize(const QuantConfig& config, int64_t channels) : observer_(config, channels) {
  const int64_t n = config.per_channel() ? channels : 1;
  scale_ = at::ones({n}, at::kFloat);
  zero_point_ = at::zeros({n}, at::kInt);
}

at::Tensor FakeQuantize::Forward(const at::Tensor& x) {
  const QuantConfig& c = observer_.config();
  if (observer_enabled_) {
    observer_.Observe(x);
    auto [scale, zero_point] = observer_.QParams();
    c10::NoGradGuard no_grad;
    scale_.resize_(scale.sizes());
    zero_point_.resize_(zero_point.sizes());
    scale_.copy_(scale);
    zero_point_.copy_(zero_point);
  }
  if (!fake_quant_enabled_) return x;
  if (c.per_channel()) {
    return at::fake_quantize_per_channel_affine(x, scale_, zero_point_, c.ch_axis, c.quant_min, c.quant_max);
  }
  return at::fake_quantize_per_tensor_affine(x, scale_, zero_point_, c.quant_min, c.quant_max);
}

void FakeQuantize::To(const c10::Device& device) {
  observer_.min_val() = observer_.min_val().to(device);
  observer_.max_val() = observer_.max_val().to(device);
  scale_ = scale_.to(device);
  zero_point_ = zero_point_.to(device);
}

std::vector<std::pair<std::string, at::Tensor>> FakeQuantize::NamedBuffers(const std::string& prefix) {
  return {{prefix + "min_val", observer_.min_val()},
          {prefix + "max_val", observer_.max_val()},
          {prefix + "scale", scale_},
          {prefix + "zero_point", zero_point_}};
}

}  // namespace pstrain
