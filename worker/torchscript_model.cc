// TorchScript models: a module scripted and saved in Python, trained here.
#include <torch/script.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "worker/model.h"

namespace pstrain {
namespace {

// Children [begin, end) of a module, run one after the other (a pipeline
// stage); parameters named as the whole module names them.
class TorchScriptLayers : public Model {
 public:
  explicit TorchScriptLayers(std::vector<torch::jit::NameModule> children) : children_(std::move(children)) {}
  at::Tensor Forward(const at::Tensor& inputs) override {
    at::Tensor h = inputs;
    for (auto& c : children_) h = c.value.forward({h}).toTensor();
    return h;
  }
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& c : children_) {
      for (const auto& p : c.value.named_parameters(/*recurse=*/true)) {
        if (p.value.requires_grad()) out.emplace_back(c.name + "." + p.name, p.value);
      }
    }
    return out;
  }
  void SetTraining(bool training) override {
    for (auto& c : children_) c.value.train(training);
  }
  void To(const c10::Device& device) override {
    for (auto& c : children_) c.value.to(device);
  }

 private:
  std::vector<torch::jit::NameModule> children_;
};

class TorchScriptModel : public Model {
 public:
  explicit TorchScriptModel(torch::jit::Module module) : module_(std::move(module)) {
    for (const auto& c : module_.named_children()) children_.push_back(c);
  }
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
  int LayerCount() override { return static_cast<int>(children_.size()); }
  absl::StatusOr<std::unique_ptr<Model>> Layers(int begin, int end) override {
    if (begin < 0 || begin >= end || end > LayerCount()) {
      return absl::InvalidArgumentError(
          absl::StrCat("children [", begin, ", ", end, ") are not a stage of a module with ", LayerCount()));
    }
    return std::unique_ptr<Model>(new TorchScriptLayers({children_.begin() + begin, children_.begin() + end}));
  }

 private:
  torch::jit::Module module_;
  std::vector<torch::jit::NameModule> children_;  // the top level's, in order
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
