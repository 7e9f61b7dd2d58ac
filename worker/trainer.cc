#include "worker/trainer.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
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
#include "worker/activity.h"
#include "worker/batch_loader.h"
#include "worker/device.h"
#include "worker/evaluation.h"
#include "worker/gradient_exchange.h"
#include "worker/loss_scaler.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/sampler.h"
#include "worker/weights_file.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

WorkerEvent EvalEvent(int rank, int epoch, const EvalResult& ev, bool final) {
  WorkerEvent e;
  e.set_rank(rank);
  e.mutable_eval()->set_epoch(epoch);
  e.mutable_eval()->set_test_loss(ev.loss);
  e.mutable_eval()->set_accuracy(ev.accuracy);
  e.mutable_eval()->set_final(final);
  return e;
}

// One run of the training loop; RunTrainer's state, its phases as methods.
class Trainer {
 public:
  Trainer(const TrainerOptions& options, const TrainTest& data)
      : options_(options),
        spec_(options.spec),
        data_(data),
        device_(options.device),
        activity_(options.activity != nullptr ? *options.activity : own_activity_) {}

  absl::StatusOr<TrainResult> Run();

 private:
  struct UnreadLoss {
    int64_t step;
    DeferredScalar loss;  // copied from the device as soon as it is computed
    int64_t samples;
    double seconds, wait_seconds, data_seconds, lr;
    double grad_norm;  // -1: not computed
  };
  // A progress window's sums (see WorkerEvent.Progress).
  struct Window {
    int steps = 0, loss_steps = 0;
    int64_t samples = 0;
    double loss = 0, seconds = 0, wait = 0, data = 0, lr = 0, grad_norm = 0;
    int grad_norms = 0;
  };

  // The model on the device, its parameters and their layout.
  absl::Status BuildModel();
  // The parameter-server or all-reduce exchange, its tables initialised.
  absl::Status BuildExchange();
  // Rank 0 tells the coordinator the model's layout (for checkpoints and
  // their re-partitioning).
  void EmitPlan();
  void RegisterHooks();
  // One optimizer step: micro-batches forward and backward, gradients
  // offered, the exchange finished.
  absl::Status Step(int epoch, int64_t first_micro, int64_t last_micro);
  void TrainMicro(const BatchLoader::Batch& batch, double scale, bool arm, at::Tensor* loss_sum);
  // Parameter server, after one rank's batch (its micro-batches) went
  // through backward: with loss scaling its gradient is unscaled and
  // checked, with clip_grad_norm clipped -- each rank's batch on its own, as
  // its own worker would, also when this worker covers vacant ranks.
  // Returns whether it is finite; adds its norm to *norms.
  bool FinishBatchGradient(std::vector<double>* norms);
  // The step's scaling outcome: an overflow makes the step an empty push
  // (the shards count the step and change nothing). Sets *skipped.
  absl::Status ConcludeScaling(bool finite, bool* skipped);
  // Reads the losses of finished steps, all of them when `all`.
  void ReadLosses(bool all);
  void EmitProgress(int epoch);
  // Final values, evaluation, weights, the done event.
  absl::Status Finish();

  const TrainerOptions& options_;
  const JobSpec& spec_;
  const TrainTest& data_;
  const c10::Device device_;
  Activity own_activity_;
  Activity& activity_;
  std::unique_ptr<Model> model_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<at::Tensor> params_;
  std::vector<ParameterSpec> specs_;
  std::unique_ptr<PsClient> ps_;
  std::unique_ptr<GradientExchange> exchange_;
  // fp16: the loss scale, unscaled and checked by this worker (PS) or by
  // the exchange after the reduction (all-reduce).
  std::unique_ptr<LossScaler> scaler_;
  // Hooks offer a parameter's gradient as soon as autograd produced it.
  bool hooks_ = false;
  bool armed_ = false;  // during backward
  std::vector<bool> offered_;
  // Covering vacant ranks with clipping or loss scaling: the finished
  // gradients of the batches before the current one.
  std::vector<at::Tensor> covered_sum_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  TrainResult result_;
  Clock::time_point start_, window_start_;
  Window window_;
  // A step's loss is read one step later (or when a progress event needs
  // it): by then the device computed it long ago, and reading it waits for
  // nothing else the device has queued since (DeferredScalar).
  std::deque<UnreadLoss> unread_;
  // The loader's thread reads the sampler: declared after it, so stopped
  // before it goes.
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<BatchLoader> loader_;
  // SYNC parameter server: other ranks' batches, for covering vacant ones.
  std::unique_ptr<CoverLoader> covering_;
};

