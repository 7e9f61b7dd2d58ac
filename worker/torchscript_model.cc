// TorchScript models: a module scripted and saved in Python, trained here.
#include <torch/script.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "worker/model.h"

namespace pstrain {
namespace {

class TorchScriptModel : public Model {
 public:
  explicit TorchScriptModel(torch::jit::Module module) : module_(std::move(module)) {}
  at::Tensor Forward(const at::Tensor& inputs) override {
    return module_.forward({inputs}).toTensor();
  }
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (p.value.requires_grad()) out.emplace_back(p.name, p.value);
    }
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const c10::Device& device) override { module_.to(device); }

 private:
  torch::jit::Module module_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadTorchScriptModel(const DataRoot& root, const std::string& name) {
  // Read by the data root's rules, then loaded from memory: torch::jit::load
  // never sees a name, so it cannot open anything but these bytes.
  absl::StatusOr<std::string> bytes = ReadDataFile(root, name, /*maybe_gzip=*/false);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat("model torchscript:", Quote(name, 200), ": ",
                                                            bytes.status().message()));
  }
  const std::string path = Quote(name, 200);  // for messages
  try {
    std::istringstream in(std::move(*bytes));
    torch::jit::Module module = torch::jit::load(in);
    module.train(true);
    auto model = std::make_unique<TorchScriptModel>(std::move(module));
    if (model->NamedParameters().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the module has no trainable parameters"));
    }
    return std::unique_ptr<Model>(std::move(model));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a loadable TorchScript module: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot load: ", e.what()));
  }
}

}  // namespace pstrain
