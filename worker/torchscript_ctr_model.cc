// TorchScript click models (worker/ctr_model.h has the calling convention).
// With torchscript_model.cc, the only files that include torch/script.h.
#include <ATen/core/List.h>
#include <torch/script.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/quote.h"
#include "worker/ctr_model.h"

namespace pstrain {
namespace {

class TorchScriptCtrModel : public CtrModel {
 public:
  TorchScriptCtrModel(torch::jit::Module module, std::string name)
      : module_(std::move(module)), name_(std::move(name)) {}

  absl::StatusOr<at::Tensor> Forward(const at::Tensor& dense, const std::vector<at::Tensor>& pooled) override {
    c10::IValue out;
    try {
      c10::List<at::Tensor> sparse;
      sparse.reserve(pooled.size());
      for (const at::Tensor& t : pooled) sparse.push_back(t);
      out = module_.forward({dense, std::move(sparse)});
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("model torchscript:", name_, ": forward(dense, sparse) failed: ",
                                                     Quote(e.what_without_backtrace(), 1024)));
    }
    if (!out.isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat("model torchscript:", name_, ": forward returned a ",
                                                     out.tagKind(), ", not a tensor of logits"));
    }
    at::Tensor logits = out.toTensor();
    if (logits.dim() == 2 && logits.size(1) == 1) logits = logits.squeeze(1);
    if (logits.dim() != 1 || logits.size(0) != dense.size(0) || logits.scalar_type() != at::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model torchscript:", name_, ": forward returned ", c10::toString(logits.scalar_type()), " [",
          absl::StrJoin(logits.sizes().begin(), logits.sizes().end(), ", "), "], not float logits [", dense.size(0),
          "] or [", dense.size(0), ", 1]"));
    }
    return logits;
  }

  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (p.value.requires_grad()) out.emplace_back(p.name, p.value);
    }
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }

 private:
  torch::jit::Module module_;
  const std::string name_;  // quoted, for messages
};

}  // namespace

absl::StatusOr<std::unique_ptr<CtrModel>> LoadTorchScriptCtrModel(const DataRoot& root, const std::string& name) {
  const std::string quoted = Quote(name, 200);
  absl::StatusOr<std::string> bytes = ReadDataFile(root, name, /*maybe_gzip=*/false);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("model torchscript:", quoted, ": ", bytes.status().message()));
  }
  try {
    std::istringstream in(std::move(*bytes));
    torch::jit::Module module = torch::jit::load(in);
    module.train(true);
    if (module.find_method("forward") == c10::nullopt) {
      return absl::InvalidArgumentError(absl::StrCat("model torchscript:", quoted, ": the module has no forward"));
    }
    auto model = std::make_unique<TorchScriptCtrModel>(std::move(module), quoted);
    if (model->NamedParameters().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model torchscript:", quoted, ": the module has no trainable parameters"));
    }
    return std::unique_ptr<CtrModel>(std::move(model));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("model torchscript:", quoted,
                                                   ": not a loadable TorchScript module: ",
                                                   Quote(e.what_without_backtrace(), 1024)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model torchscript:", quoted, ": cannot load: ", e.what()));
  }
}

}  // namespace pstrain