absl::Status Trainer::BuildModel() {
  std::vector<int64_t> input_shape(data_.train.inputs.sizes().begin() + 1, data_.train.inputs.sizes().end());
  auto model = CreateModel(spec_.model, input_shape, spec_.data.num_classes, spec_.seed, options_.data_root);
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  model_->To(device_);
  model_->SetTraining(true);
  named_ = model_->NamedParameters();
  for (auto& [name, t] : named_) {
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " is not float32/float64"));
    }
    params_.push_back(t);
    specs_.push_back({name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                      t.scalar_type() == at::kFloat ? DT_FLOAT32 : DT_FLOAT64});
  }
  return absl::OkStatus();
}

absl::Status Trainer::BuildExchange() {
  const bool allreduce = options_.collective != nullptr;
  if (allreduce && (options_.local_store == nullptr || !options_.shards.empty())) {
    return absl::InvalidArgumentError("all-reduce mode needs a local store and no shards");
  }
  auto plan = MakePartitionPlan(specs_, allreduce ? 1 : spec_.shards, static_cast<size_t>(spec_.chunk_bytes));
  if (!plan.ok()) return plan.status();
  PsClientOptions po;
  po.job = spec_.name;
  po.attempt = allreduce ? 0 : options_.attempt;  // the local store is this attempt's alone
  po.worker = allreduce ? 0 : static_cast<uint32_t>(options_.rank);
  po.generation = allreduce ? 0 : options_.generation;
  po.job_secret = options_.job_secret;
  po.table_grant = options_.table_grant;
  po.activity = &activity_;
  po.wire_dtype = spec_.wire_dtype == WireDtype::kBf16   ? DT_BFLOAT16
                  : spec_.wire_dtype == WireDtype::kFp16 ? DT_FLOAT16
                                                         : DT_FLOAT32;
  po.error_feedback = spec_.wire_error_feedback;
  po.max_in_flight_per_shard = allreduce ? 0 : spec_.requests_in_flight;
  po.plan = *plan;
  auto ps = PsClient::Create(po, allreduce ? std::vector<ParameterStore*>{options_.local_store} : options_.shards);
  if (!ps.ok()) return ps.status();
  ps_ = std::move(*ps);
  ExchangeOptions eo;
  eo.ps = ps_.get();
  for (auto& p : params_) eo.params.push_back(p.detach());
  eo.device = device_;
  eo.bucket_bytes = spec_.bucket_bytes;
  eo.collective = options_.collective;
  eo.clip_grad_norm = spec_.clip_grad_norm;
  eo.wire_dtype = spec_.wire_dtype == WireDtype::kBf16   ? at::kBFloat16
                  : spec_.wire_dtype == WireDtype::kFp16 ? at::kHalf
                                                         : at::kFloat;
  // On an accelerator, gradients are narrowed for the wire (and values
  // widened) there: half the bytes over PCIe and no conversion on the host.
  eo.narrow_on_device = !device_.is_cpu();
  eo.error_feedback = spec_.wire_error_feedback;
  eo.job = spec_.name;
  eo.loss_scaler = allreduce ? scaler_.get() : nullptr;
  if (allreduce) {
    // Everyone starts from rank 0's values (as DDP does); the local store,
    // one worker's SYNC table, is the checkpoint format.
    eo.local_store = options_.local_store;
    auto e = MakeAllReduceExchange(eo);
    if (!e.ok()) return e.status();
    exchange_ = std::move(*e);
    if (options_.restore_local) {
      std::vector<std::string> keys;
      for (const auto& c : plan->chunks) keys.push_back(c.key);
      absl::Status s = options_.restore_local(keys);
      if (!s.ok()) return s;
    }
  } else {
    exchange_ = MakePsExchange(eo);
  }
  // PS: every rank offers the same seeded values; the first InitTable wins
  // and the rest find an identical table. Then everyone starts from the
  // shards' (a restored table's, when resuming).
  return exchange_->InitTables(MakeTableConfig(spec_));
}

void Trainer::EmitPlan() {
  if (options_.rank != 0) return;
  WorkerEvent e;
  e.set_rank(options_.rank);
  WorkerEvent::Plan* plan = e.mutable_plan();
  plan->set_chunk_bytes(spec_.chunk_bytes);
  for (const ParameterSpec& p : specs_) {
    ParameterInfo* info = plan->add_params();
    info->set_name(p.name);
    for (int64_t d : p.shape) info->add_shape(d);
    info->set_dtype(static_cast<int>(p.dtype));
  }
  options_.emit(e);
}

