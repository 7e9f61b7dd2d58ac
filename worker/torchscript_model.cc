// TorchScript models: a module scripted and saved in Python, trained here.
#include <torch/script.h>

#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
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

// Named stages: a module whose methods stage_0, stage_1, ... chained give
// its forward may be cut between them, whatever each does (a skip
// connection within a stage, a reshape between children). Stages [begin,
// end) of such a module, and the parameters those methods use.
class TorchScriptStages : public Model {
 public:
  TorchScriptStages(torch::jit::Module module, int begin, int end,
                    std::vector<std::pair<std::string, at::Tensor>> parameters)
      : module_(std::move(module)), begin_(begin), end_(end), parameters_(std::move(parameters)) {}
  at::Tensor Forward(const at::Tensor& inputs) override {
    at::Tensor h = inputs;
    for (int i = begin_; i < end_; ++i) h = module_.get_method(absl::StrCat("stage_", i))({h}).toTensor();
    return h;
  }
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override { return parameters_; }
  void SetTraining(bool training) override { module_.train(training); }
  // The module in place: this stage's parameters, the frozen ones and the
  // buffers (after ReleaseUnused; before it, every stage's).
  void To(const c10::Device& device) override { module_.to(device); }
  // The other stages' trainable parameters, which this stage's methods do
  // not read (StageParameterNames checked it), become empty tensors in
  // their submodules: their storage goes once nothing else holds it.
  void ReleaseUnused() override {
    std::set<std::string> mine;
    for (const auto& [name, t] : parameters_) mine.insert(name);
    std::vector<std::string> others;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (p.value.requires_grad() && mine.count(p.name) == 0) others.push_back(p.name);
    }
    for (const std::string& name : others) {
      torch::jit::Module owner = module_;
      size_t from = 0;
      for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', from = dot + 1)) {
        owner = owner.attr(name.substr(from, dot - from)).toModule();
      }
      const at::Tensor old = owner.attr(name.substr(from)).toTensor();
      owner.register_parameter(name.substr(from), at::empty({0}, old.options()), /*is_buffer=*/false);
    }
  }

 private:
  torch::jit::Module module_;  // shares its parameters with the whole model's
  const int begin_, end_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
};

// The attribute paths (`fc1`, `enc.a`, `enc.a.bias`) method `method` of
// `module` reads: each chain of attribute reads from `self` is followed to
// the path it reaches, and a path used by anything but a further read
// counts whole (a submodule: all of its parameters); the methods of `self`
// it calls are read as well.
void MethodPaths(const torch::jit::Module& module, const std::string& method, std::set<std::string>* seen,
                 std::set<std::string>* paths) {
  if (!seen->insert(method).second) return;
  std::shared_ptr<torch::jit::Graph> graph = module.get_method(method).graph();
  std::map<const torch::jit::Value*, std::string> path = {{graph->inputs()[0], ""}};  // "": self
  auto use = [&](const torch::jit::Value* v) {
    auto it = path.find(v);
    if (it != path.end() && !it->second.empty()) paths->insert(it->second);
  };
  std::vector<const torch::jit::Block*> blocks = {graph->block()};  // and those of ifs and loops
  while (!blocks.empty()) {
    const torch::jit::Block* block = blocks.back();
    blocks.pop_back();
    for (const torch::jit::Node* node : block->nodes()) {
      for (const torch::jit::Block* b : node->blocks()) blocks.push_back(b);
      const auto from = node->inputs().empty() ? path.end() : path.find(node->inputs()[0]);
      if (node->kind() == c10::prim::GetAttr && from != path.end()) {
        const std::string name = node->s(c10::attr::name);
        path[node->output()] = from->second.empty() ? name : from->second + "." + name;
        continue;
      }
      if (node->kind() == c10::prim::CallMethod && from != path.end() && from->second.empty()) {
        MethodPaths(module, node->s(c10::attr::name), seen, paths);  // a method of self
        for (size_t i = 1; i < node->inputs().size(); ++i) use(node->inputs()[i]);
        continue;
      }
      for (const torch::jit::Value* v : node->inputs()) use(v);
    }
    for (const torch::jit::Value* v : block->return_node()->inputs()) use(v);
  }
}

