#include "worker/trainer.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "collective/collective.h"
#include "common/partition_plan.h"
#include "common/torch_compat.h"
#include "table/shard_store.h"
#include "worker/batch_loader.h"
#include "worker/gradient_exchange.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/sampler.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
};

WorkerEvent EvalEvent(int rank, int epoch, const EvalResult& ev, bool final) {
  WorkerEvent e;
  e.set_rank(rank);
  e.mutable_eval()->set_epoch(epoch);
  e.mutable_eval()->set_test_loss(ev.loss);
  e.mutable_eval()->set_accuracy(ev.accuracy);
  e.mutable_eval()->set_final(final);
  return e;
}

// A batch on the training device, copied from pinned memory without
// blocking the host.
at::Tensor ToDevice(const at::Tensor& t, const c10::Device& device) {
  if (device.is_cpu()) return t;
  return (t.is_pinned() ? t : t.pin_memory()).to(device, /*non_blocking=*/true);
}

// Autocast on this thread for the forward pass (backward follows the dtypes
// forward chose), when the job asks for bf16.
class AutocastScope {
 public:
  AutocastScope(const c10::Device& device, const std::string& precision)
      : type_(device.type()), on_(precision == "bf16") {
    if (on_) SetAutocast(type_, true, at::kBFloat16);
  }
  ~AutocastScope() {
    if (on_) SetAutocast(type_, false, at::kBFloat16);
  }

 private:
  const c10::DeviceType type_;
  const bool on_;
};

EvalResult Evaluate(Model& model, const Dataset& test, const c10::Device& device, const std::string& precision) {
  c10::NoGradGuard no_grad;
  model.SetTraining(false);
  double loss_sum = 0;
  int64_t correct = 0;
  const int64_t n = test.size();
  for (int64_t start = 0; start < n; start += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - start);
    at::Tensor logits;
    {
      AutocastScope autocast(device, precision);
      logits = model.Forward(test.Normalize(ToDevice(test.inputs.narrow(0, start, len), device))).to(at::kFloat);
    }
    at::Tensor y = ToDevice(test.labels.narrow(0, start, len), device);
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  model.SetTraining(true);
  return {n == 0 ? 0 : loss_sum / n, n == 0 ? 0 : static_cast<double>(correct) / n};
}

// torch.save's format (a zip archive: the pickle in data.pkl, each tensor's
// bytes in data/<n>), written without TorchScript's type tags on the dict:
// torch.load's weights_only mode (PyTorch 2.6's default) refuses the
// restore_type_tag global that torch::pickle_save emits for a c10::Dict.
absl::Status SaveWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const std::string& path) {
  try {
    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& [name, t] : params) dict.insert(name, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    std::vector<char> pickled;
    torch::jit::Pickler pickler([&](const char* bytes, size_t n) { pickled.insert(pickled.end(), bytes, bytes + n); },
                                /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                                /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(dict);
    pickler.stop();
    std::vector<char> archive;
    {
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
        archive.insert(archive.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
        return n;
      });
      torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
    }  // the writer finishes the archive when destroyed
    return WriteFileAtomically(path, absl::string_view(archive.data(), archive.size()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("saving weights: ", e.what_without_backtrace()));
  }
}

}  // namespace

