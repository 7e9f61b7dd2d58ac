#include "worker/qat_model.h"

#include <utility>
#include <vector>

#include <ATen/Functions.h>

#include "quantize/qat_network.h"

namespace pstrain {
namespace {

class QatModel : public Model {
 public:
  QatModel(std::unique_ptr<Model> inner, std::unique_ptr<QatNetwork> net, const QuantizationSpec& spec)
      : inner_(std::move(inner)), net_(std::move(net)), spec_(spec) {
    SetStep(0);
  }

  at::Tensor Forward(const at::Tensor& inputs) override {
    if (!quantizing_) return inner_->Forward(inputs);
    if (training_) return net_->Forward(inputs);
    net_->EnableObservers(false);  // evaluation never moves the scales
    at::Tensor out = net_->Forward(inputs);
    net_->EnableObservers(observing_);
    return out;
  }
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() override { return inner_->NamedParameters(); }
  void SetTraining(bool training) override {
    training_ = training;
    inner_->SetTraining(training);
  }
  void To(const c10::Device& device) override {
    inner_->To(device);
    net_->To(device);
  }
  void SetStep(int64_t step) override {
    quantizing_ = step >= spec_.start_step;
    observing_ = spec_.freeze_observers_step == 0 || step < spec_.freeze_observers_step;
    net_->EnableObservers(observing_);
  }
  std::vector<std::pair<std::string, at::Tensor>> NamedBuffers() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (auto& [name, t] : net_->NamedBuffers()) out.emplace_back("qat." + name, t);
    return out;
  }

 private:
  std::unique_ptr<Model> inner_;
  std::unique_ptr<QatNetwork> net_;
  const QuantizationSpec spec_;
  bool training_ = true;
  bool quantizing_ = false;
  bool observing_ = true;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> WrapForQat(std::unique_ptr<Model> model, const std::string& name,
                                                  const QuantizationSpec& spec,
                                                  const BatchRangeReducer& activation_ranges) {
  auto net = QatNetwork::Create(name, model->NamedParameters(), spec.weights == "per_channel");
  if (!net.ok()) return net.status();
  if (activation_ranges) (*net)->SetActivationRangeReducer(activation_ranges);
  return std::unique_ptr<Model>(new QatModel(std::move(model), *std::move(net), spec));
}

BatchRangeReducer AllRanksBatchRange(Collective* group) {
  return [group](at::Tensor& min, at::Tensor& max) {
    // One reduction: max(-min) is -(the minimum), exactly.
    at::Tensor both = at::stack({min.neg().reshape({-1}), max.reshape({-1})}).contiguous();
    const absl::Status s = group->AllReduce(both, ReduceOp::kMax)->Wait();
    TORCH_CHECK(s.ok(), "the QAT observers' batch range across workers: ", s.ToString());
    min = both[0].neg().reshape(min.sizes());
    max = both[1].reshape(max.sizes());
  };
}

}  // namespace pstrain
