#include "worker/trainer.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/api/include/torch/serialize.h>
#include <torch/nn/utils/clip_grad.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "collective/collective.h"
#include "common/partition_plan.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/sampler.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Counts asynchronous parameter updates of one step and keeps the first error.
class StepBarrier {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_;
  }
  void Done(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && status_.ok()) status_ = s;
    if (--pending_ == 0) cv_.notify_all();
  }
  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
    absl::Status s = status_;
    status_ = absl::OkStatus();
    return s;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  absl::Status status_;
};

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

EvalResult Evaluate(Model& model, const Dataset& test) {
  c10::NoGradGuard no_grad;
  model.SetTraining(false);
  double loss_sum = 0;
  int64_t correct = 0;
  const int64_t n = test.size();
  for (int64_t start = 0; start < n; start += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - start);
    at::Tensor logits = model.Forward(test.inputs.narrow(0, start, len));
    at::Tensor y = test.labels.narrow(0, start, len);
    loss_sum += at::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  model.SetTraining(true);
  return {n == 0 ? 0 : loss_sum / n, n == 0 ? 0 : static_cast<double>(correct) / n};
}

absl::Status SaveWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const std::string& path) {
  try {
    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& [name, t] : params) dict.insert(name, t.detach().clone());
    std::vector<char> bytes = torch::pickle_save(dict);
    return WriteFileAtomically(path, absl::string_view(bytes.data(), bytes.size()));
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
  PsClient& ps = **ps_or;

  std::vector<at::Tensor> detached;
  for (auto& p : params) detached.push_back(p.detach());
  const TableConfig table_config = MakeTableConfig(spec);
  absl::Status s;
  if (allreduce) {
    // Everyone starts from rank 0's values (as DDP does); the local store,
    // one worker's SYNC table, applies the averaged gradients.
    for (auto& d : detached) {
      s = collective->Broadcast(d, 0)->Wait();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("broadcasting the initial parameters: ", s.message()));
    }
    if (options.restore_local) {
      std::vector<std::string> keys;
      for (const auto& c : plan->chunks) keys.push_back(c.key);
      s = options.restore_local(keys);
      if (!s.ok()) return s;
    }
  }
  // PS: every rank offers the same seeded values; the first InitTable wins
  // and the rest find an identical table. Then everyone starts from the
  // shards' (a restored table's, when resuming).
  s = ps.InitTables(detached, table_config);
  if (s.ok()) s = ps.Pull(detached);
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

  std::vector<at::Tensor> staging;
  for (auto& p : detached) staging.push_back(at::empty_like(p));

  // Buckets of parameters, in reverse order (the order backward produces
  // their gradients), of up to bucket_bytes each: a bucket is pushed (one
  // request per shard) as soon as all its gradients exist. Few requests for
  // small models, overlap with backward for large ones.
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> bucket_of(params.size());
  {
    std::vector<size_t> current;
    int64_t bytes = 0;
    for (size_t i = params.size(); i-- > 0;) {
      current.push_back(i);
      bytes += detached[i].nbytes();
      // A bucket holds one dtype (all-reduce packs it into one buffer).
      if (bytes >= spec.bucket_bytes || i == 0 || detached[i - 1].scalar_type() != detached[i].scalar_type()) {
        for (size_t p : current) bucket_of[p] = buckets.size();
        buckets.push_back(std::move(current));
        current.clear();
        bytes = 0;
      }
    }
  }
  // Hooks exchange a bucket as soon as its gradients exist; with gradient
  // accumulation only the last micro-step's backward completes them, and
  // (PS) clipping needs them all first, so then everything goes after
  // backward. All-reduce clips the averaged gradients, after the reduction.
  const bool hooks = spec.accumulate_steps == 1 && (allreduce || spec.clip_grad_norm == 0);
  StepBarrier barrier;
  // All-reduce: one flat buffer per bucket, and its reduction in flight.
  std::vector<at::Tensor> flats;
  std::vector<std::unique_ptr<CollectiveWork>> reductions(buckets.size());
  if (allreduce) {
    for (const auto& bucket : buckets) {
      int64_t numel = 0;
      for (size_t p : bucket) numel += detached[p].numel();
      flats.push_back(at::empty({numel}, detached[bucket.front()].options()));
    }
  }
  std::vector<at::Tensor> ready(params.size());
  std::vector<bool> offered(params.size(), false);
  std::vector<size_t> missing(buckets.size());
  int64_t step = options.start_step;
  double lr = spec.optimizer.lr();
  auto offer = [&](size_t i, const at::Tensor& grad) {
    offered[i] = true;
    ready[i] = grad.contiguous();
    const size_t b = bucket_of[i];
    if (--missing[b] > 0) return;
    if (allreduce) {
      int64_t offset = 0;
      for (size_t p : buckets[b]) {
        const int64_t n = ready[p].numel();
        flats[b].narrow(0, offset, n).copy_(ready[p].view({-1}));
        ready[p] = at::Tensor();
        offset += n;
      }
      reductions[b] = collective->AllReduce(flats[b]);
      return;
    }
    std::vector<at::Tensor> grads, intos;
    for (size_t p : buckets[b]) {
      grads.push_back(std::move(ready[p]));
      intos.push_back(staging[p]);
    }
    barrier.Add();
    ps.PushPullAsync(step, buckets[b], grads, intos, lr,
                     [&barrier](absl::Status st) { barrier.Done(st); });
  };
  // All-reduce: waits for every bucket's reduction, averages, clips, and has
  // the local store apply the step (its new values land in `staging`).
  auto ApplyReduced = [&](int64_t at_step, double step_lr) -> absl::Status {
    absl::Status first;
    for (auto& r : reductions) {
      absl::Status st = r->Wait();
      if (!st.ok() && first.ok()) first = st;
      r.reset();
    }
    if (!first.ok()) return first;
    c10::NoGradGuard no_grad;
    for (auto& f : flats) f.div_(static_cast<double>(collective->size()));
    if (spec.clip_grad_norm > 0) {
      double sq = 0;
      for (auto& f : flats) sq += f.to(at::kDouble).pow(2).sum().item<double>();
      const double coef = spec.clip_grad_norm / (std::sqrt(sq) + 1e-6);
      if (coef < 1) {
        for (auto& f : flats) f.mul_(coef);
      }
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      std::vector<at::Tensor> grads, intos;
      int64_t offset = 0;
      for (size_t p : buckets[b]) {
        const int64_t n = detached[p].numel();
        grads.push_back(flats[b].narrow(0, offset, n).view(detached[p].sizes()));
        intos.push_back(staging[p]);
        offset += n;
      }
      barrier.Add();
      ps.PushPullAsync(at_step, buckets[b], grads, intos, step_lr, [&barrier](absl::Status st) { barrier.Done(st); });
    }
    return absl::OkStatus();
  };
  bool armed = false;
  if (hooks) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].register_hook([&, i](const at::Tensor& grad) {
        if (armed) offer(i, grad);
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
  for (int epoch = options.start_epoch; epoch < spec.epochs && step < total_steps; ++epoch) {
    const std::vector<int64_t> order = sampler.Indices(epoch);
    const int64_t first_step = epoch == options.start_epoch ? options.start_epoch_step : 0;
    int64_t micro = first_step * spec.accumulate_steps;
    for (int64_t es = first_step; es < steps_per_epoch && step < total_steps; ++es) {
      if (options.at_step_boundary) options.at_step_boundary(step, epoch, es);
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
      for (size_t b = 0; b < buckets.size(); ++b) missing[b] = buckets[b].size();
      std::fill(ready.begin(), ready.end(), at::Tensor());
      std::fill(offered.begin(), offered.end(), false);
      double step_loss = 0;
      int64_t step_samples = 0;
      try {
        for (int64_t m = first; m < last; ++m) {
          const int64_t b0 = m * spec.batch_size;
          const int64_t len = std::min<int64_t>(spec.batch_size, sampler.per_rank() - b0);
          at::Tensor idx = at::from_blob(const_cast<int64_t*>(order.data() + b0), {len}, at::kLong);
          at::Tensor x = data.train.inputs.index_select(0, idx);
          at::Tensor y = data.train.labels.index_select(0, idx);
          at::Tensor loss = at::cross_entropy_loss(model.Forward(x), y, {}, at::Reduction::Mean);
          step_loss += loss.item<double>() / (last - first);
          armed = hooks;
          (loss / static_cast<double>(last - first)).backward();
          armed = false;
          step_samples += len;
        }
        if (spec.clip_grad_norm > 0 && !allreduce) {
          torch::nn::utils::clip_grad_norm_(params, spec.clip_grad_norm);
        }
      } catch (const c10::Error& e) {
        // Let the exchanges in flight finish (they use this step's buffers);
        // the step's error is the one to report.
        (void)barrier.Wait();
        for (auto& r : reductions) {
          if (r != nullptr) (void)r->Wait();
        }
        return absl::InternalError(absl::StrCat("training step ", step, ": ", e.what_without_backtrace()));
      }
      const auto compute_end = Clock::now();
      // Everything the hooks did not push: all of it without hooks, and any
      // parameter that got no gradient (the shards expect every chunk).
      for (size_t i = 0; i < params.size(); ++i) {
        if (offered[i]) continue;
        at::Tensor g = params[i].grad();
        offer(i, g.defined() ? g : at::zeros_like(detached[i]));
      }
      if (allreduce) {
        s = ApplyReduced(step, lr);
        if (!s.ok()) return absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
      }
      s = barrier.Wait();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
      if (options.on_step) {
        const auto now = Clock::now();
        options.on_step(step + 1, step_loss, step_samples, Seconds(step_start, now), Seconds(compute_end, now));
      }
      {
        c10::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) detached[i].copy_(staging[i]);
      }
      ++step;
      result.samples += step_samples;
      window_samples += step_samples;
      window_loss += step_loss;
      ++window_steps;
      if (step % spec.log_every_steps == 0 || step == total_steps) {
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
      s = ps.Pull(detached);
      if (!s.ok()) return s;
      EvalResult ev = Evaluate(model, data.test);
      options.emit(EvalEvent(options.rank, epoch + 1, ev, /*final=*/false));
    }
  }
  result.steps = step;
  result.seconds = Seconds(start, Clock::now());

  // Final values: wait until every worker's every step has landed (each
  // worker pushes each chunk once per step), then evaluate.
  const int64_t updates_per_step = spec.consistency == SYNC ? 1 : options.world_size;
  s = ps.Pull(detached, updates_per_step * step);
  if (!s.ok()) return s;
  if (options.rank == 0) {
    if (data.test.size() > 0) {
      EvalResult ev = Evaluate(model, data.test);
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
  for (auto& [name, t] : named) result.parameters.emplace_back(name, t.detach().clone());
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
