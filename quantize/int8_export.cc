#include "quantize/int8_export.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/csrc/jit/serialization/import.h>

#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "quantize/builtin_layers.h"
#include "quantize/fake_quant.h"

namespace pstrain {
namespace {

using Layer = QuantLayer;

absl::StatusOr<std::vector<Layer>> LayersOf(const std::string& model) { return BuiltinLayers(model); }

absl::StatusOr<at::QEngine> SelectEngine(const std::string& name) {
  static const std::map<std::string, at::QEngine> kNames = {
      {"fbgemm", at::kFBGEMM}, {"qnnpack", at::kQNNPACK}, {"onednn", at::kONEDNN}, {"x86", at::kX86}};
  std::vector<std::string> have;
  for (at::QEngine e : at::globalContext().supportedQEngines()) {
    for (const auto& [n, v] : kNames) {
      if (v == e) have.push_back(n);
    }
  }
  auto it = kNames.find(name);
  if (it == kNames.end() || std::find(have.begin(), have.end(), name) == have.end()) {
    return absl::FailedPreconditionError(absl::StrCat("quantized engine ", Quote(name),
                                                      " is not in this LibTorch; it has: ", absl::StrJoin(have, ", ")));
  }
  at::globalContext().setQEngine(it->second);
  return it->second;
}

absl::StatusOr<at::Tensor> Param(const NamedTensors& weights, const std::string& name, int64_t dim) {
  for (const auto& [n, t] : weights) {
    if (n != name) continue;
    if (t.scalar_type() != at::kFloat || t.dim() != dim) {
      return absl::InvalidArgumentError(absl::StrCat("weight ", name, " is ", t.toString(), " with ", t.dim(),
                                                     " dimensions; the model's layer needs float32 with ", dim));
    }
    return t.contiguous();
  }
  return absl::InvalidArgumentError(absl::StrCat("the weights lack ", name, " (not this model's weights?)"));
}

// qint8, symmetric, per output channel or per tensor, with the scales
// PyTorch's weight observers give.
// `learned`: a QAT quantizer's (scale, zero point), used as they are.
at::Tensor QuantizeWeight(const at::Tensor& w, bool per_channel, const std::pair<at::Tensor, at::Tensor>* learned) {
  MovingAverageMinMaxObserver obs(QuantConfig::Weight(per_channel), w.size(0));
  obs.Observe(w);
  auto [scale, zero_point] = learned ? *learned : obs.QParams();
  if (scale.numel() > 1) {
    return at::quantize_per_channel(w, scale.to(at::kDouble), zero_point.to(at::kLong), 0, at::kQInt8);
  }
  return at::quantize_per_tensor(w, scale.item<float>(), zero_point.item<int>(), at::kQInt8);
}

c10::IValue CallOp(const char* name, torch::jit::Stack stack) {
  c10::Dispatcher::singleton().findSchemaOrThrow(name, "").callBoxed(&stack);
  return stack.at(0);
}

// Resolves `torch.*` to aten and `quantized.*` to the quantized:: ops.
struct QuantizedOpsResolver : torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string& name, torch::jit::GraphFunction&,
                                                         const torch::jit::SourceRange&) override {
    if (name == "torch") return std::make_shared<torch::jit::BuiltinModule>("aten");
    if (name == "quantized") return std::make_shared<torch::jit::BuiltinModule>("quantized");
    return nullptr;
  }
  c10::TypePtr resolveType(const std::string&, const torch::jit::SourceRange&) override { return nullptr; }
};

// Activation scales for static mode: the fp32 forward over the calibration
// inputs, observed at the input (index 0) and after each layer (i + 1).
std::vector<std::pair<double, int64_t>> Calibrate(const std::vector<Layer>& layers,
                                                  const std::vector<std::pair<at::Tensor, at::Tensor>>& wb,
                                                  const at::Tensor& x) {
  std::vector<std::pair<double, int64_t>> out;
  auto observe = [&](const at::Tensor& t) {
    MovingAverageMinMaxObserver obs(QuantConfig::Activation());
    obs.Observe(t);  // one observation over all the examples: their min and max
    auto [scale, zero_point] = obs.QParams();
    out.emplace_back(scale.item<float>(), zero_point.item<int>());
  };
  c10::NoGradGuard no_grad;
  at::Tensor h = x.to(at::kFloat);
  observe(h);
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    if (l.flatten_before) h = h.flatten(1);
    h = l.conv ? at::conv2d(h, wb[i].first, wb[i].second, {1, 1}, {l.padding, l.padding})
               : at::linear(h, wb[i].first, wb[i].second);
    if (l.relu) h = at::relu(h);
    observe(h);
    if (l.pool) h = at::max_pool2d(h, {2, 2});
  }
  return out;
}