// The stage_<i> methods' parameters (none: the module names no stages);
// INVALID_ARGUMENT when a parameter is in two stages or in none.
absl::StatusOr<std::vector<std::set<std::string>>> StageParameterNames(const torch::jit::Module& module) {
  if (!module.find_method("stage_0")) return std::vector<std::set<std::string>>();  // most modules
  std::set<std::string> trainable;  // frozen ones may be shared: nobody updates them
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.value.requires_grad()) trainable.insert(p.name);
  }
  std::vector<std::set<std::string>> stages;
  while (module.find_method(absl::StrCat("stage_", stages.size()))) {
    std::set<std::string> seen, paths, names;
    MethodPaths(module, absl::StrCat("stage_", stages.size()), &seen, &paths);
    for (const std::string& name : trainable) {
      for (const std::string& p : paths) {
        if (name == p || absl::StartsWith(name, p + ".")) names.insert(name);
      }
    }
    stages.push_back(std::move(names));
  }
  // Each trainable parameter in exactly one stage: a stage trains what it
  // holds, and the stages' parameters together are the model's.
  std::map<std::string, size_t> owner;
  for (size_t i = 0; i < stages.size(); ++i) {
    for (const std::string& name : stages[i]) {
      auto [it, first] = owner.emplace(name, i);
      if (!first) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", Quote(name, 100), "' is used by stage_", it->second,
                                                       " and stage_", i, "; a stage's parameters must be its own"));
      }
    }
  }
  for (const std::string& name : trainable) {
    if (owner.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", Quote(name, 100), "' is used by no stage_<i> method ",
                                                     "(0 to ", stages.size() - 1, "); every parameter must be in one"));
    }
  }
  return stages;
}

class TorchScriptModel : public Model {
 public:
  explicit TorchScriptModel(torch::jit::Module module) : module_(std::move(module)) {
    for (const auto& c : module_.named_children()) children_.push_back(c);
    // Only a pipeline cuts the module: a job that does not is not refused
    // for stage methods it never uses (Layers says what is wrong).
    auto stages = StageParameterNames(module_);
    if (stages.ok()) {
      stages_ = std::move(*stages);
    } else {
      stages_error_ = absl::InvalidArgumentError(absl::StrCat("its stages cannot be cut apart: ",
                                                              stages.status().message()));
    }
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
  // Its stage_<i> methods, if it names stages; else its top-level children.
  int LayerCount() override {
    return static_cast<int>(stages_.empty() ? children_.size() : stages_.size());
  }
  absl::StatusOr<std::unique_ptr<Model>> Layers(int begin, int end) override {
    if (!stages_error_.ok()) return stages_error_;
    if (begin < 0 || begin >= end || end > LayerCount()) {
      return absl::InvalidArgumentError(absl::StrCat(stages_.empty() ? "children [" : "stage methods [", begin, ", ",
                                                     end, ") are not a stage of a module with ", LayerCount()));
    }
    if (stages_.empty()) {
      return std::unique_ptr<Model>(new TorchScriptLayers({children_.begin() + begin, children_.begin() + end}));
    }
    std::vector<std::pair<std::string, at::Tensor>> parameters;
    for (const auto& [name, t] : NamedParameters()) {
      for (int i = begin; i < end; ++i) {
        if (stages_[i].count(name) > 0) parameters.emplace_back(name, t);
      }
    }
    return std::unique_ptr<Model>(new TorchScriptStages(module_, begin, end, std::move(parameters)));
  }

 private:
  torch::jit::Module module_;
  std::vector<torch::jit::NameModule> children_;  // the top level's, in order
  std::vector<std::set<std::string>> stages_;     // each stage_<i> method's parameters
  absl::Status stages_error_;
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
