// The shards' optimizers (table/optimizer.cc: SGD with momentum, dampening,
// Nesterov and weight decay; Adam; AdamW; Adagrad) written with ATen ops,
// for an all-reduce worker, which applies each step where its parameters
// live -- on a GPU, without a trip through host memory. Same arithmetic,
// same state slots and step count as the shards', so a checkpoint written
// through the local store (ShardStore::ImportChunks) resumes in either mode.
#ifndef PSTRAIN_WORKER_TENSOR_OPTIMIZER_H_
#define PSTRAIN_WORKER_TENSOR_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "proto/parameter.pb.h"

namespace pstrain {

class TensorOptimizer {
 public:
  // `config` normalised (NormalizeOptimizerConfig); `params` updated in
  // place by Step. The state starts as a first update expects it.
  TensorOptimizer(const OptimizerConfig& config, std::vector<at::Tensor> params);

  int slots() const { return slots_; }
  // state(i)[k]: slot k of parameter i, shaped like it, on its device.
  std::vector<at::Tensor>& state(size_t i) { return state_[i]; }
  // Updates applied so far (the shards' optimizer_step). While the device
  // counts them (Adam's device-decided steps), a read of the device.
  int64_t step() const;
  void set_step(int64_t step);

  // One update: params[i] -= f(grads[i]); `lr` > 0 overrides the config's.
  void Step(const std::vector<at::Tensor>& grads, double lr);

  // Whether StepUnlessFound can run: SGD past its first update (which sets
  // the momentum buffers) or Adam/AdamW, parameters of one dtype,
  // contiguous, on one device, and a LibTorch with the fused kernel
  // (kHasFusedSgd, kHasFusedAdam).
  bool CanStepUnlessFound() const;
  // One update as Step, but nothing changes (values, state) where
  // `found_nonfinite` -- a float32 scalar on the parameters' device -- is 1:
  // decided on the device, so the host never waits to learn it. SGD's step
  // counts either way (its arithmetic does not depend on the count past the
  // first update); Adam's bias corrections do, so Adam counts on the device,
  // a skipped step not (step() reads the count; Step takes it back).
  void StepUnlessFound(const std::vector<at::Tensor>& grads, double lr, const at::Tensor& found_nonfinite);

 private:
  // Slot k of every parameter (empty where the optimizer has no slot k).
  std::vector<at::Tensor> Slot(int k) const;

  OptimizerConfig config_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<at::Tensor>> state_;
  int slots_ = 0;
  // The update count, or (while device_steps_ hold it) the updates tried,
  // which bounds it.
  int64_t step_ = 0;
  // Adam's device-decided steps: the count, per parameter a float32 scalar
  // on its device (what the fused kernel reads); empty while step_ is the
  // count.
  std::vector<at::Tensor> device_steps_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TENSOR_OPTIMIZER_H_
