// Evaluation on the test set, and what training and evaluation share:
// batches onto the device, autocast for the forward pass.
#ifndef PSTRAIN_WORKER_EVALUATION_H_
#define PSTRAIN_WORKER_EVALUATION_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "common/job_spec.h"
#include "common/torch_compat.h"
#include "worker/dataset.h"
#include "worker/model.h"

namespace pstrain {

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
};

// A batch on the training device, copied from pinned memory without
// blocking the host.
at::Tensor ToDevice(const at::Tensor& t, const c10::Device& device);

// Autocast on this thread for the forward pass (backward follows the dtypes
// forward chose), when the job asks for bf16 or fp16.
class AutocastScope {
 public:
  AutocastScope(const c10::Device& device, Precision precision)
      : type_(device.type()),
        on_(precision != Precision::kFp32),
        dtype_(precision == Precision::kFp16 ? at::kHalf : at::kBFloat16) {
    if (on_) SetAutocast(type_, true, dtype_);
  }
  ~AutocastScope() {
    if (on_) SetAutocast(type_, false, dtype_);
  }

 private:
  const c10::DeviceType type_;
  const bool on_;
  const c10::ScalarType dtype_;
};

// Loss and accuracy of `model` on `test`, in batches of 1000.
EvalResult Evaluate(Model& model, const Dataset& test, const c10::Device& device, Precision precision);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_EVALUATION_H_
