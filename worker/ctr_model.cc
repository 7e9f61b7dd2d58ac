#include "worker/ctr_model.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "worker/dlrm_model.h"

namespace pstrain {
namespace {

class DlrmCtrModel : public CtrModel {
 public:
  explicit DlrmCtrModel(std::shared_ptr<Dlrm> model) : model_(std::move(model)) {}
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& dense, const std::vector<at::Tensor>& pooled) override {
    return model_->Forward(dense, pooled);
  }
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : model_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  void SetTraining(bool training) override { model_->train(training); }

 private:
  std::shared_ptr<Dlrm> model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CtrModel>> CreateCtrModel(const CtrModelConfig& config) {
  const std::string script = "torchscript:";
  if (config.model.rfind(script, 0) == 0) {
    auto model = LoadTorchScriptCtrModel(config.root, config.model.substr(script.size()));
    if (!model.ok()) return model.status();
    // A module without the calling convention fails here, before the job
    // creates its tables: one forward of two zero examples.
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> pooled;
    for (int64_t dim : config.field_dims) pooled.push_back(at::zeros({2, dim}));
    auto probe = (*model)->Forward(at::zeros({2, 13}), pooled);
    if (!probe.ok()) return probe.status();
    return model;
  }
  if (config.model != "dlrm") {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", Quote(config.model, 200), " is no click model: use dlrm or torchscript:<path>"));
  }
  if (config.field_dims.empty()) return absl::InvalidArgumentError("model dlrm needs at least one sparse field");
  for (int64_t dim : config.field_dims) {
    if (dim != config.field_dims[0]) {
      return absl::InvalidArgumentError(absl::StrCat("model dlrm: every embedding table must have one dim (fields of ",
                                                     config.field_dims[0], " and ", dim, " floats)"));
    }
  }
  DlrmConfig dc;
  dc.dim = config.field_dims[0];
  dc.sparse_fields = static_cast<int64_t>(config.field_dims.size());
  dc.seed = config.seed;
  auto model = Dlrm::Create(dc);
  if (!model.ok()) return model.status();
  (*model)->train();
  return std::unique_ptr<CtrModel>(new DlrmCtrModel(std::move(*model)));
}

}  // namespace pstrain
