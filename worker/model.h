// The models a worker trains. Built-in: "mlp" (in-256-128-classes) and
// "lenet" (LeNet-5 for 1x28x28 inputs); "torchscript:<path>" loads a module
// written in Python and saved with torch.jit.script(...).save(path). Initial
// weights come from the job's seed (built-in models) or from the saved module,
// so every worker starts from the same values.
#ifndef PSTRAIN_WORKER_MODEL_H_
#define PSTRAIN_WORKER_MODEL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

class Model {
 public:
  virtual ~Model() = default;
  // Logits (N, classes) for a batch of inputs.
  virtual at::Tensor Forward(const at::Tensor& inputs) = 0;
  // Trainable parameters, in a fixed order, with names matching the module.
  virtual std::vector<std::pair<std::string, at::Tensor>> NamedParameters() = 0;
  virtual void SetTraining(bool training) = 0;
  // Moves the parameters and buffers to `device` (before NamedParameters is
  // read: the tensors it returns are then the device's).
  virtual void To(const c10::Device& device) = 0;
};

// `input_shape` is one example's shape, e.g. {1, 28, 28} or {F}.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name,
                                                   const std::vector<int64_t>& input_shape,
                                                   int64_t num_classes, uint64_t seed);

// Implemented in torchscript_model.cc (the only file with torch/script.h).
absl::StatusOr<std::unique_ptr<Model>> LoadTorchScriptModel(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_H_
