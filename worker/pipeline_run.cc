#include "worker/pipeline_run.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/stage_cut.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

// Tags above the training step's (2m and 2m + 1 for micro-batch m < 4096).
constexpr int64_t kEvalActivationTag = int64_t{1} << 20;
constexpr int64_t kEvalResultTag = kEvalActivationTag + 1;
constexpr int64_t kGatherTag = kEvalActivationTag + 2;
constexpr int64_t kEvalBatch = 1000;

std::vector<int> StageRanks(const PipelinePlace& place) {
  std::vector<int> ranks;
  for (int s = 0; s < place.stages; ++s) ranks.push_back(place.RankOf(s));
  return ranks;
}

PipelineSchedule ScheduleOf(const PipelineSpec& p) {
  return p.schedule == "gpipe" ? PipelineSchedule::kGPipe : PipelineSchedule::k1F1B;
}

}  // namespace

// Counts the time a Recv blocks (what the stage waited for its
// neighbours), and tells the heartbeat (COLLECTIVE while waiting).
class PipelineRun::TimedLink : public StageLink {
 public:
  TimedLink(StageLink* inner, double* waited, Activity* activity, const int64_t* step)
      : inner_(inner), waited_(waited), activity_(activity), step_(step) {}
  absl::Status Send(int to_stage, int64_t tag, const at::Tensor& tensor) override {
    return inner_->Send(to_stage, tag, tensor);
  }
  absl::StatusOr<at::Tensor> Recv(int from_stage, int64_t tag) override {
    const auto start = std::chrono::steady_clock::now();
    activity_->Enter(WorkerActivity::COLLECTIVE, *step_);
    auto got = inner_->Recv(from_stage, tag);
    activity_->Enter(WorkerActivity::COMPUTE, *step_);
    *waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return got;
  }
  absl::Status Flush() override { return inner_->Flush(); }

 private:
  StageLink* inner_;
  double* waited_;
  Activity* activity_;
  const int64_t* step_;
};

PipelinePlace PipelinePlaceOf(const PipelineSpec& pipeline, int rank, int world_size) {
  PipelinePlace p;
  p.stages = std::max(1, pipeline.stages);
  p.stage = rank % p.stages;
  p.replica = rank / p.stages;
  p.replicas = std::max(1, world_size / p.stages);
  return p;
}

namespace {

// What a pipeline cuts: a model's layers, built a run at a time.
struct LayerSource {
  int count = 0;
  std::function<absl::StatusOr<std::unique_ptr<Model>>(int begin, int end)> make;
  std::vector<double> parameters;  // each layer's count
};

constexpr char kScriptPrefix[] = "torchscript:";

bool IsScripted(const JobSpec& spec) { return absl::StartsWith(spec.model, kScriptPrefix); }

// A TorchScript module's top-level children, once the module is shown to
// run them in order: on `sample` (inference mode, so dropout does not
// count), the children chained give what its forward gives.
absl::StatusOr<LayerSource> ScriptedLayers(const TrainerOptions& options, const at::Tensor& sample) {
  const JobSpec& spec = options.spec;
  auto loaded = LoadTorchScriptModel(options.data_root, spec.model.substr(std::strlen(kScriptPrefix)));
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<Model> whole = std::move(*loaded);
  const std::string name = spec.model.substr(0, 200);
  LayerSource source;
  source.count = whole->LayerCount();
  if (source.count < spec.pipeline.stages) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.stages must be at most ", source.count, ": model ", name,
                                                   " has ", source.count, " top-level children (or stage_<i> "
                                                   "methods), and a stage holds at least one"));
  }
  source.make = [whole](int begin, int end) { return whole->Layers(begin, end); };
  auto chained = whole->Layers(0, source.count);
  if (!chained.ok()) {
    return absl::Status(chained.status().code(), absl::StrCat("model ", name, ": ", chained.status().message()));
  }
  std::string why;
  try {
    c10::NoGradGuard no_grad;
    whole->SetTraining(false);
    const at::Tensor want = whole->Forward(sample), got = (*chained)->Forward(sample);
    if (!want.sizes().equals(got.sizes()) || !at::allclose(got, want, 1e-5, 1e-6)) why = "gives other outputs";
  } catch (const c10::Error& e) {
    why = absl::StrCat("fails: ", std::string(e.what_without_backtrace()).substr(0, 300));
  }
  whole->SetTraining(true);
  if (!why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", name, " cannot be cut into stages: its top-level children (or stage_<i> methods) run one "
        "after the other ", why, " than its forward; a pipelined TorchScript module must be sequential at its "
        "top level (an nn.Sequential, or a forward that only calls its children in order), or name its stages: "
        "methods stage_0, stage_1, ... whose chain is its forward"));
  }
  for (int i = 0; i < source.count; ++i) {
    auto layer = whole->Layers(i, i + 1);
    if (!layer.ok()) return layer.status();
    double n = 0;
    for (const auto& [unused, t] : (*layer)->NamedParameters()) n += static_cast<double>(t.numel());
    source.parameters.push_back(n);
  }
  return source;
}

