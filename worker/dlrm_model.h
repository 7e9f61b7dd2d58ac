// The built-in `dlrm` model: Naumov et al., "Deep Learning Recommendation
// Model for Personalization and Recommendation Systems" (2019), as
// facebookresearch/dlrm's reference builds it with --arch-interaction-op=dot:
//
//   dense [B, 13] -> bottom MLP (ReLU after every layer) -> x [B, dim]
//   T = [x, e_1, ..., e_F]           (the F pooled embeddings, [B, dim] each)
//   z = <T_i, T_j> for i < j         ((F + 1) F / 2 pairwise dot products)
//   top MLP over [x, z] (ReLU between layers, none after the last) -> logit
//
// The reference ends in a sigmoid; this model returns the logit and the loss
// is binary_cross_entropy_with_logits (DlrmLoss), which is the same loss
// computed stably. The embeddings are not part of the module: they live in
// embedding tables (worker/sparse_embeddings.h), which pool them per field.
//
// A Dlrm is an ordinary torch::nn::Module: parameters() are the dense
// parameters a torch optimizer or the parameter server trains. Not
// thread-safe (as any module).
#ifndef PSTRAIN_WORKER_DLRM_MODEL_H_
#define PSTRAIN_WORKER_DLRM_MODEL_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pstrain {

struct DlrmConfig {
  int64_t dense_features = 13;
  int64_t sparse_fields = 26;
  int64_t dim = 16;  // embedding width; the bottom MLP ends at it
  // Hidden widths: bottom dense_features -> bottom... -> dim; top
  // (dim + pairs) -> top... -> 1. Either may be empty (one linear layer).
  std::vector<int64_t> bottom = {64};
  std::vector<int64_t> top = {64, 32};
  // Seeds the reference's initialisation (weights N(0, 2 / (in + out)),
  // biases N(0, 1 / out)), so a model is a function of its config.
  uint64_t seed = 1;
};

// INVALID_ARGUMENT naming the first size out of range.
absl::Status ValidateDlrmConfig(const DlrmConfig& config);

class Dlrm : public torch::nn::Module {
 public:
  static absl::StatusOr<std::shared_ptr<Dlrm>> Create(const DlrmConfig& config);

  // dense [B, dense_features] float32, pooled: sparse_fields tensors [B, dim]
  // -> logits [B]. INVALID_ARGUMENT for other shapes.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& dense, const std::vector<at::Tensor>& pooled);

  const DlrmConfig& config() const { return config_; }

 private:
  explicit Dlrm(const DlrmConfig& config);
  at::Tensor Interact(const at::Tensor& x, const std::vector<at::Tensor>& pooled) const;

  const DlrmConfig config_;
  std::vector<torch::nn::Linear> bottom_, top_;
  at::Tensor pair_index_;  // the upper triangle (i < j) of Z flattened: i * n + j
};

// The mean binary cross-entropy of logits [B] against labels [B] (0 or 1).
absl::StatusOr<at::Tensor> DlrmLoss(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DLRM_MODEL_H_
