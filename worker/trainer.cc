#include "worker/trainer.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "collective/collective.h"
#include "common/partition_plan.h"
#include "common/torch_compat.h"
#include "common/weights_file.h"
#include "spdlog/spdlog.h"
#include "worker/activity.h"
#include "worker/batch_loader.h"
#include "worker/checkpoint_buffers.h"
#include "worker/device.h"
#include "worker/evaluation.h"
#include "worker/exchange_setup.h"
#include "worker/gradient_exchange.h"
#include "worker/int8_job_export.h"
#include "worker/loss_scaler.h"
#include "worker/model.h"
#include "worker/pipeline_run.h"
#include "worker/progress_window.h"
#include "worker/qat_model.h"
#include "worker/ps_client.h"
#include "worker/sampler.h"
#include "worker/step_schedule.h"
#include "worker/trainer_events.h"
#include "worker/vacant_rank_cover.h"

namespace pstrain {
namespace {

using Clock = ProgressWindow::Clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

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
  // The model on the device, its parameters and their layout.
  absl::Status BuildModel();
  // The parameter-server or all-reduce exchange, its tables initialised.
  absl::Status BuildExchange();
  void RegisterHooks();
  // One optimizer step: micro-batches forward and backward, gradients
  // offered, the exchange finished.
  absl::Status Step(int epoch, int64_t first_micro, int64_t last_micro);
  void TrainMicro(const BatchLoader::Batch& batch, double scale, bool arm, at::Tensor* loss_sum);
  // Parameter server, after one rank's batch went through backward: its gradient unscaled and checked
  // (fp16), clipped (clip_grad_norm), each rank's batch on its own as its worker would (covering vacant
  // ranks too). Whether it is finite; its norm added to *norms.
  absl::StatusOr<bool> FinishBatchGradient(std::vector<double>* norms);
  // The step's scaling outcome: an overflow makes the step an empty push
  // (the shards count the step and change nothing). Sets *skipped.
  absl::Status ConcludeScaling(bool finite, bool* skipped);
  void EmitProgress(int epoch);
  // Final values, evaluation, weights, the done event.
  absl::Status Finish();
  // The test set's loss and accuracy, emitted where this rank learns them
  // (rank 0; a pipeline's stages evaluate together).
  absl::Status EvaluateAndEmit(int epoch, bool final);

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
  std::vector<ParameterSpec> whole_specs_;  // a pipeline's: every stage's parameters
  std::unique_ptr<PsClient> ps_;
  std::unique_ptr<GradientExchange> exchange_;
  // fp16: the loss scale, unscaled and checked by this worker (PS) or by
  // the exchange after the reduction (all-reduce).
  std::unique_ptr<LossScaler> scaler_;
  // Hooks offer a parameter's gradient as soon as autograd produced it.
  bool hooks_ = false;
  bool armed_ = false;  // during backward
  std::vector<bool> offered_;
  int64_t step_ = 0;
  bool has_buffers_ = false;  // QAT's quantizers: checkpoints save them
  StepSchedule schedule_;
  TrainResult result_;
  Clock::time_point start_;
  std::unique_ptr<ProgressWindow> progress_;
  // The loader's thread reads the sampler: declared after it, so stopped
  // before it goes.
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<BatchLoader> loader_;
  // SYNC parameter server: covering vacant ranks (null otherwise).
  std::unique_ptr<VacantRankCover> covering_;
  std::unique_ptr<PipelineRun> pipeline_;  // pipelined jobs: this rank's stage
  bool evaluates_ = false;  // rank 0, or replica 0's stages together
};

absl::Status Trainer::BuildModel() {
  std::vector<int64_t> input_shape(data_.train.inputs.sizes().begin() + 1, data_.train.inputs.sizes().end());
  auto model = options_.pipeline != nullptr
                   ? CreatePipelineStageModel(options_, data_.train)
                   : CreateModel(spec_.model, input_shape, spec_.data.num_classes, spec_.seed, options_.data_root);
  if (model.ok() && spec_.quantization.qat()) {
    // Every rank's observers see the global batch (ps: over a group of their own).
    Collective* g = options_.observer_group != nullptr ? options_.observer_group : options_.collective;
    model = WrapForQat(*std::move(model), spec_.model, spec_.quantization,
                       g != nullptr && g->size() > 1 ? AllRanksBatchRange(g) : nullptr);
  }
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  model_->To(device_);
  model_->SetTraining(true);
  has_buffers_ = !model_->NamedBuffers().empty();
  if (options_.restore_buffers && has_buffers_) {
    // Resumed: the checkpoint's quantizers, not fresh ones.
    auto saved = options_.restore_buffers();
    if (!saved.ok()) return saved.status();
    if (saved->empty()) {
      spdlog::warn("rank {}: the checkpoint holds no model buffers (written without quantization?): the model's "
                   "start afresh", options_.rank);
    } else if (absl::Status s = LoadBuffersInto(*saved, model_->NamedBuffers()); !s.ok()) {
      return s;
    }
  }
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
  // A pipeline's whole layout: rank 0 reports it; a ps stage's chunks lie where its plan puts them.
  if (options_.pipeline != nullptr && (options_.rank == 0 || !spec_.allreduce())) {
    auto whole = PipelineModelSpecs(options_, data_.train);
    if (!whole.ok()) return whole.status();
    whole_specs_ = std::move(*whole);
  }
  auto set = MakeExchange(options_, params_, specs_, &activity_, scaler_.get(),
                          whole_specs_.empty() ? nullptr : &whole_specs_);
  if (!set.ok()) return set.status();
  ps_ = std::move(set->ps);
  exchange_ = std::move(set->exchange);
  return absl::OkStatus();
}

void Trainer::RegisterHooks() {
  // Hooks offer gradients during backward, unless the step needs them all first: accumulated
  // micro-batches (a pipeline's too), a ps worker's own clipping or fp16 check (not all-reduce's).
  hooks_ = spec_.accumulate_steps == 1 && pipeline_ == nullptr &&
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
    model_->SetStep(step_);
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
  if (covering_ != nullptr) batches = covering_->Assign(exchange_->VacantRanks());
  exchange_->SetStepBatches(static_cast<uint32_t>(batches.covered.size()), !batches.own);
  const bool arm = hooks_ && batches.own && batches.covered.empty();
  const double scale = 1.0 / static_cast<double>(last - first);
  std::fill(offered_.begin(), offered_.end(), false);
  at::Tensor loss_sum;  // stays on the device (see ProgressWindow)
  int64_t samples = 0;
  double data_seconds = 0, grad_norm = -1;
  // The parameter server finishes gradients here (all-reduce: after the
  // reduction); each rank's batch on its own where more than one is trained
  // (so only while covering).
  const bool finish_here =
      !exchange_->processes_reduced() && (scaler_ != nullptr || spec_.clip_grad_norm > 0);
  const bool per_batch = finish_here && batches.own + batches.covered.size() > 1;
  bool finite = true;
  std::vector<double> norms;
  auto batch_done = [&] {
    if (!per_batch) return;
    finite = FinishBatchGradient(&norms).value_or(false) && finite;  // no pipeline: no collective to fail
    covering_->SetAside(params_);
  };
  try {
    for (int64_t m = first; m < last; ++m) {
      activity_.Enter(WorkerActivity::DATA, step_);
      const auto data_start = Clock::now();
      absl::StatusOr<BatchLoader::Batch> batch = loader_->Next(epoch, m);  // in order, trained or not
      if (!batch.ok()) return batch.status();
      data_seconds += Seconds(data_start, Clock::now());
      if (!batches.own) continue;
      if (pipeline_ == nullptr) {
        TrainMicro(*batch, scale, arm, &loss_sum);
      } else if (absl::Status ps = pipeline_->Step(data_.train, *batch, step_, scale, &loss_sum); !ps.ok()) {
        return ps;
      }
      samples += batch->labels.size(0);
    }
    if (batches.own) batch_done();
    for (int v : batches.covered) {
      for (int64_t m = first; m < last; ++m) {
        absl::StatusOr<BatchLoader::Batch> batch = covering_->Batch(v, epoch, m);
        if (!batch.ok()) return batch.status();
        TrainMicro(*batch, scale, /*arm=*/false, &loss_sum);
        samples += batch->labels.size(0);
      }
      batch_done();
    }
    const size_t trained = (batches.own ? 1 : 0) + batches.covered.size();
    if (trained > 1) loss_sum = loss_sum / static_cast<double>(trained);
    if (per_batch) {
      covering_->Restore(params_);
    } else if (finish_here && trained > 0) {
      absl::StatusOr<bool> f = FinishBatchGradient(&norms);  // nothing offered yet: hooks are off
      if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat("step ", step_, ": ", f.status().message()));
      finite = *f;
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
  progress_->Add({step_ + 1, loss_read, samples, Seconds(step_start, now), Seconds(compute_end, now), data_seconds,
                  lr, grad_norm});
  ++step_;
  result_.samples += samples;
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::FinishBatchGradient(std::vector<double>* norms) {
  bool finite = true;
  if (scaler_ != nullptr) {
    std::vector<at::Tensor> grads;
    for (const auto& p : params_) grads.push_back(p.grad());
    finite = scaler_->UnscaleAndCheck(grads);
  }
  if (spec_.clip_grad_norm > 0 && finite) {
    auto norm = pipeline_ != nullptr
                    ? pipeline_->ClipReplicaGradients(params_, spec_.clip_grad_norm)
                    : absl::StatusOr<double>(torch::nn::utils::clip_grad_norm_(params_, spec_.clip_grad_norm));
    if (!norm.ok()) return norm.status();
    norms->push_back(*norm);
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

void Trainer::EmitProgress(int epoch) {
  const auto now = Clock::now();
  WorkerEvent e = progress_->Event(options_.rank, epoch, spec_.epochs, step_, schedule_.total_steps,
                                   activity_.TakeShardWindow(), now, Seconds(start_, now));
  if (pipeline_ != nullptr) pipeline_->Report(e.mutable_progress());
  if (scaler_ != nullptr) {
    WorkerEvent::Progress* p = e.mutable_progress();
    // Where the scaler is on the device, its verdicts up to this step (the
    // loss was just read, so the host waits little longer); a run of
    // overflows it finds fails the next step.
    (void)scaler_->Settle();
    p->set_loss_scale(scaler_->scale());
    p->set_skipped_steps(scaler_->skipped_steps());
  }
  options_.emit(e);
}

absl::Status Trainer::EvaluateAndEmit(int epoch, bool final) {
  auto ev = pipeline_ != nullptr ? pipeline_->Evaluate(data_.test)
                                 : absl::StatusOr<std::optional<EvalResult>>(
                                       Evaluate(*model_, data_.test, device_, spec_.precision));
  if (!ev.ok()) return ev.status();
  if (!ev->has_value()) return absl::OkStatus();  // a pipeline's stage past the first
  if (final) {
    result_.final_accuracy = (*ev)->accuracy;
    result_.final_test_loss = (*ev)->loss;
  }
  options_.emit(EvalEvent(options_.rank, epoch, **ev, final));
  return absl::OkStatus();
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
  if (evaluates_ && data_.test.size() > 0) {
    if (s = EvaluateAndEmit(spec_.epochs, /*final=*/true); !s.ok()) return s;
  }
  NamedTensors state = named_;
  if (pipeline_ != nullptr) {
    auto all = pipeline_->Conclude(named_, /*gather=*/evaluates_);  // onto rank 0: the whole model
    if (!all.ok()) return all.status();
    if (options_.rank == 0) state = std::move(*all);
  }
  if (options_.rank == 0 && options_.write_weights) {
    for (auto& b : model_->NamedBuffers()) state.push_back(std::move(b));  // QAT's quantizers
    auto path = WriteJobWeights(spec_, state, data_.train);
    if (!path.ok()) return path.status();
    options_.emit(WeightsEvent(options_.rank, *path));
  }
  auto copy = [](const NamedTensors& from, NamedTensors* to) {
    for (auto& [name, t] : from) to->emplace_back(name, t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
  };
  copy(named_, &result_.parameters);
  copy(model_->NamedBuffers(), &result_.buffers);
  // Last: a job is complete when every worker is done, and worker 0's final
  // evaluation and weights must be in by then.
  options_.emit(DoneEvent(options_.rank, result_.steps, result_.samples, result_.seconds, result_.skipped_steps));
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
  // Rank 0 reports the model's layout (for checkpoints): a pipeline's, all stages'.
  if (options_.rank == 0) options_.emit(PlanEvent(0, spec_.chunk_bytes, options_.pipeline ? whole_specs_ : specs_));
  if (options_.pipeline != nullptr) pipeline_ = std::make_unique<PipelineRun>(options_, model_.get(), &activity_);
  // Unpipelined: replica = rank. A replica's stages draw the same batches.
  const PipelinePlace place = PipelinePlaceOf(spec_.pipeline, options_.rank, options_.world_size);
  evaluates_ = place.replica == 0;
  RegisterHooks();
  sampler_ = std::make_unique<DistributedSampler>(data_.train.size(), place.replica, place.replicas, spec_.seed);
  schedule_ = MakeStepSchedule(spec_, sampler_->per_rank(), options_.start_step, options_.start_epoch,
                               options_.start_epoch_step, options_.rejoin_step);
  step_ = schedule_.start_step;
  // A resumed QAT job quantizes from its first step -- and in an
  // evaluation before any (stopped at the checkpoint's step).
  model_->SetStep(step_);
  // BatchPlan{batch_size, start_epoch, start_micro, epochs, micro_per_epoch, pin}
  const BatchPlan plan{spec_.batch_size, schedule_.start_epoch, schedule_.start_epoch_step * spec_.accumulate_steps,
                       spec_.epochs,     schedule_.micro_per_epoch, !device_.is_cpu()};
  loader_ = std::make_unique<BatchLoader>(data_.train, *sampler_, plan);
  if (spec_.consistency == SYNC && !spec_.allreduce() && pipeline_ == nullptr) {  // a lost stage restarts the job
    covering_ = std::make_unique<VacantRankCover>(data_.train, options_.rank, options_.world_size, spec_.seed,
                                                  spec_.batch_size);
  }
  start_ = Clock::now();
  progress_ = std::make_unique<ProgressWindow>(options_.on_step, start_);
  for (int epoch = schedule_.start_epoch; epoch < spec_.epochs && step_ < schedule_.total_steps; ++epoch) {
    const int64_t first_step = epoch == schedule_.start_epoch ? schedule_.start_epoch_step : 0;
    for (int64_t es = first_step; es < schedule_.steps_per_epoch && step_ < schedule_.total_steps; ++es) {
      if (options_.at_step_boundary) {
        StepBoundary at;
        at.step = step_;
        at.epoch = epoch;
        at.epoch_step = es;
        at.flush = [this, step = step_] { return exchange_->Flush(step); };
        if (scaler_ != nullptr) at.loss_scale = [this] { return scaler_->CurrentScale(); };
        if (has_buffers_) {
          at.save_buffers = [this](const std::string& path) { return SaveBuffersFile(model_->NamedBuffers(), path); };
        }
        options_.at_step_boundary(at);
      }
      if (options_.stop != nullptr && options_.stop->load()) {
        return absl::CancelledError(absl::StrCat("job cancelled at step ", step_));
      }
      const int64_t first = es * spec_.accumulate_steps;
      s = Step(epoch, first, std::min(schedule_.micro_per_epoch, first + spec_.accumulate_steps));
      if (!s.ok()) return s;
      const bool log_now = step_ % spec_.log_every_steps == 0 || step_ == schedule_.total_steps;
      progress_->ReadLosses(/*all=*/log_now);
      if (log_now) EmitProgress(epoch);
    }
    if (evaluates_ && data_.test.size() > 0 && epoch + 1 < spec_.epochs && step_ < schedule_.total_steps &&
        spec_.eval_every_epochs > 0 && (epoch + 1) % spec_.eval_every_epochs == 0) {
      // Mid-run evaluation with the current values (others keep training).
      activity_.Enter(WorkerActivity::EVALUATING, step_);
      s = exchange_->Pull();
      if (!s.ok()) return s;
      if (s = EvaluateAndEmit(epoch + 1, /*final=*/false); !s.ok()) return s;
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
