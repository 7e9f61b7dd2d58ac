#include "worker/tensor_optimizer.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "common/torch_compat.h"
#include "table/optimizer.h"

namespace pstrain {

TensorOptimizer::TensorOptimizer(const OptimizerConfig& config, std::vector<at::Tensor> params)
    : config_(config), params_(std::move(params)), slots_(OptimizerStateSlots(config.kind())) {
  c10::NoGradGuard no_grad;
  for (const at::Tensor& p : params_) {
    std::vector<at::Tensor> set;
    for (int k = 0; k < slots_; ++k) set.push_back(at::zeros_like(p));
    if (config_.kind() == OptimizerConfig::ADAGRAD && slots_ > 0) set[0].fill_(config_.initial_accumulator_value());
    state_.push_back(std::move(set));
  }
}

std::vector<at::Tensor> TensorOptimizer::Slot(int k) const {
  std::vector<at::Tensor> out;
  if (k >= slots_) return out;
  for (const auto& set : state_) out.push_back(set[k]);
  return out;
}

int64_t TensorOptimizer::step() const {
  return device_steps_.empty() ? step_ : static_cast<int64_t>(device_steps_.front().item<float>());
}

void TensorOptimizer::set_step(int64_t step) {
  step_ = step;
  device_steps_.clear();
}

bool TensorOptimizer::CanStepUnlessFound() const {
  if (params_.empty()) return false;
  switch (config_.kind()) {
    case OptimizerConfig::SGD:
      if (!kHasFusedSgd || step_ < 1) return false;
      break;
    case OptimizerConfig::ADAM:
    case OptimizerConfig::ADAMW:
      // Counted in float32 on the device: exact below 2^24.
      if (!kHasFusedAdam || step_ >= (int64_t{1} << 24) - 1) return false;
      break;
    default:
      return false;
  }
  for (const at::Tensor& p : params_) {
    if (p.scalar_type() != params_[0].scalar_type() || p.device() != params_[0].device() || !p.is_contiguous()) {
      return false;
    }
  }
  return true;
}

void TensorOptimizer::StepUnlessFound(const std::vector<at::Tensor>& grads, double lr_override,
                                      const at::Tensor& found_nonfinite) {
  c10::NoGradGuard no_grad;
  const double lr = lr_override > 0 ? lr_override : config_.lr();
  // The kernels want each gradient laid out like its parameter.
  std::vector<at::Tensor> g;
  for (const at::Tensor& t : grads) g.push_back(t.contiguous());
  const std::vector<at::Tensor> slot0 = Slot(0), slot1 = Slot(1);
  bool done = false;
  if (config_.kind() == OptimizerConfig::SGD) {
    const double mom = config_.momentum();
    done = FusedSgdUnlessFound(params_, g, mom != 0 ? slot0 : std::vector<at::Tensor>{}, config_.weight_decay(), mom,
                               lr, config_.dampening(), config_.nesterov(), found_nonfinite);
  } else {
    // One count per parameter, as PyTorch's fused Adam keeps them (and
    // counts: one more before the kernel, one less after it where it
    // skipped).
    if (device_steps_.empty()) {
      const at::Tensor count = at::full({}, static_cast<double>(step_), params_[0].options().dtype(at::kFloat));
      for (size_t i = 0; i < params_.size(); ++i) device_steps_.push_back(count.clone());
    }
    at::_foreach_add_(device_steps_, 1.0);
    done = FusedAdamUnlessFound(params_, g, slot0, slot1, device_steps_, lr, config_.beta1(), config_.beta2(),
                                config_.weight_decay(), config_.eps(), config_.kind() == OptimizerConfig::ADAMW,
                                found_nonfinite);
    at::_foreach_sub_(device_steps_, std::vector<at::Tensor>(device_steps_.size(), found_nonfinite));
  }
  TORCH_CHECK(done, "StepUnlessFound without a fused kernel (check CanStepUnlessFound)");
  ++step_;
}

void TensorOptimizer::Step(const std::vector<at::Tensor>& grads, double lr_override) {
  c10::NoGradGuard no_grad;
  if (!device_steps_.empty()) set_step(step());  // the count, back from the device
  ++step_;
  const double lr = lr_override > 0 ? lr_override : config_.lr();
  const double wd = config_.weight_decay();
  // Multi-tensor kernels: on a GPU a handful of launches per step for the
  // whole model instead of several per parameter; on the CPU the same
  // per-tensor operations, in the same order.
  const std::vector<at::Tensor> slot0 = Slot(0), slot1 = Slot(1);
  switch (config_.kind()) {
    case OptimizerConfig::SGD: {
      const std::vector<at::Tensor> d = wd != 0 ? at::_foreach_add(grads, params_, wd) : grads;
      const double mom = config_.momentum();
      if (mom == 0) {
        at::_foreach_add_(params_, d, -lr);
        break;
      }
      if (step_ == 1) {
        // PyTorch starts the momentum buffer as the first gradient.
        for (size_t i = 0; i < params_.size(); ++i) slot0[i].copy_(d[i]);
      } else {
        at::_foreach_mul_(slot0, mom);
        at::_foreach_add_(slot0, d, 1.0 - config_.dampening());
      }
      at::_foreach_add_(params_, config_.nesterov() ? at::_foreach_add(d, slot0, mom) : slot0, -lr);
      break;
    }
    case OptimizerConfig::ADAM:
    case OptimizerConfig::ADAMW: {
      const double b1 = config_.beta1(), b2 = config_.beta2();
      const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step_));
      const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(step_)));
      std::vector<at::Tensor> d = grads;
      if (config_.kind() == OptimizerConfig::ADAMW) {
        at::_foreach_mul_(params_, 1.0 - lr * wd);
      } else if (wd != 0) {
        d = at::_foreach_add(grads, params_, wd);
      }
      at::_foreach_mul_(slot0, b1);
      at::_foreach_add_(slot0, d, 1.0 - b1);
      at::_foreach_mul_(slot1, b2);
      at::_foreach_addcmul_(slot1, d, d, 1.0 - b2);
      std::vector<at::Tensor> denom = at::_foreach_sqrt(slot1);
      at::_foreach_div_(denom, bc2_sqrt);
      at::_foreach_add_(denom, config_.eps());
      at::_foreach_addcdiv_(params_, slot0, denom, -lr / bc1);
      break;
    }
    case OptimizerConfig::ADAGRAD: {
      const double clr = lr / (1.0 + static_cast<double>(step_ - 1) * config_.lr_decay());
      const std::vector<at::Tensor> d = wd != 0 ? at::_foreach_add(grads, params_, wd) : grads;
      at::_foreach_addcmul_(slot0, d, d, 1.0);
      std::vector<at::Tensor> denom = at::_foreach_sqrt(slot0);
      at::_foreach_add_(denom, config_.eps());
      at::_foreach_addcdiv_(params_, d, denom, -clr);
      break;
    }
    default:
      break;
  }
}

}  // namespace pstrain