void Trainer::RegisterHooks() {
  // With gradient accumulation only the last micro-step's backward
  // completes the gradients, and (PS) clipping needs them all first, so
  // then everything is offered after backward. All-reduce clips the
  // averaged gradients itself.
  // The same holds for a worker's own check of scaled (fp16) gradients.
  hooks_ = spec_.accumulate_steps == 1 &&
           (exchange_->processes_reduced() || (spec_.clip_grad_norm == 0 && scaler_ == nullptr));
  offered_.assign(params_.size(), false);
  if (!hooks_) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].register_hook([this, i](const at::Tensor& grad) {
      if (!armed_) return;
      offered_[i] = true;
      exchange_->Offer(i, grad);
    });
  }
}

// One micro-batch forward and backward, its loss scaled by `scale` (the
// step's gradient is the mean over its micro-batches); hooks offer
// gradients during backward when `arm`.
void Trainer::TrainMicro(const BatchLoader::Batch& batch, double scale, bool arm, at::Tensor* loss_sum) {
  activity_.Enter(WorkerActivity::COMPUTE, step_);
  // Gathered by the loader's thread, normalised where it trains (a quarter
  // of the bytes cross to a GPU when the data is uint8).
  at::Tensor x = data_.train.Normalize(ToDevice(batch.inputs, device_));
  at::Tensor y = ToDevice(batch.labels, device_);
  at::Tensor logits;
  {
    AutocastScope autocast(device_, spec_.precision);
    logits = model_->Forward(x);
  }
  // The loss in fp32 whatever the forward's precision.
  at::Tensor loss = at::cross_entropy_loss(logits.to(at::kFloat), y, {}, at::Reduction::Mean);
  at::Tensor part = loss.detach() * scale;
  *loss_sum = loss_sum->defined() ? *loss_sum + part : part;
  armed_ = arm;
  (scaler_ != nullptr ? scaler_->ScaleLoss(loss, scale) : loss * scale).backward();
  armed_ = false;
}

