// The models a worker trains. Built-in: "mlp" (in-256-128-classes),
// "mlp_wide" (in-2048-2048-classes), "mlp_deep" (in, 7 x 1024, classes:
// 8 layers) and "lenet" (LeNet-5 for 1x28x28 inputs); "torchscript:<path>" loads a module
// written in Python and saved with torch.jit.script(...).save(path). Initial
// weights come from the job's seed (built-in models) or from the saved module,
// so every worker starts from the same values.
//
// TorchScript models are code. <path> is relative to the worker's
// --data_root and read by its rules (worker/data_root.h: no name leading
// out, a regular file, at most --max_data_file_bytes), so a job spec can
// only pick a model that whoever fills the data root put there; it cannot
// bring its own. What a model may do once loaded is not confined: its
// methods run in the worker's process with the worker's rights, and
// TorchScript has operators that read files (aten::from_file, which maps or
// reads any path into a tensor; torch.load-like ops in custom builds). A
// model can therefore read anything the worker can -- its cluster token
// (--token_file), its TLS key, the job secrets in its memory -- and put it
// into the weights it trains, which the job's owner can export. Only put
// models you would trust with the worker's credentials under --data_root,
// and keep the data root writable only by such people (docs/security.md,
// "Confined files").
#ifndef PSTRAIN_WORKER_MODEL_H_
#define PSTRAIN_WORKER_MODEL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data_root.h"

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
  // The training step about to run (quantization-aware training switches
  // fake quantization and observers by step; other models ignore it).
  virtual void SetStep(int64_t /*step*/) {}
  // State that is not trained but belongs to the model (QAT's quantizers),
  // saved beside the parameters in the final weights.
  virtual std::vector<std::pair<std::string, at::Tensor>> NamedBuffers() { return {}; }
  // Pipeline stages of a TorchScript model: its top-level children in order
  // (0 for a model that is not cut this way), and children [begin, end) as
  // a model of their own whose Forward runs them one after the other,
  // sharing this model's tensors, with the parameter names the whole model
  // gives them. Cutting is right only for a module whose forward does just
  // that (an nn.Sequential): CreatePipelineStageModel checks it on a batch.
  virtual int LayerCount() { return 0; }
  virtual absl::StatusOr<std::unique_ptr<Model>> Layers(int begin, int end);
  // A stage, once the model it was cut from is no longer needed: lets go of
  // what it holds but does not use, so that a rank holds its stage alone.
  // (A stage of a module that names its stages shares the module object:
  // the other stages' trainable parameters are replaced there by empty
  // tensors, which the model cut from it then sees too.)
  virtual void ReleaseUnused() {}
};

// `input_shape` is one example's shape, e.g. {1, 28, 28} or {F}.
// "torchscript:<path>" reads <path> under `root` (the default root refuses
// every file).
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name,
                                                   const std::vector<int64_t>& input_shape,
                                                   int64_t num_classes, uint64_t seed,
                                                   const DataRoot& root = DataRoot{});

// Pipeline stages (common/pipeline_spec.h): layers [begin, end) of the
// built-in model `name` (PipelineLayers(name) layers, in order), with the
// initial values and parameter names the whole model has under `seed` (the
// layers outside the stage are drawn and dropped, one at a time, so the
// generator runs as it does for the whole model). Its Forward takes the
// previous stage's outputs (the model's inputs at stage 0) and gives the
// next stage's inputs (the logits at the last).
absl::StatusOr<std::unique_ptr<Model>> CreateModelStage(const std::string& name,
                                                        const std::vector<int64_t>& input_shape,
                                                        int64_t num_classes, uint64_t seed, int begin, int end);

// The parameter count of each of those layers (what the stages' cut
// balances).
absl::StatusOr<std::vector<double>> ModelLayerCosts(const std::string& name, const std::vector<int64_t>& input_shape,
                                                    int64_t num_classes);

// The parameters' names and shapes of the whole built-in model `name`, in
// its order, without building it: what a pipelined job's stages hold
// between them (its checkpoint's plan).
absl::StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>> ModelParameterShapes(
    const std::string& name, const std::vector<int64_t>& input_shape, int64_t num_classes);

// Implemented in torchscript_model.cc (the only file with torch/script.h).
// The module is read into memory by ReadDataFile and loaded from there.
absl::StatusOr<std::unique_ptr<Model>> LoadTorchScriptModel(const DataRoot& root, const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_H_
