// LossScaler: dynamic loss scaling for fp16 training, with the rules of
// PyTorch's GradScaler. fp16's smallest normal is 6e-5, so small gradients
// of activations flush to zero in backward; multiplying the loss by a large
// power of two keeps them representable. After backward the gradients are
// multiplied by 1/scale (exact: a power of two) and checked; a step whose
// gradients hold an Inf or NaN is skipped and the scale halves, and after
// `growth_interval` clean steps in a row it doubles.
//
// Where the check happens is the mode's business: a parameter-server worker
// unscales and checks its own gradients before pushing (a skipped step
// pushes an empty arrival, so the shards' step accounting goes on); an
// all-reduce exchange unscales the reduced gradients, which every rank
// holds identically, so every rank skips the same steps and their scales
// never diverge (as DDP with GradScaler).
#ifndef PSTRAIN_WORKER_LOSS_SCALER_H_
#define PSTRAIN_WORKER_LOSS_SCALER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace pstrain {

struct LossScalerOptions {
  // PyTorch's GradScaler defaults.
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
  // This many skipped steps in a row fail the job: the gradients are not
  // finite at any scale (the model diverged, or the data has NaN), and
  // skipping forever would look like training.
  int max_consecutive_skips = 32;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // What the loss is multiplied by before backward.
  double scale() const { return scale_; }
  // grads *= 1 / (scale * divisor) in place (undefined entries are passed
  // over); whether every element of every gradient is finite. One read of
  // the device per call (the step's decision needs it on the host).
  bool UnscaleAndCheck(const std::vector<at::Tensor>& grads, double divisor = 1.0) const;
  // The step's outcome: backs off after an overflow, grows after
  // growth_interval clean steps. FAILED_PRECONDITION after
  // max_consecutive_skips overflows in a row.
  absl::Status Update(bool finite);

  int64_t skipped_steps() const { return skipped_; }

 private:
  const LossScalerOptions options_;
  double scale_;
  int clean_ = 0;        // clean steps since the last change of scale
  int consecutive_ = 0;  // skipped steps in a row
  int64_t skipped_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_LOSS_SCALER_H_