std::string ClassName(const std::string& model, Int8Mode mode) {
  const char* m = mode == Int8Mode::kFloat ? "Float" : mode == Int8Mode::kDynamic ? "DynamicInt8" : "StaticInt8";
  return absl::StrCat("__torch__.pstrain.", m, model == "lenet" ? "LeNet" : "Mlp");
}

}  // namespace

absl::StatusOr<Int8Mode> ParseInt8Mode(const std::string& text) {
  if (text == "fp32") return Int8Mode::kFloat;
  if (text == "dynamic") return Int8Mode::kDynamic;
  if (text == "static") return Int8Mode::kStatic;
  return absl::InvalidArgumentError(absl::StrCat("quantize mode ", Quote(text), " is none of dynamic, static"));
}

absl::StatusOr<std::string> InferModel(const NamedTensors& weights) {
  static const std::set<std::string> kLeNet = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                               "fc1.bias",     "fc2.weight", "fc2.bias",     "fc3.weight", "fc3.bias"};
  bool conv = false;
  for (const auto& [name, t] : weights) {
    if (name.rfind("qat.", 0) == 0) continue;  // a QAT job's quantizers
    if (!kLeNet.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", Quote(name), " is in no built-in model; the int8 export knows mlp, mlp_wide and lenet"));
    }
    conv = conv || name.rfind("conv", 0) == 0;
  }
  return std::string(conv ? "lenet" : "mlp");
}

absl::StatusOr<bool> UseLearnedQParams(const std::string& model, const NamedTensors& weights, Int8Options* options) {
  auto layers = LayersOf(model);
  if (!layers.ok()) return layers.status();
  auto get = [&](const std::string& name) -> at::Tensor {
    for (const auto& [n, t] : weights) {
      if (n == name) return t;
    }
    return at::Tensor();
  };
  if (!get("qat.input.scale").defined()) return false;
  std::vector<std::pair<double, int64_t>> act;
  std::vector<std::pair<at::Tensor, at::Tensor>> wq;
  std::vector<std::string> prefixes = {"qat.input."};
  for (const Layer& l : *layers) prefixes.push_back("qat." + l.name + ".out.");
  for (const std::string& p : prefixes) {
    const at::Tensor s = get(p + "scale"), z = get(p + "zero_point");
    if (!s.defined() || !z.defined() || s.numel() != 1 || z.numel() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("the QAT quantizer ", p, " is missing or not per tensor"));
    }
    act.emplace_back(s.item<float>(), z.item<int64_t>());
  }
  for (const Layer& l : *layers) {
    const at::Tensor s = get("qat." + l.name + ".weight_fq.scale"), z = get("qat." + l.name + ".weight_fq.zero_point");
    if (!s.defined() || !z.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("the QAT weight quantizer of ", l.name, " is missing"));
    }
    wq.emplace_back(s, z);
  }
  options->activation_qparams = std::move(act);
  options->weight_qparams = std::move(wq);
  return true;
}

