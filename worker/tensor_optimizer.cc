#include "worker/tensor_optimizer.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
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

bool TensorOptimizer::CanStepUnlessFound() const {
  if (!kHasFusedSgd || config_.kind() != OptimizerConfig::SGD || step_ < 1 || params_.empty()) return false;
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
  const double mom = config_.momentum();
  std::vector<at::Tensor> bufs;
  if (mom != 0) {
    for (auto& set : state_) bufs.push_back(set[0]);
  }
  const double lr = lr_override > 0 ? lr_override : config_.lr();
  // The kernel wants each gradient laid out like its parameter.
  std::vector<at::Tensor> g;
  for (const at::Tensor& t : grads) g.push_back(t.contiguous());
  const bool done = FusedSgdUnlessFound(params_, g, bufs, config_.weight_decay(), mom, lr, config_.dampening(),
                                        config_.nesterov(), found_nonfinite);
  TORCH_CHECK(done, "StepUnlessFound without fused SGD (check CanStepUnlessFound)");
  ++step_;
}

void TensorOptimizer::Step(const std::vector<at::Tensor>& grads, double lr_override) {
  c10::NoGradGuard no_grad;
  ++step_;
  const double lr = lr_override > 0 ? lr_override : config_.lr();
  const double wd = config_.weight_decay();
  if (config_.kind() == OptimizerConfig::SGD && step_ > 1) {
    // The common case in multi-tensor kernels: a handful of launches for the
    // whole model instead of several per parameter.
    const std::vector<at::Tensor> d = wd != 0 ? at::_foreach_add(grads, params_, wd) : grads;
    const double mom = config_.momentum();
    if (mom == 0) {
      at::_foreach_add_(params_, d, -lr);
      return;
    }
    std::vector<at::Tensor> bufs;
    for (auto& set : state_) bufs.push_back(set[0]);
    at::_foreach_mul_(bufs, mom);
    at::_foreach_add_(bufs, d, 1.0 - config_.dampening());
    at::_foreach_add_(params_, config_.nesterov() ? at::_foreach_add(d, bufs, mom) : bufs, -lr);
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = grads[i];
    switch (config_.kind()) {
      case OptimizerConfig::SGD: {
        const double mom = config_.momentum();
        at::Tensor d = wd != 0 ? g.add(p, wd) : g;
        if (mom == 0) {
          p.sub_(d, lr);
          break;
        }
        at::Tensor& buf = state_[i][0];
        if (step_ == 1) {
          buf.copy_(d);  // PyTorch starts the momentum buffer as the first gradient
        } else {
          buf.mul_(mom).add_(d, 1.0 - config_.dampening());
        }
        if (config_.nesterov()) {
          p.sub_(d.add(buf, mom), lr);
        } else {
          p.sub_(buf, lr);
        }
        break;
      }
      case OptimizerConfig::ADAM:
      case OptimizerConfig::ADAMW: {
        const double b1 = config_.beta1(), b2 = config_.beta2();
        const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step_));
        const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(step_)));
        at::Tensor d = g;
        if (config_.kind() == OptimizerConfig::ADAMW) {
          p.mul_(1.0 - lr * wd);
        } else if (wd != 0) {
          d = g.add(p, wd);
        }
        at::Tensor& m = state_[i][0];
        at::Tensor& v = state_[i][1];
        m.mul_(b1).add_(d, 1.0 - b1);
        v.mul_(b2).addcmul_(d, d, 1.0 - b2);
        at::Tensor denom = v.sqrt().div_(bc2_sqrt).add_(config_.eps());
        p.addcdiv_(m, denom, -lr / bc1);
        break;
      }
      case OptimizerConfig::ADAGRAD: {
        const double clr = lr / (1.0 + static_cast<double>(step_ - 1) * config_.lr_decay());
        at::Tensor d = wd != 0 ? g.add(p, wd) : g;
        at::Tensor& sum = state_[i][0];
        sum.addcmul_(d, d, 1.0);
        p.addcdiv_(d, sum.sqrt().add_(config_.eps()), -clr);
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace pstrain
