#include "worker/loss_scaler.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "worker/device.h"

namespace pstrain {

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {}

bool LossScaler::UnscaleAndCheck(const std::vector<at::Tensor>& grads, double divisor) const {
  c10::NoGradGuard no_grad;
  const double inv = 1.0 / (scale_ * divisor);
  // CUDA has GradScaler's fused kernel (one launch per list, no read of the
  // device); LibTorch 1.13 has it for CUDA only, so elsewhere: multiply,
  // then scan on the host (other devices: one flag per gradient, all read
  // at once). (GradScaler groups by device and dtype too.)
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> cuda;
  bool finite = true;
  at::Tensor bad;  // elsewhere: any non-finite element
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    if (g.is_cuda() && g.scalar_type() != at::kDouble) {
      cuda[{g.device().str(), g.scalar_type()}].push_back(g);
      continue;
    }
    g.mul_(inv);
    if (g.device().is_cpu()) {
      finite = finite && HostAllFinite(g);
      continue;
    }
    at::Tensor b = at::isfinite(g).logical_not_().any();
    bad = bad.defined() ? bad.logical_or_(b) : b;
  }
  finite = finite && (!bad.defined() || !bad.item<bool>());
  for (auto& [key, list] : cuda) {
    const c10::Device device = list.front().device();
    at::Tensor found = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat));
    at::Tensor inv_t = at::full({1}, inv, at::TensorOptions().device(device).dtype(at::kFloat));
    at::_amp_foreach_non_finite_check_and_unscale_(list, found, inv_t);
    finite = finite && found.item<float>() == 0.0f;
  }
  return finite;
}

absl::Status LossScaler::Update(bool finite) {
  if (finite) {
    consecutive_ = 0;
    if (++clean_ >= options_.growth_interval) {
      const double grown = scale_ * options_.growth_factor;
      // fp32's largest power of two: beyond it the scaled loss is Inf.
      if (std::isfinite(grown) && grown <= 0x1p127) scale_ = grown;
      clean_ = 0;
    }
    return absl::OkStatus();
  }
  clean_ = 0;
  scale_ *= options_.backoff_factor;
  return CountSkip();
}

absl::Status LossScaler::CountSkip() {
  ++skipped_;
  if (++consecutive_ >= options_.max_consecutive_skips) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "fp16: %d steps in a row had NaN or Inf gradients, down to a loss scale of %g: the model diverged (or the "
        "data holds NaN); lower the learning rate, clip gradients, or train in bf16",
        consecutive_, scale_));
  }
  return absl::OkStatus();
}

at::Tensor LossScaler::ScaleLoss(const at::Tensor& loss, double factor) const {
  if (!on_device()) return loss * (factor * scale_);
  return loss.mul(factor).mul(scale_on_device_);
}

bool LossScaler::MoveToDevice(const c10::Device& device) {
  if (on_device()) return true;
  // float32's normal range: GradScaler's scale is a float32 tensor.
  if (!(scale_ >= 0x1p-126 && scale_ <= 0x1p127)) return false;
  const auto on = at::TensorOptions().device(device);
  scale_on_device_ = at::full({}, scale_, on.dtype(at::kFloat));
  clean_on_device_ = at::full({}, clean_, on.dtype(at::kInt));
  return true;
}

void LossScaler::MoveToHost() {
  if (!on_device()) return;
  (void)Settle();  // a run of overflows stays sticky
  scale_ = scale_on_device_.item<double>();
  clean_ = clean_on_device_.item<int>();
  scale_on_device_ = clean_on_device_ = at::Tensor();
}

at::Tensor LossScaler::UnscaleCheckAndUpdateOnDevice(const std::vector<at::Tensor>& sums, double divisor,
                                                     const std::vector<at::Tensor>& means) {
  c10::NoGradGuard no_grad;
  at::Tensor found = at::zeros({}, scale_on_device_.options());
  // GradScaler's kernels: the unscale and the check in one pass over each
  // list, then the scale's update from the verdict -- nothing read.
  if (!sums.empty()) {
    // 1/scale first: scale * divisor may overflow float32 where the scale is
    // near its top (2^127 x 2 ranks is Inf, and its reciprocal 0).
    at::_amp_foreach_non_finite_check_and_unscale_(sums, found, scale_on_device_.reciprocal().div(divisor));
  }
  if (!means.empty()) at::_amp_foreach_non_finite_check_and_unscale_(means, found, scale_on_device_.reciprocal());
  at::_amp_update_scale_(scale_on_device_, clean_on_device_, found, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
  unsettled_.emplace_back(DeferredScalar(found), DeferredScalar(scale_on_device_.clone()));
  return found;
}

absl::Status LossScaler::Settle() {
  while (!unsettled_.empty() && error_.ok()) {
    const bool finite = unsettled_.front().first.Value() == 0;
    scale_ = unsettled_.front().second.Value();
    unsettled_.pop_front();
    if (finite) {
      consecutive_ = 0;
    } else {
      error_ = CountSkip();
    }
  }
  return error_;
}

double LossScaler::CurrentScale() {
  if (!on_device()) return scale_;
  (void)Settle();
  return scale_on_device_.item<double>();
}

}  // namespace pstrain
