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
//
// Where the all-reduce exchange's optimizer decides its steps on the device
// (fused SGD/Adam, LibTorch 2.4+), the scaler moves there too, as GradScaler
// with a fused optimizer: the scale and the count of clean steps become
// tensors on the device, each step's unscale, check and update run there,
// and the host learns the verdicts -- skipped steps, the scale, a run of
// overflows -- a step later (Settle), without ever waiting for a step.
#ifndef PSTRAIN_WORKER_LOSS_SCALER_H_
#define PSTRAIN_WORKER_LOSS_SCALER_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "worker/device.h"

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

  // What the loss is multiplied by before backward; on the device, the
  // scale as of the last Settle.
  double scale() const { return scale_; }
  // loss * factor * the scale (the device's, there).
  at::Tensor ScaleLoss(const at::Tensor& loss, double factor) const;
  // grads *= 1 / (scale * divisor) in place (undefined entries are passed
  // over); whether every element of every gradient is finite. One read of
  // the device per call (the step's decision needs it on the host).
  bool UnscaleAndCheck(const std::vector<at::Tensor>& grads, double divisor = 1.0) const;
  // The step's outcome: backs off after an overflow, grows after
  // growth_interval clean steps. FAILED_PRECONDITION after
  // max_consecutive_skips overflows in a row.
  absl::Status Update(bool finite);

  // On the device: as of the last Settle.
  int64_t skipped_steps() const { return skipped_; }

  // Moves the scale and the count of clean steps to `device`, where a scale
  // within float32's normal range can go (GradScaler keeps it in float32);
  // returns whether they are there. Idempotent.
  bool MoveToDevice(const c10::Device& device);
  // Back to the host (after a Settle). Idempotent.
  void MoveToHost();
  bool on_device() const { return scale_on_device_.defined(); }
  // On the device, in place and without a read: `sums` times 1/(scale *
  // divisor), `means` times 1/scale, the scale updated by the verdict. Returns
  // the verdict, a float32 scalar on the device: 1 where any element was
  // NaN or Inf (the step must change nothing).
  at::Tensor UnscaleCheckAndUpdateOnDevice(const std::vector<at::Tensor>& sums, double divisor,
                                           const std::vector<at::Tensor>& means);
  // Counts the verdicts of the steps since the last call (skipped_steps,
  // scale): FAILED_PRECONDITION, and so from then on, once
  // max_consecutive_skips overflows came in a row. Nothing to do on the host.
  absl::Status Settle();
  // The scale the next step uses: on the device, a read of it (to keep with
  // a checkpoint).
  double CurrentScale();

 private:
  // One more overflow in a row: the error once there were too many.
  absl::Status CountSkip();

  const LossScalerOptions options_;
  double scale_;
  int clean_ = 0;        // clean steps since the last change of scale (the host's)
  int consecutive_ = 0;  // skipped steps in a row
  int64_t skipped_ = 0;
  // On the device: the scale (float32) and the clean steps (int32), as
  // GradScaler keeps them, and per step since the last Settle its verdict
  // and the scale after it, on their way to the host.
  at::Tensor scale_on_device_, clean_on_device_;
  std::deque<std::pair<DeferredScalar, DeferredScalar>> unsettled_;
  absl::Status error_;  // sticky: a run of overflows fails every later Settle
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_LOSS_SCALER_H_