absl::StatusOr<LayerSource> BuiltInLayers(const JobSpec& spec, const std::vector<int64_t>& shape) {
  LayerSource source;
  source.count = PipelineLayers(spec.model);
  source.make = [spec, shape](int begin, int end) {
    return CreateModelStage(spec.model, shape, spec.data.num_classes, spec.seed, begin, end);
  };
  auto costs = ModelLayerCosts(spec.model, shape, spec.data.num_classes);
  if (!costs.ok()) return costs.status();
  source.parameters = *std::move(costs);
  return source;
}

// Each layer's forward + backward seconds on `sample` (one micro-batch of
// inputs; the median of 3 runs after a warm-up), the layers built one at a
// time.
absl::StatusOr<std::vector<double>> MeasureLayerSeconds(const LayerSource& source, const at::Tensor& sample) {
  at::Tensor x = sample;
  std::vector<double> seconds;
  for (int i = 0; i < source.count; ++i) {
    auto layer = source.make(i, i + 1);
    if (!layer.ok()) return layer.status();
    std::vector<double> runs;
    at::Tensor y;
    for (int run = 0; run < 4; ++run) {
      const auto start = std::chrono::steady_clock::now();
      y = (*layer)->Forward(x.detach().requires_grad_(i > 0));
      if (y.requires_grad()) y.sum().backward();
      if (run > 0) runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(runs.begin(), runs.end());
    seconds.push_back(runs[runs.size() / 2]);
    x = y.detach();
  }
  return seconds;
}

}  // namespace

absl::StatusOr<std::vector<int>> PipelineCut(const JobSpec& spec, const std::vector<double>& costs) {
  auto first = BalancedCut(costs, spec.pipeline.stages);
  if (!first.ok()) return first.status();
  first->push_back(static_cast<int>(costs.size()));
  return first;
}

absl::StatusOr<std::unique_ptr<Model>> CreatePipelineStageModel(const TrainerOptions& options, const Dataset& train) {
  const JobSpec& spec = options.spec;
  const std::vector<int64_t> shape(train.inputs.sizes().begin() + 1, train.inputs.sizes().end());
  const int64_t micro = (spec.batch_size + spec.pipeline.micro_batches - 1) / spec.pipeline.micro_batches;
  const at::Tensor sample = train.Normalize(train.inputs.narrow(0, 0, std::min(micro, train.size())));
  auto source = IsScripted(spec) ? ScriptedLayers(options, sample) : BuiltInLayers(spec, shape);
  if (!source.ok()) return source.status();
  std::vector<double> costs = source->parameters;
  if (spec.pipeline.balance == "time") {
    at::Tensor sent = at::zeros({static_cast<int64_t>(costs.size())}, at::kDouble);
    if (options.rank == 0) {
      auto measured = MeasureLayerSeconds(*source, sample);
      if (!measured.ok()) return measured.status();
      std::copy(measured->begin(), measured->end(), sent.data_ptr<double>());
    }
    if (absl::Status s = options.pipeline->Broadcast(sent, 0)->Wait(); !s.ok()) return s;
    costs.assign(sent.data_ptr<double>(), sent.data_ptr<double>() + sent.numel());
  }
  auto cut = PipelineCut(spec, costs);
  if (!cut.ok()) return cut.status();
  // Every rank checks every stage, so all of them refuse alike.
  for (int st = 0; st < spec.pipeline.stages; ++st) {
    double held = 0;
    for (int i = (*cut)[st]; i < (*cut)[st + 1]; ++i) held += source->parameters[i];
    if (held > 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline stage ", st, " (layers ", (*cut)[st], "..", (*cut)[st + 1] - 1, " of model ",
        spec.model.substr(0, 200), ") would hold no trainable parameters; use fewer stages, or "
        "balance: parameters, or put parameter-free layers inside the children that have parameters"));
  }
  const int s = PipelinePlaceOf(spec.pipeline, options.rank, options.world_size).stage;
  spdlog::info("rank {}: stage {} of {}: layers {}..{} of {}'s {} (balanced by {}: {})", options.rank, s,
               spec.pipeline.stages, (*cut)[s], (*cut)[s + 1] - 1, spec.model, costs.size(), spec.pipeline.balance,
               absl::StrJoin(costs, " "));
  auto stage = source->make((*cut)[s], (*cut)[s + 1]);
  if (stage.ok()) (*stage)->ReleaseUnused();  // the whole model goes with `source`
  return stage;
}