absl::Status Trainer::Step(int epoch, int64_t first, int64_t last) {
  const auto step_start = Clock::now();
  // The last step's gradients are dropped, not zeroed (PyTorch's
  // zero_grad(set_to_none=True)): the first backward writes them afresh,
  // and a step saves a memset per parameter. A parameter backward leaves
  // without a gradient is offered zeros (see below).
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
  const double lr = LearningRate(spec_, epoch, step_);
  exchange_->BeginStep(step_, lr);
  // SYNC parameter server with vacant ranks: their batches of this step are
  // shared out among the active ranks (AssignBatches), the pushes say how
  // many batches they sum, and the shards' mean is over all of them.
  StepBatches batches;
  if (covering_ != nullptr) batches = AssignBatches(exchange_->VacantRanks(), options_.rank, options_.world_size);
  exchange_->SetStepBatches(static_cast<uint32_t>(batches.covered.size()), !batches.own);
  const bool arm = hooks_ && batches.own && batches.covered.empty();
  const double scale = 1.0 / static_cast<double>(last - first);
  std::fill(offered_.begin(), offered_.end(), false);
  at::Tensor loss_sum;  // stays on the device (see unread_)
  int64_t samples = 0;
  double data_seconds = 0, grad_norm = -1;
  // The parameter server finishes gradients here (all-reduce: after the
  // reduction); each rank's batch on its own where more than one is trained.
  const bool finish_here =
      !exchange_->processes_reduced() && (scaler_ != nullptr || spec_.clip_grad_norm > 0);
  const bool per_batch = finish_here && batches.own + batches.covered.size() > 1;
  bool finite = true;
  std::vector<double> norms;
  auto batch_done = [&] {
    if (!per_batch) return;
    finite = FinishBatchGradient(&norms) && finite;
    c10::NoGradGuard no_grad;
    if (covered_sum_.empty()) {
      for (auto& p : params_) covered_sum_.push_back(p.grad().defined() ? at::zeros_like(p.grad()) : at::Tensor());
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      covered_sum_[i].add_(params_[i].grad());
      params_[i].mutable_grad().zero_();
    }
  };
  try {
    for (int64_t m = first; m < last; ++m) {
      activity_.Enter(WorkerActivity::DATA, step_);
      const auto data_start = Clock::now();
      absl::StatusOr<BatchLoader::Batch> batch = loader_->Next(epoch, m);  // in order, trained or not
      if (!batch.ok()) return batch.status();
      data_seconds += Seconds(data_start, Clock::now());
      if (!batches.own) continue;
      TrainMicro(*batch, scale, arm, &loss_sum);
      samples += batch->labels.size(0);
    }
    if (batches.own) batch_done();
    for (int v : batches.covered) {
      for (int64_t m = first; m < last; ++m) {
        absl::StatusOr<BatchLoader::Batch> batch = covering_->Get(v, epoch, m);
        if (!batch.ok()) return batch.status();
        TrainMicro(*batch, scale, /*arm=*/false, &loss_sum);
        samples += batch->labels.size(0);
      }
      batch_done();
    }
    const size_t trained = (batches.own ? 1 : 0) + batches.covered.size();
    if (trained > 1) loss_sum = loss_sum / static_cast<double>(trained);
    if (per_batch) {
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!covered_sum_[i].defined()) continue;
        params_[i].mutable_grad().copy_(covered_sum_[i]);
        covered_sum_[i].zero_();
      }
    } else if (finish_here && trained > 0) {
      finite = FinishBatchGradient(&norms);
    }
    if (!norms.empty()) grad_norm = norms.front();  // this rank's own (or first) batch
    bool skipped = false;
    if (scaler_ != nullptr && finish_here && trained > 0) {
      absl::Status s = ConcludeScaling(finite, &skipped);
      if (!s.ok()) {
        exchange_->Abandon();
        return absl::Status(s.code(), absl::StrCat("step ", step_, ": ", s.message()));
      }
    }
  } catch (const c10::Error& e) {
    // Let the exchanges in flight finish (they use this step's buffers);
    // the step's error is the one to report.
    exchange_->Abandon();
    return absl::InternalError(absl::StrCat("training step ", step_, ": ", e.what_without_backtrace()));
  }
  const auto compute_end = Clock::now();
  // Queued now, the copy lands once backward is done.
  const DeferredScalar loss_read = loss_sum.defined() ? DeferredScalar(loss_sum) : DeferredScalar();
  // Everything the hooks did not offer: all of it without hooks, and any
  // parameter that got no gradient (the shards expect every chunk).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (offered_[i]) continue;
    at::Tensor g = params_[i].grad();
    exchange_->Offer(i, g.defined() ? g : at::zeros_like(params_[i]));
  }
  activity_.Enter(spec_.allreduce() ? WorkerActivity::COLLECTIVE : WorkerActivity::SHARDS, step_);
  absl::Status s = exchange_->Finish();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("step ", step_, ": ", s.message()));
  const auto now = Clock::now();
  unread_.push_back({step_ + 1, loss_read, samples, Seconds(step_start, now), Seconds(compute_end, now), data_seconds,
                     lr, grad_norm});
  ++step_;
  result_.samples += samples;
  return absl::OkStatus();
}

bool Trainer::FinishBatchGradient(std::vector<double>* norms) {
  bool finite = true;
  if (scaler_ != nullptr) {
    std::vector<at::Tensor> grads;
    for (const auto& p : params_) grads.push_back(p.grad());
    finite = scaler_->UnscaleAndCheck(grads);
  }
  if (spec_.clip_grad_norm > 0 && finite) {
    norms->push_back(torch::nn::utils::clip_grad_norm_(params_, spec_.clip_grad_norm));
  }
  return finite;
}

absl::Status Trainer::ConcludeScaling(bool finite, bool* skipped) {
  absl::Status s = scaler_->Update(finite);
  if (!s.ok() || finite) return s;
  // Skipped: the shards count the step and change nothing (an empty push);
  // no Inf or NaN reaches a buffer of the exchange (error feedback keeps
  // what it sends).
  *skipped = true;
  exchange_->SetStepBatches(0, /*empty=*/true);
  c10::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  return absl::OkStatus();
}

void Trainer::ReadLosses(bool all) {
  while (unread_.size() > (all ? 0u : 1u)) {
    const UnreadLoss& u = unread_.front();
    // Undefined: a step that trained no batch (see StepBatches.own).
    const double loss = u.loss.defined() ? u.loss.Value() : 0.0;
    if (options_.on_step) options_.on_step(u.step, loss, u.samples, u.seconds, u.wait_seconds);
    if (u.loss.defined()) {
      window_.loss += loss;
      ++window_.loss_steps;
    }
    ++window_.steps;
    window_.samples += u.samples;
    window_.seconds += u.seconds;
    window_.wait += u.wait_seconds;
    window_.data += u.data_seconds;
    window_.lr += u.lr;
    if (u.grad_norm >= 0) {
      window_.grad_norm += u.grad_norm;
      ++window_.grad_norms;
    }
    unread_.pop_front();
  }
}

