#include "worker/model.h"

#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/relu.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>


#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/pipeline_spec.h"

namespace pstrain {
namespace {

// Held while a model is seeded and drawn: the generator is process-wide, so
// seeding and drawing must not interleave with another model being built in
// this process (ranks run as threads in tests).
absl::Mutex& InitMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

// Wraps a torch::nn::Module subclass with a forward(x).
template <typename Net>
class ModuleModel : public Model {
 public:
  explicit ModuleModel(std::shared_ptr<Net> net) : net_(std::move(net)) {}
  at::Tensor Forward(const at::Tensor& inputs) override { return net_->forward(inputs); }
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& item : net_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void SetTraining(bool training) override { net_->train(training); }
  void To(const c10::Device& device) override { net_->to(device); }

 private:
  std::shared_ptr<Net> net_;
};

// in -> hidden1 -> hidden2 -> classes, ReLU. "mlp" is 256/128 (235k
// parameters for 28x28 inputs); "mlp_wide" 2048/2048 (5.8M), a model whose
// step is dominated by moving its gradients (bench/run.sh comm).
struct MlpNet : torch::nn::Module {
  MlpNet(int64_t in, int64_t classes, int64_t hidden1 = 256, int64_t hidden2 = 128)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden1))),
        fc2(register_module("fc2", torch::nn::Linear(hidden1, hidden2))),
        fc3(register_module("fc3", torch::nn::Linear(hidden2, classes))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x.flatten(1);
    h = at::relu(fc1->forward(h));
    h = at::relu(fc2->forward(h));
    return fc3->forward(h);
  }
  torch::nn::Linear fc1, fc2, fc3;
};

// LeNet-5: conv 1->6 5x5 pad 2, max-pool, conv 6->16 5x5, max-pool,
// fc 400->120->84->classes, ReLU activations.
struct LeNet : torch::nn::Module {
  explicit LeNet(int64_t classes)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(400, 120))),
        fc2(register_module("fc2", torch::nn::Linear(120, 84))),
        fc3(register_module("fc3", torch::nn::Linear(84, classes))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::max_pool2d(at::relu(conv1->forward(x)), 2);
    h = at::max_pool2d(at::relu(conv2->forward(h)), 2);
    h = h.flatten(1);
    h = at::relu(fc1->forward(h));
    h = at::relu(fc2->forward(h));
    return fc3->forward(h);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2, fc3;
};

// A built-in model's layer as pipeline stages cut it: a Linear or a Conv2d,
// with what runs around it in the whole model (flatten before the first
// Linear, ReLU after all but the last layer, LeNet's pooling after a conv).
struct LayerShape {
  std::string name;
  bool conv = false;
  int64_t in = 0, out = 0, kernel = 0, padding = 0;
  bool flatten = false, relu = true;
  int64_t param_count() const { return conv ? in * out * kernel * kernel + out : in * out + out; }
};

// The layers of `name` in the whole model's order (PipelineLayers(name) of
// them).
absl::StatusOr<std::vector<LayerShape>> LayerShapes(const std::string& name, const std::vector<int64_t>& input_shape,
                                                    int64_t classes) {
  if (name == "mlp" || name == "mlp_wide") {
    int64_t in = 1;
    for (int64_t d : input_shape) in *= d;
    const int64_t h1 = name == "mlp" ? 256 : 2048, h2 = name == "mlp" ? 128 : 2048;
    return std::vector<LayerShape>{{"fc1", false, in, h1, 0, 0, true, true},
                                   {"fc2", false, h1, h2, 0, 0, false, true},
                                   {"fc3", false, h2, classes, 0, 0, false, false}};
  }
  if (name == "mlp_deep") {
    int64_t in = 1;
    for (int64_t d : input_shape) in *= d;
    std::vector<LayerShape> layers;
    for (int i = 0; i < kMlpDeepLayers; ++i) {
      const bool last = i + 1 == kMlpDeepLayers;
      layers.push_back(
          {absl::StrCat("fc", i + 1), false, i == 0 ? in : 1024, last ? classes : 1024, 0, 0, i == 0, !last});
    }
    return layers;
  }
  if (name == "lenet") {
    if (input_shape != std::vector<int64_t>{1, 28, 28}) {
      return absl::InvalidArgumentError("model lenet needs 1x28x28 image inputs (data.format idx or synthetic)");
    }
    return std::vector<LayerShape>{{"conv1", true, 1, 6, 5, 2, false, true},
                                   {"conv2", true, 6, 16, 5, 0, false, true},
                                   {"fc1", false, 400, 120, 0, 0, true, true},
                                   {"fc2", false, 120, 84, 0, 0, false, true},
                                   {"fc3", false, 84, classes, 0, 0, false, false}};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model '", name.substr(0, 64), "' has no pipeline cut (mlp, mlp_wide and lenet have)"));
}

// A run of layers: each registered under its whole-model name.
struct StageNet : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (const auto& layer : layers) h = layer(h);
    return h;
  }
  std::vector<std::function<at::Tensor(const at::Tensor&)>> layers;
};

}  // namespace

