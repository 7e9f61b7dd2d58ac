#include "worker/evaluation.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <c10/core/GradMode.h>

#include <algorithm>

namespace pstrain {

at::Tensor ToDevice(const at::Tensor& t, const c10::Device& device) {
  if (device.is_cpu()) return t;
  return (t.is_pinned() ? t : t.pin_memory()).to(device, /*non_blocking=*/true);
}

EvalResult Evaluate(Model& model, const Dataset& test, const c10::Device& device, Precision precision) {
  c10::NoGradGuard no_grad;
  model.SetTraining(false);
  double loss_sum = 0;
  int64_t correct = 0;
  const int64_t n = test.size();
  for (int64_t start = 0; start < n; start += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - start);
    at::Tensor logits;
    {
      AutocastScope autocast(device, precision);
      logits = model.Forward(test.Normalize(ToDevice(test.inputs.narrow(0, start, len), device))).to(at::kFloat);
    }
    at::Tensor y = ToDevice(test.labels.narrow(0, start, len), device);
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  model.SetTraining(true);
  return {n == 0 ? 0 : loss_sum / n, n == 0 ? 0 : static_cast<double>(correct) / n};
}

}  // namespace pstrain