void Trainer::EmitProgress(int epoch) {
  const auto now = Clock::now();
  WorkerEvent e;
  e.set_rank(options_.rank);
  WorkerEvent::Progress* p = e.mutable_progress();
  p->set_epoch(epoch + 1);
  p->set_epochs(spec_.epochs);
  p->set_step(step_);
  p->set_steps(total_steps_);
  const double steps = std::max(1, window_.steps);
  p->set_loss(window_.loss / std::max(1, window_.loss_steps));
  p->set_samples_per_s(window_.samples / std::max(1e-9, Seconds(window_start_, now)));
  p->set_lr(window_.lr / steps);
  p->set_step_time_s(window_.seconds / steps);
  p->set_exchange_wait_s(window_.wait / steps);
  p->set_data_wait_s(window_.data / steps);
  if (window_.grad_norms > 0) p->set_grad_norm(window_.grad_norm / window_.grad_norms);
  for (ShardCalls& c : activity_.TakeShardWindow()) *p->add_shards() = std::move(c);
  if (scaler_ != nullptr) {
    // Where the scaler is on the device, its verdicts up to this step (the
    // loss was just read, so the host waits little longer); a run of
    // overflows it finds fails the next step.
    (void)scaler_->Settle();
    p->set_loss_scale(scaler_->scale());
    p->set_skipped_steps(scaler_->skipped_steps());
  }
  p->set_elapsed_s(Seconds(start_, now));
  options_.emit(e);
  window_start_ = now;
  window_ = Window{};
}