absl::StatusOr<Int8Module> BuildInt8Module(const std::string& model, const NamedTensors& weights, Int8Mode mode,
                                           const Int8Options& options) {
  auto layers = LayersOf(model);
  if (!layers.ok()) return layers.status();
  if (auto engine = SelectEngine(options.engine); !engine.ok()) return engine.status();
  std::vector<std::pair<at::Tensor, at::Tensor>> wb;
  for (const Layer& l : *layers) {
    auto w = Param(weights, l.name + ".weight", l.conv ? 4 : 2);
    if (!w.ok()) return w.status();
    auto b = Param(weights, l.name + ".bias", 1);
    if (!b.ok()) return b.status();
    wb.emplace_back(*w, *b);
  }
  const bool learned = !options.activation_qparams.empty();
  if (learned &&
      (options.activation_qparams.size() != layers->size() + 1 || options.weight_qparams.size() != layers->size())) {
    return absl::InvalidArgumentError(absl::StrCat("learned quantization parameters for ",
                                                   options.weight_qparams.size(), " layers; ", model, " has ",
                                                   layers->size()));
  }
  if (mode == Int8Mode::kStatic && !learned && (!options.calibration.defined() || options.calibration.size(0) == 0)) {
    return absl::InvalidArgumentError("static quantization needs calibration inputs (--calibration N > 0)");
  }
  Int8Module out;
  try {
    c10::NoGradGuard no_grad;
    std::vector<std::pair<double, int64_t>> act;
    if (mode == Int8Mode::kStatic)
      act = learned ? options.activation_qparams : Calibrate(*layers, wb, options.calibration);
    torch::jit::Module m{c10::QualifiedName(ClassName(model, mode))};
    std::string src = "def forward(self, x: Tensor) -> Tensor:\n";
    auto line = [&](const std::string& s) { absl::StrAppend(&src, "    ", s, "\n"); };
    auto qparams = [&](size_t i) {
      // A float literal even when the scale is whole (1 would be an int,
      // which torch.quantize_per_tensor refuses).
      std::string scale = absl::StrFormat("%.17g", act[i].first);
      if (scale.find_first_of(".e") == std::string::npos) scale += ".0";
      return absl::StrCat(scale, ", ", act[i].second);
    };
    line(mode == Int8Mode::kStatic ? absl::StrCat("h = torch.quantize_per_tensor(x, ", qparams(0), ", 13)") : "h = x");
    for (size_t i = 0; i < layers->size(); ++i) {
      const Layer& l = (*layers)[i];
      const auto& [w, b] = wb[i];
      if (l.flatten_before) line("h = h.flatten(1)");
      const bool int8 = mode == Int8Mode::kStatic || (mode == Int8Mode::kDynamic && !l.conv);
      if (!int8) {
        m.register_parameter(l.name + "_weight", w.clone(), false);
        m.register_parameter(l.name + "_bias", b.clone(), false);
        line(l.conv ? absl::StrFormat("h = torch.conv2d(h, self.%s_weight, self.%s_bias, [1, 1], [%d, %d])", l.name,
                                      l.name, l.padding, l.padding)
                    : absl::StrFormat("h = torch.linear(h, self.%s_weight, self.%s_bias)", l.name, l.name));
        if (l.relu) line("h = torch.relu(h)");
        if (mode != Int8Mode::kFloat) out.fp32_layers.push_back(l.name);
      } else {
        const at::Tensor qw =
            QuantizeWeight(w, options.per_channel_weights, learned ? &options.weight_qparams[i] : nullptr);
        c10::IValue packed = l.conv ? CallOp("quantized::conv2d_prepack", {qw, b, std::vector<int64_t>{1, 1},
                                                                           std::vector<int64_t>{l.padding, l.padding},
                                                                           std::vector<int64_t>{1, 1}, int64_t{1}})
                                    : CallOp("quantized::linear_prepack", {qw, b});
        m.register_attribute(l.name, packed.type(), packed);
        if (mode == Int8Mode::kDynamic) {
          line(absl::StrFormat("h = quantized.linear_dynamic(h, self.%s, False)", l.name));
          if (l.relu) line("h = torch.relu(h)");
        } else {
          line(absl::StrFormat("h = quantized.%s%s(h, self.%s, %s)", l.conv ? "conv2d" : "linear",
                               l.relu ? "_relu" : "", l.name, qparams(i + 1)));
        }
        out.int8_layers.push_back(l.name);
      }
      if (l.pool) line("h = torch.max_pool2d(h, [2, 2])");
    }
    line(mode == Int8Mode::kStatic ? "return h.dequantize()" : "return h");
    m.define(src, std::make_shared<QuantizedOpsResolver>());
    std::ostringstream bytes;
    m.save(bytes);
    out.bytes = bytes.str();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building the ", model, " int8 module (engine ", options.engine,
                                            "): ", Quote(e.what_without_backtrace(), 400)));
  }
  return out;
}

absl::StatusOr<double> TimeForward(const std::string& bytes, const at::Tensor& input, const std::string& engine,
                                   int repeats) {
  if (auto e = SelectEngine(engine); !e.ok()) return e.status();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  double seconds = 0;
  try {
    std::istringstream in(bytes);
    torch::jit::Module m = torch::jit::load(in);
    m.eval();
    c10::NoGradGuard no_grad;
    for (int i = 0; i < 5; ++i) m.forward({input});
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) m.forward({input});
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
  } catch (const c10::Error& e) {
    at::set_num_threads(threads);
    return absl::InternalError(absl::StrCat("running the module: ", Quote(e.what_without_backtrace(), 400)));
  }
  at::set_num_threads(threads);
  return seconds;
}

}  // namespace pstrain
