#include "worker/vacant_rank_cover.h"

#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

namespace pstrain {

void VacantRankCover::SetAside(const std::vector<at::Tensor>& params) {
  c10::NoGradGuard no_grad;
  sum_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& grad = params[i].grad();
    if (!grad.defined()) continue;
    if (!sum_[i].defined()) sum_[i] = at::zeros_like(grad);
    sum_[i].add_(grad);
    params[i].mutable_grad().zero_();
  }
}

void VacantRankCover::Restore(const std::vector<at::Tensor>& params) {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < sum_.size() && i < params.size(); ++i) {
    if (!sum_[i].defined()) continue;
    params[i].mutable_grad().copy_(sum_[i]);
    sum_[i].zero_();
  }
}

}  // namespace pstrain