absl::StatusOr<std::vector<ParameterSpec>> PipelineModelSpecs(const TrainerOptions& options, const Dataset& train) {
  const JobSpec& spec = options.spec;
  std::vector<ParameterSpec> out;
  if (IsScripted(spec)) {
    auto whole = LoadTorchScriptModel(options.data_root, spec.model.substr(std::strlen(kScriptPrefix)));
    if (!whole.ok()) return whole.status();
    for (const auto& [name, t] : (*whole)->NamedParameters()) {
      out.push_back({name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                     t.scalar_type() == at::kDouble ? DT_FLOAT64 : DT_FLOAT32});
    }
    return out;
  }
  const std::vector<int64_t> shape(train.inputs.sizes().begin() + 1, train.inputs.sizes().end());
  auto shapes = ModelParameterShapes(spec.model, shape, spec.data.num_classes);
  if (!shapes.ok()) return shapes.status();
  for (auto& [name, dims] : *shapes) out.push_back({name, dims, DT_FLOAT32});
  return out;
}

PipelineRun::PipelineRun(const TrainerOptions& options, Model* model, Activity* activity)
    : spec_(options.spec),
      place_(PipelinePlaceOf(spec_.pipeline, options.rank, options.world_size)),
      model_(model),
      group_(options.pipeline),
      activity_(activity),
      link_(std::make_unique<CollectiveStageLink>(options.pipeline, StageRanks(place_))),
      timed_(std::make_unique<TimedLink>(link_.get(), &wait_seconds_, activity, &step_)),
      stage_(
          [&] {
            PipelineStageOptions o;
            o.schedule = ScheduleOf(spec_.pipeline);
            o.stages = place_.stages;
            o.stage = place_.stage;
            // bf16: autocast as in an unpipelined step; activations and their
            // gradients travel in the dtype the stage made them.
            o.forward = [model, device = options.device, precision = spec_.precision](const at::Tensor& x) {
              AutocastScope autocast(device, precision);
              return model->Forward(x);
            };
            o.loss = [](const at::Tensor& out, const at::Tensor& y) {
              return at::cross_entropy_loss(out.to(at::kFloat), y, {}, at::Reduction::Mean);
            };
            return o;
          }(),
          timed_.get()) {}

PipelineRun::~PipelineRun() = default;

absl::Status PipelineRun::Step(const Dataset& data, const BatchLoader::Batch& batch, int64_t step, double scale,
                               at::Tensor* loss) {
  const at::Tensor& labels = batch.labels;
  const int64_t n = labels.size(0);
  const int64_t micro = std::min<int64_t>(spec_.pipeline.micro_batches, n);
  std::vector<int64_t> sizes;
  for (int64_t m = 0; m < micro; ++m) sizes.push_back(n / micro + (m < n % micro ? 1 : 0));
  std::vector<at::Tensor> xs, ys;
  if (place_.first()) xs = data.Normalize(batch.inputs).split_with_sizes(sizes);
  if (place_.last()) ys = labels.split_with_sizes(sizes);
  step_ = step;
  activity_->Enter(WorkerActivity::COMPUTE, step);
  const auto start = std::chrono::steady_clock::now();
  auto mean = stage_.Step(sizes, xs, ys, scale);
  step_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  held_ = std::max(held_, stage_.peak_activations());
  if (!mean.ok()) return absl::Status(mean.status().code(), absl::StrCat("step ", step, ": ", mean.status().message()));
  const at::Tensor part = at::scalar_tensor(*mean, at::kDouble);
  *loss = loss->defined() ? *loss + part : part;
  return absl::OkStatus();
}

void PipelineRun::Report(WorkerEvent::Progress* progress) {
  progress->set_stage(place_.stage);
  progress->set_stages(place_.stages);
  progress->set_bubble(step_seconds_ > 0 ? wait_seconds_ / step_seconds_ : 0);
  progress->set_held_micro_batches(held_);
  wait_seconds_ = step_seconds_ = 0;
  held_ = 0;
}

