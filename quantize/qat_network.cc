#include "quantize/qat_network.h"

#include <ATen/Functions.h>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<QatNetwork>> QatNetwork::Create(
    const std::string& model, const std::vector<std::pair<std::string, at::Tensor>>& params, bool per_channel_weights) {
  auto specs = BuiltinLayers(model);
  if (!specs.ok()) return specs.status();
  auto find = [&](const std::string& name, int64_t dim) -> absl::StatusOr<at::Tensor> {
    for (const auto& [n, t] : params) {
      if (n == name && t.dim() == dim && t.scalar_type() == at::kFloat) return t;
      if (n == name) {
        return absl::InvalidArgumentError(absl::StrCat(name, " is not a float32 tensor of ", dim, " dimensions"));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("the model has no parameter ", name));
  };
  std::unique_ptr<QatNetwork> net(new QatNetwork);
  net->input_ = std::make_unique<FakeQuantize>(QuantConfig::Activation());
  for (const QuantLayer& spec : *specs) {
    Layer l;
    l.spec = spec;
    auto w = find(spec.name + ".weight", spec.conv ? 4 : 2);
    if (!w.ok()) return w.status();
    auto b = find(spec.name + ".bias", 1);
    if (!b.ok()) return b.status();
    l.weight = *w;
    l.bias = *b;
    l.weight_fq = std::make_unique<FakeQuantize>(QuantConfig::Weight(per_channel_weights), l.weight.size(0));
    l.out = std::make_unique<FakeQuantize>(QuantConfig::Activation());
    // A flatten between layers gets a quantizer of its own (before the
    // first layer, the input's follows the flatten).
    if (spec.flatten_before && !net->layers_.empty()) {
      l.flatten = std::make_unique<FakeQuantize>(QuantConfig::Activation());
    }
    net->layers_.push_back(std::move(l));
  }
  return net;
}

at::Tensor QatNetwork::Forward(const at::Tensor& x) {
  at::Tensor h = x;
  if (layers_.front().spec.flatten_before) h = h.flatten(1);
  h = input_->Forward(h);
  for (Layer& l : layers_) {
    if (l.flatten) h = l.flatten->Forward(h.flatten(1));
    const at::Tensor w = l.weight_fq->Forward(l.weight);
    h = l.spec.conv ? at::conv2d(h, w, l.bias, {1, 1}, {l.spec.padding, l.spec.padding}) : at::linear(h, w, l.bias);
    if (l.spec.relu) h = at::relu(h);
    h = l.out->Forward(h);
    // The pooled values are observed again by the layer's quantizer, as
    // PyTorch shares one observer between a max-pool's input and output.
    if (l.spec.pool) h = l.out->Forward(at::max_pool2d(h, {2, 2}));
  }
  return h;
}

void QatNetwork::EnableFakeQuant(bool on) {
  input_->EnableFakeQuant(on);
  for (Layer& l : layers_) {
    for (FakeQuantize* fq : {l.weight_fq.get(), l.out.get(), l.flatten.get()}) {
      if (fq) fq->EnableFakeQuant(on);
    }
  }
}

void QatNetwork::To(const c10::Device& device) {
  input_->To(device);
  for (Layer& l : layers_) {
    for (FakeQuantize* fq : {l.weight_fq.get(), l.out.get(), l.flatten.get()}) {
      if (fq) fq->To(device);
    }
  }
}

void QatNetwork::SetActivationRangeReducer(const BatchRangeReducer& reducer) {
  input_->SetBatchRangeReducer(reducer);
  for (Layer& l : layers_) {
    for (FakeQuantize* fq : {l.out.get(), l.flatten.get()}) {
      if (fq) fq->SetBatchRangeReducer(reducer);
    }
  }
}

void QatNetwork::EnableObservers(bool on) {
  input_->EnableObserver(on);
  for (Layer& l : layers_) {
    for (FakeQuantize* fq : {l.weight_fq.get(), l.out.get(), l.flatten.get()}) {
      if (fq) fq->EnableObserver(on);
    }
  }
}

std::vector<std::pair<double, int64_t>> QatNetwork::ActivationQParams() const {
  auto of = [](const FakeQuantize& fq) {
    return std::make_pair(static_cast<double>(fq.scale().item<float>()), int64_t{fq.zero_point().item<int>()});
  };
  std::vector<std::pair<double, int64_t>> out = {of(*input_)};
  for (const Layer& l : layers_) out.push_back(of(*l.out));
  return out;
}

std::vector<std::pair<at::Tensor, at::Tensor>> QatNetwork::WeightQParams() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (const Layer& l : layers_) out.emplace_back(l.weight_fq->scale().clone(), l.weight_fq->zero_point().clone());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> QatNetwork::NamedBuffers() {
  std::vector<std::pair<std::string, at::Tensor>> out = input_->NamedBuffers("input.");
  auto add = [&](FakeQuantize* fq, const std::string& prefix) {
    if (!fq) return;
    for (auto& b : fq->NamedBuffers(prefix)) out.push_back(std::move(b));
  };
  for (Layer& l : layers_) {
    add(l.flatten.get(), l.spec.name + ".flatten.");
    add(l.weight_fq.get(), l.spec.name + ".weight_fq.");
    add(l.out.get(), l.spec.name + ".out.");
  }
  return out;
}

}  // namespace pstrain