absl::StatusOr<TrainResult> RunTrainer(const TrainerOptions& options, const TrainTest& data) {
  const JobSpec& spec = options.spec;
  if (data.train.size() == 0) return absl::InvalidArgumentError("the training set is empty");
  std::vector<int64_t> input_shape(data.train.inputs.sizes().begin() + 1,
                                   data.train.inputs.sizes().end());
  auto model_or = CreateModel(spec.model, input_shape, spec.data.num_classes, spec.seed);
  if (!model_or.ok()) return model_or.status();
  Model& model = **model_or;
  const c10::Device device = options.device;
  model.To(device);
  model.SetTraining(true);
  auto named = model.NamedParameters();
  std::vector<at::Tensor> params;
  std::vector<ParameterSpec> specs;
  for (auto& [name, t] : named) {
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " is not float32/float64"));
    }
    params.push_back(t);
    specs.push_back({name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                     t.scalar_type() == at::kFloat ? DT_FLOAT32 : DT_FLOAT64});
  }
  Collective* const collective = options.collective;
  const bool allreduce = collective != nullptr;
  if (allreduce && options.shards.size() != 1) {
    return absl::InvalidArgumentError("all-reduce mode needs exactly one local parameter store");
  }
  const int table_shards = allreduce ? 1 : spec.shards;
  auto plan = MakePartitionPlan(specs, table_shards, static_cast<size_t>(spec.chunk_bytes));
  if (!plan.ok()) return plan.status();
  PsClientOptions po;
  po.job = spec.name;
  po.attempt = allreduce ? 0 : options.attempt;  // the local store is this attempt's alone
  po.worker = allreduce ? 0 : static_cast<uint32_t>(options.rank);
  po.plan = *plan;
  auto ps_or = PsClient::Create(po, options.shards);
  if (!ps_or.ok()) return ps_or.status();

  ExchangeOptions eo;
  eo.ps = ps_or->get();
  for (auto& p : params) eo.params.push_back(p.detach());
  eo.device = device;
  eo.bucket_bytes = spec.bucket_bytes;
  eo.collective = collective;
  eo.clip_grad_norm = spec.clip_grad_norm;
  eo.job = spec.name;
  if (allreduce) eo.local_store = dynamic_cast<ShardStore*>(options.shards[0]);
  std::unique_ptr<GradientExchange> exchange;
  if (allreduce) {
    // Everyone starts from rank 0's values (as DDP does); the local store,
    // one worker's SYNC table, applies the averaged gradients.
    auto e = MakeAllReduceExchange(eo);
    if (!e.ok()) return e.status();
    exchange = std::move(*e);
    if (options.restore_local) {
      std::vector<std::string> keys;
      for (const auto& c : plan->chunks) keys.push_back(c.key);
      absl::Status s = options.restore_local(keys);
      if (!s.ok()) return s;
    }
  } else {
    exchange = MakePsExchange(eo);
  }
  // PS: every rank offers the same seeded values; the first InitTable wins
  // and the rest find an identical table. Then everyone starts from the
  // shards' (a restored table's, when resuming).
  absl::Status s = exchange->InitTables(MakeTableConfig(spec));
  if (!s.ok()) return s;

  if (options.rank == 0) {
    // The model's layout, for checkpoints and their re-partitioning.
    WorkerEvent e;
    e.set_rank(options.rank);
    WorkerEvent::Plan* plan_event = e.mutable_plan();
    plan_event->set_chunk_bytes(spec.chunk_bytes);
    for (const ParameterSpec& p : specs) {
      ParameterInfo* info = plan_event->add_params();
      info->set_name(p.name);
      for (int64_t d : p.shape) info->add_shape(d);
      info->set_dtype(static_cast<int>(p.dtype));
    }
    options.emit(e);
  }

  // Hooks offer a parameter's gradient as soon as autograd produced it; with
  // gradient accumulation only the last micro-step's backward completes
  // them, and (PS) clipping needs them all first, so then everything is
  // offered after backward. All-reduce clips the averaged gradients itself.
  const bool hooks = spec.accumulate_steps == 1 && (exchange->clips_reduced() || spec.clip_grad_norm == 0);
  std::vector<bool> offered(params.size(), false);
  int64_t step = options.start_step;
  double lr = spec.optimizer.lr();
  bool armed = false;
  if (hooks) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].register_hook([&, i](const at::Tensor& grad) {
        if (!armed) return;
        offered[i] = true;
        exchange->Offer(i, grad);
      });
    }
  }

  DistributedSampler sampler(data.train.size(), options.rank, options.world_size, spec.seed);
  const int64_t micro_per_epoch = (sampler.per_rank() + spec.batch_size - 1) / spec.batch_size;
  const int64_t steps_per_epoch = (micro_per_epoch + spec.accumulate_steps - 1) / spec.accumulate_steps;
  int64_t total_steps = steps_per_epoch * spec.epochs;
  if (spec.max_steps > 0) total_steps = std::min<int64_t>(total_steps, spec.max_steps);

  TrainResult result;
  const auto start = Clock::now();
  auto window_start = start;
  int64_t window_samples = 0;
  double window_loss = 0;
  int window_steps = 0;
  struct UnreadLoss {
    int64_t step;
    at::Tensor loss;  // on the device
    int64_t samples;
    double seconds, wait_seconds;
  };
  std::deque<UnreadLoss> unread;
  BatchPlan batch_plan;
  batch_plan.batch_size = spec.batch_size;
  batch_plan.start_epoch = options.start_epoch;
  batch_plan.start_micro = options.start_epoch_step * spec.accumulate_steps;
  batch_plan.epochs = spec.epochs;
  batch_plan.micro_per_epoch = micro_per_epoch;
  batch_plan.pin = !device.is_cpu();
  BatchLoader loader(data.train, sampler, batch_plan);
  for (int epoch = options.start_epoch; epoch < spec.epochs && step < total_steps; ++epoch) {
    const int64_t first_step = epoch == options.start_epoch ? options.start_epoch_step : 0;
    int64_t micro = first_step * spec.accumulate_steps;
    for (int64_t es = first_step; es < steps_per_epoch && step < total_steps; ++es) {
      if (options.at_step_boundary) {
        options.at_step_boundary(step, epoch, es, [&exchange, step] { return exchange->Flush(step); });
      }
      if (options.stop != nullptr && options.stop->load()) {
        return absl::CancelledError(absl::StrCat("job cancelled at step ", step));
      }
      lr = LearningRate(spec, epoch, step);
      const auto step_start = Clock::now();
      const int64_t first = micro;
      const int64_t last = std::min(micro_per_epoch, first + spec.accumulate_steps);
      micro = last;
      for (auto& p : params) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      exchange->BeginStep(step, lr);
      std::fill(offered.begin(), offered.end(), false);
      // The loss stays on the device (read a step later, see `unread`).
      at::Tensor step_loss_sum;
      int64_t step_samples = 0;
      try {
        for (int64_t m = first; m < last; ++m) {
          absl::StatusOr<BatchLoader::Batch> batch = loader.Next(epoch, m);
          if (!batch.ok()) return batch.status();
          const int64_t len = batch->labels.size(0);
          // Gathered by the loader's thread, normalised where it trains (a
          // quarter of the bytes cross to a GPU when the data is uint8).
          at::Tensor x = data.train.Normalize(ToDevice(batch->inputs, device));
          at::Tensor y = ToDevice(batch->labels, device);
          at::Tensor logits;
          {
            AutocastScope autocast(device, spec.precision);
            logits = model.Forward(x);
          }
          // The loss in fp32 whatever the forward's precision.
          at::Tensor loss = at::cross_entropy_loss(logits.to(at::kFloat), y, {}, at::Reduction::Mean);
          at::Tensor part = loss.detach() / static_cast<double>(last - first);
          step_loss_sum = step_loss_sum.defined() ? step_loss_sum + part : part;
          armed = hooks;
          (loss / static_cast<double>(last - first)).backward();
          armed = false;
          step_samples += len;
        }
        if (spec.clip_grad_norm > 0 && !exchange->clips_reduced()) {
          torch::nn::utils::clip_grad_norm_(params, spec.clip_grad_norm);
        }
      } catch (const c10::Error& e) {
        // Let the exchanges in flight finish (they use this step's buffers);
        // the step's error is the one to report.
        exchange->Abandon();
        return absl::InternalError(absl::StrCat("training step ", step, ": ", e.what_without_backtrace()));
      }
      const auto compute_end = Clock::now();
      // Everything the hooks did not offer: all of it without hooks, and any
      // parameter that got no gradient (the shards expect every chunk).
      for (size_t i = 0; i < params.size(); ++i) {
        if (offered[i]) continue;
        at::Tensor g = params[i].grad();
        exchange->Offer(i, g.defined() ? g : at::zeros_like(params[i]));
      }
      s = exchange->Finish();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
      {
        const auto now = Clock::now();
        unread.push_back({step + 1, step_loss_sum, step_samples, Seconds(step_start, now), Seconds(compute_end, now)});
      }
      ++step;
      result.samples += step_samples;
      window_samples += step_samples;
      const bool log_now = step % spec.log_every_steps == 0 || step == total_steps;
      // A step's loss is read one step later (or when a progress event needs
      // it): by then the device computed it long ago, so the host never
      // waits for the device just to read a number.
      while (unread.size() > (log_now ? 0u : 1u)) {
        const UnreadLoss& u = unread.front();
        const double loss = u.loss.defined() ? u.loss.item<double>() : 0.0;
        if (options.on_step) options.on_step(u.step, loss, u.samples, u.seconds, u.wait_seconds);
        window_loss += loss;
        ++window_steps;
        unread.pop_front();
      }
      if (log_now) {
        const auto now = Clock::now();
        WorkerEvent e;
        e.set_rank(options.rank);
        WorkerEvent::Progress* p = e.mutable_progress();
        p->set_epoch(epoch + 1);
        p->set_epochs(spec.epochs);
        p->set_step(step);
        p->set_steps(total_steps);
        p->set_loss(window_loss / window_steps);
        p->set_samples_per_s(window_samples / std::max(1e-9, Seconds(window_start, now)));
        p->set_elapsed_s(Seconds(start, now));
        options.emit(e);
        window_start = now;
        window_samples = 0;
        window_loss = 0;
        window_steps = 0;
      }
    }
    if (options.rank == 0 && data.test.size() > 0 && epoch + 1 < spec.epochs && step < total_steps) {
      // Mid-run evaluation with the current values (others keep training).
      s = exchange->Pull();
      if (!s.ok()) return s;
      EvalResult ev = Evaluate(model, data.test, device, spec.precision);
      options.emit(EvalEvent(options.rank, epoch + 1, ev, /*final=*/false));
    }
  }
  result.steps = step;
  result.seconds = Seconds(start, Clock::now());

  // Final values: wait until every worker's every step has landed (each
  // worker pushes each chunk once per step), then evaluate.
  const int64_t updates_per_step = spec.consistency == SYNC ? 1 : options.world_size;
  s = exchange->Pull(updates_per_step * step);
  if (!s.ok()) return s;
  if (options.rank == 0) {
    if (data.test.size() > 0) {
      EvalResult ev = Evaluate(model, data.test, device, spec.precision);
      result.final_accuracy = ev.accuracy;
      result.final_test_loss = ev.loss;
      options.emit(EvalEvent(options.rank, spec.epochs, ev, /*final=*/true));
    }
    if (options.write_weights) {
      std::filesystem::create_directories(spec.output_dir);
      const std::string path = spec.output_dir + "/model.pt";
      s = SaveWeights(named, path);
      if (!s.ok()) return s;
      WorkerEvent e;
      e.set_rank(options.rank);
      e.mutable_weights()->set_path(path);
      options.emit(e);
    }
  }
  for (auto& [name, t] : named) {
    result.parameters.emplace_back(name, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
  }
  // Last: a job is complete when every worker is done, and worker 0's final
  // evaluation and weights must be in by then.
  WorkerEvent done;
  done.set_rank(options.rank);
  done.mutable_done()->set_steps(result.steps);
  done.mutable_done()->set_samples(result.samples);
  done.mutable_done()->set_seconds(result.seconds);
  options.emit(done);
  return result;
}

}  // namespace pstrain