absl::StatusOr<std::optional<EvalResult>> PipelineRun::Evaluate(const Dataset& test) {
  c10::NoGradGuard no_grad;
  model_->SetTraining(false);
  struct Restore {
    Model* m;
    ~Restore() { m->SetTraining(true); }
  } restore{model_};
  const int s = place_.stage;
  const int64_t n = test.size();
  double loss_sum = 0, correct = 0;
  try {
    for (int64_t start = 0; start < n; start += kEvalBatch) {
      const int64_t len = std::min(kEvalBatch, n - start);
      at::Tensor x;
      if (place_.first()) {
        x = test.Normalize(test.inputs.narrow(0, start, len));
      } else {
        auto got = link_->Recv(s - 1, kEvalActivationTag);
        if (!got.ok()) return got.status();
        x = *got;
      }
      at::Tensor y;
      {
        AutocastScope autocast(c10::Device(c10::kCPU), spec_.precision);
        y = model_->Forward(x);
      }
      if (!place_.last()) {
        if (absl::Status sent = link_->Send(s + 1, kEvalActivationTag, y); !sent.ok()) return sent;
        continue;
      }
      at::Tensor labels = test.labels.narrow(0, start, len);
      y = y.to(at::kFloat);
      loss_sum += at::cross_entropy_loss(y, labels, {}, at::Reduction::Sum).item<double>();
      correct += static_cast<double>(y.argmax(1).eq(labels).sum().item<int64_t>());
    }
    if (place_.last() && !place_.first()) {
      absl::Status sent = link_->Send(0, kEvalResultTag, at::tensor({loss_sum, correct}, at::kDouble));
      if (!sent.ok()) return sent;
    }
    if (place_.first() && !place_.last()) {
      auto got = link_->Recv(place_.stages - 1, kEvalResultTag);
      if (!got.ok()) return got.status();
      if (got->numel() != 2 || got->scalar_type() != at::kDouble) {
        return absl::DataLossError("the last stage's evaluation result is not two float64 numbers");
      }
      loss_sum = got->data_ptr<double>()[0];
      correct = got->data_ptr<double>()[1];
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("stage ", s, " evaluating: ", e.what_without_backtrace()));
  }
  if (absl::Status flushed = link_->Flush(); !flushed.ok()) return flushed;
  if (!place_.first()) return std::optional<EvalResult>();
  EvalResult ev;
  ev.loss = n == 0 ? 0 : loss_sum / static_cast<double>(n);
  ev.accuracy = n == 0 ? 0 : correct / static_cast<double>(n);
  return std::optional<EvalResult>(ev);
}

absl::StatusOr<double> PipelineRun::ClipReplicaGradients(const std::vector<at::Tensor>& params, double max_norm) {
  at::Tensor slots = at::zeros({place_.replicas}, at::kDouble);
  double own = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) own += std::pow(at::linalg_vector_norm(p.grad(), 2).item<double>(), 2);
  }
  slots.data_ptr<double>()[place_.replica] = own;
  if (absl::Status s = group_->AllReduce(slots)->Wait(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the replica's gradient norm: ", s.message()));
  }
  const double norm = std::sqrt(slots.data_ptr<double>()[place_.replica]);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    c10::NoGradGuard no_grad;
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().mul_(coef);
    }
  }
  return norm;
}

absl::StatusOr<NamedTensors> PipelineRun::Conclude(const NamedTensors& own, bool gather) {
  absl::StatusOr<NamedTensors> all = gather ? GatherParameters(own) : NamedTensors();
  if (!all.ok()) return all;
  if (absl::Status s = group_->Barrier()->Wait(); !s.ok()) return s;
  return all;
}

absl::StatusOr<NamedTensors> PipelineRun::GatherParameters(const NamedTensors& own) {
  if (!place_.first()) {
    // A count, then per parameter its name (bytes) and its values.
    absl::Status s = link_->Send(0, kGatherTag, at::tensor({static_cast<int64_t>(own.size())}, at::kLong));
    for (const auto& [name, t] : own) {
      if (!s.ok()) break;
      at::Tensor bytes = at::empty({static_cast<int64_t>(name.size())}, at::kByte);
      std::memcpy(bytes.data_ptr(), name.data(), name.size());
      s = link_->Send(0, kGatherTag, bytes);
      if (s.ok()) s = link_->Send(0, kGatherTag, t.detach());
    }
    if (s.ok()) s = link_->Flush();
    if (!s.ok()) return s;
    return NamedTensors();
  }
  NamedTensors all = own;
  for (int from = 1; from < place_.stages; ++from) {
    auto count = link_->Recv(from, kGatherTag);
    if (!count.ok()) return count.status();
    if (count->numel() != 1 || count->scalar_type() != at::kLong || count->item<int64_t>() < 0 ||
        count->item<int64_t>() > 65536) {
      return absl::DataLossError(absl::StrCat("stage ", from, " sent a bad parameter count"));
    }
    for (int64_t i = count->item<int64_t>(); i > 0; --i) {
      auto name = link_->Recv(from, kGatherTag);
      if (!name.ok()) return name.status();
      auto value = link_->Recv(from, kGatherTag);
      if (!value.ok()) return value.status();
      if (name->scalar_type() != at::kByte || name->dim() != 1 || name->numel() > 1024) {
        return absl::DataLossError(absl::StrCat("stage ", from, " sent a bad parameter name"));
      }
      all.emplace_back(std::string(static_cast<const char*>(name->data_ptr()), name->numel()), *value);
    }
  }
  return all;
}

}  // namespace pstrain
