#include "worker/ctr_clip.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace pstrain {
namespace {

// The norm over `params`' gradients and `rows_squared`, and the coefficient
// clip / (norm + 1e-6), at most 1.
std::pair<double, double> NormAndCoefficient(double clip, const std::vector<at::Tensor>& params,
                                             double rows_squared) {
  double sq = rows_squared;
  for (const auto& p : params) {
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  return {norm, std::min(1.0, clip / (norm + 1e-6))};
}

}  // namespace

double ClipStepGradients(double clip, std::vector<at::Tensor>& params, const SparseEmbeddings& rows,
                         double* rows_scale) {
  const auto [norm, coef] = NormAndCoefficient(clip, params, rows.GradSquaredNorm());
  *rows_scale = 1.0;
  if (coef < 1.0) {
    for (auto& p : params) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
    *rows_scale = coef;
  }
  return norm;
}

absl::StatusOr<double> ClipBatchApart(double clip, std::vector<at::Tensor>& params, std::vector<at::Tensor>* sums,
                                      SparseEmbeddings* rows) {
  const auto [norm, coef] = NormAndCoefficient(clip, params, rows->GradSquaredNorm(/*last_forward_only=*/true));
  sums->resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& g = params[i].mutable_grad();
    if (!g.defined()) continue;
    if (coef < 1.0) g.mul_(coef);
    (*sums)[i] = (*sums)[i].defined() ? (*sums)[i].add_(g) : g.clone();
    g.reset();
  }
  if (absl::Status s = rows->Stash(coef); !s.ok()) return s;
  return norm;
}

}  // namespace pstrain
