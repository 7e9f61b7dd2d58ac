#include "worker/dlrm_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

constexpr int64_t kMaxWidth = 1 << 16;
constexpr int64_t kMaxFields = 1024;

absl::Status CheckWidths(const std::vector<int64_t>& widths, const char* what) {
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1 || widths[i] > kMaxWidth) {
      return absl::InvalidArgumentError(
          absl::StrCat("dlrm ", what, " layer ", i, " has width ", widths[i], "; need 1..", kMaxWidth));
    }
  }
  return absl::OkStatus();
}

// Linear layers in -> widths... -> out, registered as <name>0, <name>1, ...
std::vector<torch::nn::Linear> MakeMlp(torch::nn::Module* module, const std::string& name, int64_t in,
                                       const std::vector<int64_t>& widths, int64_t out, at::Generator& gen) {
  std::vector<int64_t> sizes = {in};
  sizes.insert(sizes.end(), widths.begin(), widths.end());
  sizes.push_back(out);
  std::vector<torch::nn::Linear> layers;
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    torch::nn::Linear layer(torch::nn::LinearOptions(sizes[i], sizes[i + 1]));
    // The reference's init (dlrm_s_pytorch.py create_mlp): Glorot-like
    // normal weights and small normal biases, drawn from our own generator
    // so the model does not depend on torch's global seed.
    layer->weight.normal_(0.0, std::sqrt(2.0 / static_cast<double>(sizes[i] + sizes[i + 1])), gen);
    layer->bias.normal_(0.0, std::sqrt(1.0 / static_cast<double>(sizes[i + 1])), gen);
    layers.push_back(module->register_module(name + std::to_string(i), layer));
  }
  return layers;
}

}  // namespace

absl::Status ValidateDlrmConfig(const DlrmConfig& config) {
  if (config.dense_features < 1 || config.dense_features > kMaxWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("dlrm dense_features ", config.dense_features, "; need 1..", kMaxWidth));
  }
  if (config.sparse_fields < 0 || config.sparse_fields > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("dlrm sparse_fields ", config.sparse_fields, "; need 0..", kMaxFields));
  }
  if (config.dim < 1 || config.dim > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("dlrm dim ", config.dim, "; need 1..4096"));
  }
  absl::Status s = CheckWidths(config.bottom, "bottom");
  if (!s.ok()) return s;
  return CheckWidths(config.top, "top");
}

absl::StatusOr<std::shared_ptr<Dlrm>> Dlrm::Create(const DlrmConfig& config) {
  absl::Status s = ValidateDlrmConfig(config);
  if (!s.ok()) return s;
  try {
    return std::shared_ptr<Dlrm>(new Dlrm(config));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building dlrm: ", e.what_without_backtrace()));
  }
}

Dlrm::Dlrm(const DlrmConfig& config) : config_(config) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  const int64_t n = config.sparse_fields + 1;
  const int64_t pairs = n * (n - 1) / 2;
  bottom_ = MakeMlp(this, "bottom", config.dense_features, config.bottom, config.dim, gen);
  top_ = MakeMlp(this, "top", config.dim + pairs, config.top, 1, gen);
  // Z's entries (i, j), i < j, as indices into Z flattened to [B, n * n]:
  // one index_select per batch instead of a gather over two index tensors.
  pair_index_ = at::empty({pairs}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = pair_index_.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j) *p++ = i * n + j;
  }
}

at::Tensor Dlrm::Interact(const at::Tensor& x, const std::vector<at::Tensor>& pooled) const {
  std::vector<at::Tensor> vectors = {x};
  vectors.insert(vectors.end(), pooled.begin(), pooled.end());
  const at::Tensor t = at::stack(vectors, 1);          // [B, n, dim]
  const at::Tensor z = at::bmm(t, t.transpose(1, 2));  // [B, n, n]
  const at::Tensor flat = z.reshape({z.size(0), -1});  // [B, n * n]
  return at::cat({x, at::index_select(flat, 1, pair_index_)}, 1);
}

absl::StatusOr<at::Tensor> Dlrm::Forward(const at::Tensor& dense, const std::vector<at::Tensor>& pooled) {
  if (dense.dim() != 2 || dense.size(1) != config_.dense_features) {
    return absl::InvalidArgumentError(absl::StrCat("dlrm dense input must be [B, ", config_.dense_features, "]"));
  }
  if (static_cast<int64_t>(pooled.size()) != config_.sparse_fields) {
    return absl::InvalidArgumentError(
        absl::StrCat("dlrm takes ", config_.sparse_fields, " pooled embeddings, not ", pooled.size()));
  }
  for (size_t f = 0; f < pooled.size(); ++f) {
    if (pooled[f].dim() != 2 || pooled[f].size(0) != dense.size(0) || pooled[f].size(1) != config_.dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("dlrm pooled embedding ", f, " must be [", dense.size(0), ", ", config_.dim, "]"));
    }
  }
  try {
    at::Tensor x = dense;
    for (auto& layer : bottom_) x = at::relu(layer->forward(x));
    at::Tensor y = Interact(x, pooled);
    for (size_t i = 0; i < top_.size(); ++i) {
      y = top_[i]->forward(y);
      if (i + 1 < top_.size()) y = at::relu(y);
    }
    return y.reshape({-1});
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("dlrm forward: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> DlrmLoss(const at::Tensor& logits, const at::Tensor& labels) {
  if (logits.dim() != 1 || labels.dim() != 1 || logits.size(0) != labels.size(0)) {
    return absl::InvalidArgumentError("dlrm loss needs logits and labels of shape [B] each");
  }
  try {
    return at::binary_cross_entropy_with_logits(logits, labels);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("dlrm loss: ", e.what_without_backtrace()));
  }
}

}  // namespace pstrain