absl::Status Trainer::Finish() {
  activity_.Enter(WorkerActivity::FINISHING, step_);
  result_.steps = step_;
  result_.seconds = Seconds(start_, Clock::now());
  // Final values: wait until every rank's every step has landed (under SYNC
  // the version is the step; otherwise each active rank's last step counts,
  // whoever holds the rank now), then evaluate.
  absl::Status s = spec_.consistency == SYNC ? exchange_->Pull(step_) : exchange_->Pull(0, step_);
  if (!s.ok()) return s;
  // After the pull, which settles what the device decided last.
  result_.skipped_steps = scaler_ != nullptr ? scaler_->skipped_steps() : 0;
  if (options_.rank == 0 && data_.test.size() > 0) {
    EvalResult ev = Evaluate(*model_, data_.test, device_, spec_.precision);
    result_.final_accuracy = ev.accuracy;
    result_.final_test_loss = ev.loss;
    options_.emit(EvalEvent(options_.rank, spec_.epochs, ev, /*final=*/true));
  }
  if (options_.rank == 0 && options_.write_weights) {
    std::filesystem::create_directories(spec_.output_dir);
    const std::string path = spec_.output_dir + "/model.pt";
    s = SaveWeights(named_, path);
    if (!s.ok()) return s;
    WorkerEvent e;
    e.set_rank(options_.rank);
    e.mutable_weights()->set_path(path);
    options_.emit(e);
  }
  for (auto& [name, t] : named_) {
    result_.parameters.emplace_back(name, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
  }
  // Last: a job is complete when every worker is done, and worker 0's final
  // evaluation and weights must be in by then.
  WorkerEvent done;
  done.set_rank(options_.rank);
  done.mutable_done()->set_steps(result_.steps);
  done.mutable_done()->set_samples(result_.samples);
  done.mutable_done()->set_seconds(result_.seconds);
  done.mutable_done()->set_skipped_steps(result_.skipped_steps);
  options_.emit(done);
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Trainer::Run() {
  if (data_.train.size() == 0) return absl::InvalidArgumentError("the training set is empty");
  if (spec_.precision == Precision::kFp16 && device_.is_cpu() && !kCpuAutocastHasFp16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "precision fp16 on the CPU needs LibTorch 2.2 or later (this worker's is ", TORCH_VERSION,
        ", whose CPU autocast has bfloat16 only): train on a GPU, or use precision bf16"));
  }
  if (spec_.precision == Precision::kFp16 || options_.loss_scaling.has_value()) {
    LossScalerOptions scaling = options_.loss_scaling.value_or(LossScalerOptions{});
    if (options_.start_loss_scale > 0) scaling.init_scale = options_.start_loss_scale;
    scaler_ = std::make_unique<LossScaler>(scaling);
  }
  absl::Status s = BuildModel();
  if (s.ok()) s = BuildExchange();
  if (!s.ok()) return s;
  EmitPlan();
  RegisterHooks();
  sampler_ = std::make_unique<DistributedSampler>(data_.train.size(), options_.rank, options_.world_size, spec_.seed);
  const int64_t micro_per_epoch = (sampler_->per_rank() + spec_.batch_size - 1) / spec_.batch_size;
  const int64_t steps_per_epoch = (micro_per_epoch + spec_.accumulate_steps - 1) / spec_.accumulate_steps;
  total_steps_ = steps_per_epoch * spec_.epochs;
  if (spec_.max_steps > 0) total_steps_ = std::min<int64_t>(total_steps_, spec_.max_steps);
  // Where this worker starts: the checkpoint's place, or, taking over a
  // rank, as far beyond it as the rank has got.
  step_ = options_.start_step;
  int start_epoch = options_.start_epoch;
  int64_t start_es = options_.start_epoch_step;
  if (options_.rejoin_step >= options_.start_step) {
    const int64_t index = start_epoch * steps_per_epoch + start_es + (options_.rejoin_step - options_.start_step);
    start_epoch = static_cast<int>(index / steps_per_epoch);
    start_es = index % steps_per_epoch;
    step_ = options_.rejoin_step;
  }
  BatchPlan batch_plan;
  batch_plan.batch_size = spec_.batch_size;
  batch_plan.start_epoch = start_epoch;
  batch_plan.start_micro = start_es * spec_.accumulate_steps;
  batch_plan.epochs = spec_.epochs;
  batch_plan.micro_per_epoch = micro_per_epoch;
  batch_plan.pin = !device_.is_cpu();
  loader_ = std::make_unique<BatchLoader>(data_.train, *sampler_, batch_plan);
  if (spec_.consistency == SYNC && !spec_.allreduce()) {
    covering_ = std::make_unique<CoverLoader>(data_.train, options_.world_size, spec_.seed, spec_.batch_size);
  }
  start_ = window_start_ = Clock::now();
  for (int epoch = start_epoch; epoch < spec_.epochs && step_ < total_steps_; ++epoch) {
    const int64_t first_step = epoch == start_epoch ? start_es : 0;
    for (int64_t es = first_step; es < steps_per_epoch && step_ < total_steps_; ++es) {
      if (options_.at_step_boundary) {
        StepBoundary at;
        at.step = step_;
        at.epoch = epoch;
        at.epoch_step = es;
        at.flush = [this, step = step_] { return exchange_->Flush(step); };
        if (scaler_ != nullptr) at.loss_scale = [this] { return scaler_->CurrentScale(); };
        options_.at_step_boundary(at);
      }
      if (options_.stop != nullptr && options_.stop->load()) {
        return absl::CancelledError(absl::StrCat("job cancelled at step ", step_));
      }
      const int64_t first = es * spec_.accumulate_steps;
      s = Step(epoch, first, std::min(micro_per_epoch, first + spec_.accumulate_steps));
      if (!s.ok()) return s;
      const bool log_now = step_ % spec_.log_every_steps == 0 || step_ == total_steps_;
      ReadLosses(/*all=*/log_now);
      if (log_now) EmitProgress(epoch);
    }
    if (options_.rank == 0 && data_.test.size() > 0 && epoch + 1 < spec_.epochs && step_ < total_steps_ &&
        spec_.eval_every_epochs > 0 && (epoch + 1) % spec_.eval_every_epochs == 0) {
      // Mid-run evaluation with the current values (others keep training).
      activity_.Enter(WorkerActivity::EVALUATING, step_);
      s = exchange_->Pull();
      if (!s.ok()) return s;
      EvalResult ev = Evaluate(*model_, data_.test, device_, spec_.precision);
      options_.emit(EvalEvent(options_.rank, epoch + 1, ev, /*final=*/false));
    }
  }
  s = Finish();
  if (!s.ok()) return s;
  return std::move(result_);
}

}  // namespace

absl::StatusOr<TrainResult> RunTrainer(const TrainerOptions& options, const TrainTest& data) {
  return Trainer(options, data).Run();
}

}  // namespace pstrain
