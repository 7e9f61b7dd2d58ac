// The dense half of a click-through-rate model (docs/embeddings.md#models):
// what the CTR loop (worker/ctr_trainer.h) feeds the batch's dense features
// and its pooled embeddings to, and trains.
//
//   dlrm               the built-in DLRM (worker/dlrm_model.h);
//   torchscript:PATH   a module scripted in Python whose forward is
//                        forward(self, dense: Tensor, sparse: List[Tensor]) -> Tensor
//                      dense [B, 13] float32 (log-transformed counts),
//                      sparse[f] [B, dim_f] float32: field f's pooled rows,
//                      in the order of the spec's embeddings.fields; it
//                      returns logits [B] (or [B, 1]), before any sigmoid.
//
// The embedding rows are never part of the module: the shards hold them.
// Not thread-safe (as any module).
#ifndef PSTRAIN_WORKER_CTR_MODEL_H_
#define PSTRAIN_WORKER_CTR_MODEL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data_root.h"

namespace pstrain {

class CtrModel {
 public:
  virtual ~CtrModel() = default;
  // Logits [B]. INVALID_ARGUMENT for inputs the model refuses or an output
  // of another shape (a TorchScript module's error quoted, bounded).
  virtual absl::StatusOr<at::Tensor> Forward(const at::Tensor& dense, const std::vector<at::Tensor>& pooled) = 0;
  // Trainable parameters, in a fixed order, named as the module names them.
  virtual std::vector<std::pair<std::string, at::Tensor>> NamedParameters() = 0;
  virtual void SetTraining(bool training) = 0;
};

struct CtrModelConfig {
  std::string model;              // "dlrm" or "torchscript:<path under root>"
  std::vector<int64_t> field_dims;  // per field, its table's dim
  uint64_t seed = 1;
  DataRoot root;  // where torchscript:<path> is read
};

// INVALID_ARGUMENT for an unknown model, a dlrm whose fields' dims differ
// (its interaction needs one), or a module that does not load.
absl::StatusOr<std::unique_ptr<CtrModel>> CreateCtrModel(const CtrModelConfig& config);

// torchscript_ctr_model.cc (with torch/script.h): the module at `name` under
// `root`, read by the data root's rules and loaded from memory.
absl::StatusOr<std::unique_ptr<CtrModel>> LoadTorchScriptCtrModel(const DataRoot& root, const std::string& name);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CTR_MODEL_H_