absl::StatusOr<std::vector<double>> ModelLayerCosts(const std::string& name, const std::vector<int64_t>& input_shape,
                                                    int64_t num_classes) {
  auto shapes = LayerShapes(name, input_shape, num_classes);
  if (!shapes.ok()) return shapes.status();
  std::vector<double> costs;
  for (const LayerShape& l : *shapes) costs.push_back(static_cast<double>(l.param_count()));
  return costs;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Layers(int, int) {
  return absl::UnimplementedError("this model is not cut into layers");
}

absl::StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>> ModelParameterShapes(
    const std::string& name, const std::vector<int64_t>& input_shape, int64_t num_classes) {
  auto shapes = LayerShapes(name, input_shape, num_classes);
  if (!shapes.ok()) return shapes.status();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const LayerShape& l : *shapes) {  // torch's order: weight, then bias
    out.push_back({l.name + ".weight", l.conv ? std::vector<int64_t>{l.out, l.in, l.kernel, l.kernel}
                                              : std::vector<int64_t>{l.out, l.in}});
    out.push_back({l.name + ".bias", {l.out}});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> CreateModelStage(const std::string& name,
                                                        const std::vector<int64_t>& input_shape,
                                                        int64_t num_classes, uint64_t seed, int begin, int end) {
  auto shapes = LayerShapes(name, input_shape, num_classes);
  if (!shapes.ok()) return shapes.status();
  if (begin < 0 || begin >= end || end > static_cast<int>(shapes->size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers [", begin, ", ", end, ") are not a stage of model ", name, "'s ", shapes->size()));
  }
  try {
    auto net = std::make_shared<StageNet>();
    absl::MutexLock lock(&InitMutex());
    at::manual_seed(seed);  // as CreateModel: the same draws in the same order
    for (int i = 0; i < end; ++i) {
      const LayerShape& l = (*shapes)[i];
      std::function<at::Tensor(const at::Tensor&)> run;
      if (l.conv) {
        torch::nn::Conv2d conv(torch::nn::Conv2dOptions(l.in, l.out, l.kernel).padding(l.padding));
        if (i < begin) continue;  // drawn, dropped
        net->register_module(l.name, conv);
        run = [conv](const at::Tensor& x) mutable { return at::max_pool2d(at::relu(conv->forward(x)), 2); };
      } else {
        torch::nn::Linear linear(l.in, l.out);
        if (i < begin) continue;
        net->register_module(l.name, linear);
        run = [linear, flatten = l.flatten, relu = l.relu](const at::Tensor& x) mutable {
          at::Tensor h = linear->forward(flatten ? x.flatten(1) : x);
          return relu ? at::relu(h) : h;
        };
      }
      net->layers.push_back(std::move(run));
    }
    return std::unique_ptr<Model>(new ModuleModel<StageNet>(std::move(net)));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building model ", name, "'s stage: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name,
                                                   const std::vector<int64_t>& input_shape,
                                                   int64_t num_classes, uint64_t seed,
                                                   const DataRoot& root) {
  if (name.rfind("torchscript:", 0) == 0) return LoadTorchScriptModel(root, name.substr(12));
  if (name == "mlp_deep") return CreateModelStage(name, input_shape, num_classes, seed, 0, kMlpDeepLayers);
  try {
    // One seed for every worker: identical initial weights everywhere.
    absl::MutexLock lock(&InitMutex());
    at::manual_seed(seed);
    if (name == "mlp" || name == "mlp_wide") {
      int64_t in = 1;
      for (int64_t d : input_shape) in *= d;
      const int64_t h1 = name == "mlp" ? 256 : 2048, h2 = name == "mlp" ? 128 : 2048;
      return std::unique_ptr<Model>(
          new ModuleModel<MlpNet>(std::make_shared<MlpNet>(in, num_classes, h1, h2)));
    }
    if (name == "lenet") {
      if (input_shape != std::vector<int64_t>{1, 28, 28}) {
        return absl::InvalidArgumentError(
            "model lenet needs 1x28x28 image inputs (data.format idx or synthetic)");
      }
      return std::unique_ptr<Model>(new ModuleModel<LeNet>(std::make_shared<LeNet>(num_classes)));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building model ", name, ": ", e.what_without_backtrace()));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", name, "'"));
}

}  // namespace pstrain
