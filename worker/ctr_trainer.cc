#include "worker/ctr_trainer.h"

#include <ATen/ops/sigmoid.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/weights_file.h"
#include "spdlog/spdlog.h"
#include "worker/activity.h"
#include "worker/binary_metrics.h"
#include "worker/criteo_data.h"
#include "worker/ctr_batches.h"
#include "worker/ctr_clip.h"
#include "worker/data_root.h"
#include "worker/device.h"
#include "worker/ctr_model.h"
#include "worker/dlrm_model.h"
#include "worker/exchange_setup.h"
#include "worker/progress_window.h"
#include "worker/sampler.h"
#include "worker/trainer_events.h"

namespace pstrain {
namespace {

using Clock = ProgressWindow::Clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A copy of `v` as a float32 tensor of `shape` (the batch is reused).
at::Tensor FromVector(const std::vector<float>& v, at::IntArrayRef shape) {
  return at::from_blob(const_cast<float*>(v.data()), shape, at::kFloat).clone();
}

// What this loop does not do yet, as INVALID_ARGUMENT.
absl::Status CheckSupported(const TrainerOptions& options, const EmbeddingRows* rows) {
  const JobSpec& spec = options.spec;
  auto refuse = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("a job with embeddings: ", what, " is not supported yet"));
  };
  if (spec.allreduce() != (options.collective != nullptr)) {
    return absl::InvalidArgumentError("a job with embeddings: mode allreduce needs the workers' collective, and only it does");
  }
  // ps: a lost rank may stay vacant (SYNC: the others cover its batches),
  // and a spare take it over.
  const bool elastic = !spec.allreduce();
  if (!elastic && spec.min_workers >= 0 && spec.min_workers < spec.workers) {
    return refuse("min_workers below workers in all-reduce mode");
  }
  if (spec.precision == Precision::kFp16 || options.loss_scaling.has_value()) return refuse("loss scaling (fp16)");
  if (spec.clip_grad_norm > 0 && spec.allreduce()) return refuse("clip_grad_norm in mode allreduce (hybrid)");
  if (!elastic && options.rejoin_step >= 0) {
    return refuse("taking over a lost worker's rank mid-run (rejoin) in all-reduce mode");
  }
  if (spec.data.format != "criteo" || spec.data.train_file.empty()) {
    return absl::InvalidArgumentError("a job with embeddings reads data of format criteo with a train_file");
  }
  const EmbeddingsSpec& e = spec.embeddings;
  if (e.tables.empty() || e.fields.empty()) {
    return absl::InvalidArgumentError("a CTR job needs embeddings: tables and the fields reading them");
  }
  if (rows == nullptr || rows->num_tables() != e.tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the embedding rows hold ",
                                                   rows == nullptr ? 0 : rows->num_tables(), " tables, the spec ",
                                                   e.tables.size()));
  }
  for (size_t i = 0; i < e.tables.size(); ++i) {
    const EmbeddingTableConfig& t = e.tables[i];
    if (rows->dim(i) != static_cast<int>(t.dim())) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table ", t.name(), " has dim ", t.dim(),
                                                     " in the spec, ", rows->dim(i), " in the rows"));
    }
  }
  return absl::OkStatus();
}

// One run of the CTR loop; RunCtrTrainer's state, its phases as methods.
class CtrTrainer {
 public:
  CtrTrainer(const TrainerOptions& options, EmbeddingRows* rows)
      : options_(options),
        spec_(options.spec),
        rows_(rows),
        activity_(options.activity != nullptr ? *options.activity : own_activity_) {}

  absl::StatusOr<TrainResult> Run();

 private:
  // The model, the embeddings and the exchange, its tables initialised.
  absl::Status Build();
  // `name` (a spec's file) opened under the data root, read as rank/world.
  absl::StatusOr<std::unique_ptr<CriteoReader>> Open(const std::string& name, int rank, int world) const;
  // SYNC, SSP and all-reduce need every rank to train the same number of
  // steps: each trains the first examples_per_epoch_ examples of its share
  // (the file's examples over the ranks, rounded down), counted once (or
  // as data.train_examples declares them). ASYNC ranks train their whole
  // share (examples_per_epoch_ = -1).
  absl::Status CountExamples();
  // One optimizer step over the step's batches (each of accumulate_steps
  // micro-batches, fewer at the end of an epoch; SYNC ps: this rank's and
  // the vacant ranks' it covers): each micro-batch's loss, weighted by its
  // share of its batch's examples, goes through backward, so that the
  // gradients are the sum of the batches' means; the dense ones add up in
  // place and the rows' in SparseEmbeddings::Stash; one exchange, which
  // says how many batches it sums (none: an empty arrival).
  absl::Status Step(int epoch, const CtrStep& batches);
  // A spare taking over a lost rank (rejoin_step: ASYNC and SSP, the step
  // after the last one the shards applied for it; SYNC, the step in flight):
  // the epoch and the batch of the rank's share it continues at, its
  // share's batches counted.
  absl::Status PlaceRejoin(int64_t batch_size, int* epoch, int64_t* epoch_step);
  // Before step step_, the epoch_step'th of `epoch`: a checkpoint may pause
  // the rank here (TrainerOptions::at_step_boundary).
  void AtStepBoundary(int epoch, int64_t epoch_step);
  void EmitProgress(int epoch);
  // Rank 0: AUC and log loss of the test file with the final values.
  absl::Status Evaluate();
  // Final values, evaluation, weights, the done event.
  absl::Status Finish(int epochs_run);

  const TrainerOptions& options_;
  const JobSpec& spec_;
  EmbeddingRows* rows_;
  Activity own_activity_;
  Activity& activity_;
  std::unique_ptr<CtrModel> model_;
  std::unique_ptr<SparseEmbeddings> embeddings_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<at::Tensor> params_;
  std::vector<ParameterSpec> specs_;
  ExchangeSet exchange_;
  int64_t step_ = 0;
  int64_t examples_per_epoch_ = -1;
  TrainResult result_;
  Clock::time_point start_;
  std::unique_ptr<ProgressWindow> progress_;
};

absl::Status CtrTrainer::Build() {
  CtrModelConfig config;
  config.model = spec_.model;
  for (const EmbeddingFieldSpec& f : spec_.embeddings.fields) config.field_dims.push_back(rows_->dim(f.table));
  config.seed = spec_.seed;
  config.root = options_.data_root;
  auto model = CreateCtrModel(config);
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  model_->SetTraining(true);
  named_ = model_->NamedParameters();
  for (const auto& [name, p] : named_) {
    params_.push_back(p);
    specs_.push_back({name, std::vector<int64_t>(p.sizes().begin(), p.sizes().end()), DT_FLOAT32});
  }
  std::vector<SparseFieldConfig> fields;
  for (const EmbeddingFieldSpec& f : spec_.embeddings.fields) {
    fields.push_back({f.table, f.pooling == PoolingSpec::kMean ? EmbeddingPooling::kMean : EmbeddingPooling::kSum});
  }
  auto embeddings = SparseEmbeddings::Create(rows_, std::move(fields));
  if (!embeddings.ok()) return embeddings.status();
  embeddings_ = std::move(*embeddings);
  auto set = MakeExchange(options_, params_, specs_, &activity_, /*scaler=*/nullptr);
  if (!set.ok()) return set.status();
  exchange_ = std::move(*set);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CriteoReader>> CtrTrainer::Open(const std::string& name, int rank, int world) const {
  if (options_.data_root.dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("data file ", name, ": ", kDataRootName, " is not set"));
  }
  auto root = CanonicalRoot(options_.data_root.dir);
  if (!root.ok()) return root.status();
  // In data.dir ("." the root itself), as the idx files are.
  const std::string& dir = spec_.data.dir;
  auto path = ResolveUnderRoot(*root, dir == "." ? name : dir + "/" + name, kDataRootName);
  if (!path.ok()) return path.status();
  CriteoReaderOptions ro;
  ro.rank = rank;
  ro.world = world;
  ro.no_follow = true;  // ResolveUnderRoot leaves the last component to the open
  return CriteoReader::Open(*path, ro);
}

absl::Status CtrTrainer::CountExamples() {
  if (spec_.consistency == ASYNC && !spec_.allreduce()) return absl::OkStatus();
  absl::StatusOr<int64_t> examples = spec_.data.train_examples;
  if (*examples == 0) {
    activity_.Enter(WorkerActivity::DATA, step_);
    auto reader = Open(spec_.data.train_file, 0, 1);
    if (!reader.ok()) return reader.status();
    examples = (*reader)->CountRemainingExamples();
    if (!examples.ok()) return examples.status();
  }
  examples_per_epoch_ = *examples / options_.world_size;
  if (examples_per_epoch_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat("train file ", spec_.data.train_file, " holds ", *examples,
                                                      " examples, fewer than the job's ", options_.world_size,
                                                      " workers"));
  }
  return absl::OkStatus();
}

absl::Status CtrTrainer::Step(int epoch, const CtrStep& batches) {
  const auto step_start = Clock::now();
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
  const double lr = LearningRate(spec_, epoch, step_);
  GradientExchange& exchange = *exchange_.exchange;
  exchange.BeginStep(step_, lr);
  auto fail = [&](const absl::Status& s) {
    exchange.Abandon();
    return absl::Status(s.code(), absl::StrCat("step ", step_, ": ", s.message()));
  };
  const size_t trained = batches.batches.size(), n = batches.micro;
  const int64_t examples = batches.examples();
  at::Tensor loss;  // the sum of the batches' mean losses
  // clip_grad_norm (ctr_clip.h) of a step that covers vacant ranks: each
  // batch clipped apart, its dense gradients summed here. Reported: this
  // rank's own batch's norm.
  const bool clip_apart = spec_.clip_grad_norm > 0 && trained > 1;
  std::vector<at::Tensor> clipped;
  double grad_norm = -1;
  if (clip_apart && n > 1) {  // the spec refuses it: ClipBatchApart takes one Forward a batch
    return fail(absl::InvalidArgumentError("clip_grad_norm with accumulate_steps while covering a vacant rank"));
  }
  try {
    for (const std::vector<CriteoBatch>& micro : batches.batches) {
      int64_t in_batch = 0;
      for (size_t j = 0; j < n; ++j) in_batch += micro[j].size();
      for (size_t j = 0; j < n; ++j) {
        const CriteoBatch& batch = micro[j];
        activity_.Enter(WorkerActivity::SHARDS, step_);  // the embedding rows' lookup
        std::vector<at::Tensor> pooled;
        absl::Status s = embeddings_->Forward(step_, batch, &pooled);
        if (!s.ok()) return fail(s);
        activity_.Enter(WorkerActivity::COMPUTE, step_);
        auto logits = model_->Forward(FromVector(batch.dense, {batch.size(), kCriteoDenseFields}), pooled);
        if (!logits.ok()) return fail(logits.status());
        auto l = DlrmLoss(*logits, FromVector(batch.labels, {batch.size()}));
        if (!l.ok()) return fail(l.status());
        at::Tensor weighted = n == 1 ? *l : l->mul(static_cast<double>(batch.size()) / in_batch);
        weighted.backward();
        loss = loss.defined() ? loss.add(weighted.detach()) : weighted.detach();
        if (!clip_apart && n * trained > 1 && !(s = embeddings_->Stash()).ok()) return fail(s);
      }
      if (clip_apart) {
        auto norm = ClipBatchApart(spec_.clip_grad_norm, params_, &clipped, embeddings_.get());
        if (!norm.ok()) return fail(norm.status());
        if (grad_norm < 0) grad_norm = *norm;
      }
    }
  } catch (const c10::Error& e) {
    return fail(absl::InternalError(e.what_without_backtrace()));
  }
  double rows_scale = 1.0;
  try {
    for (size_t i = 0; i < clipped.size(); ++i) {
      if (clipped[i].defined()) params_[i].mutable_grad() = clipped[i];
    }
    if (spec_.clip_grad_norm > 0 && trained == 1) {
      grad_norm = ClipStepGradients(spec_.clip_grad_norm, params_, *embeddings_, &rows_scale);
    }
  } catch (const c10::Error& e) {
    return fail(absl::InternalError(e.what_without_backtrace()));
  }
  const auto compute_end = Clock::now();
  // Every parameter, zeros where backward left none (the shards expect
  // every chunk). SYNC ps: the batches the gradients sum.
  const bool empty = trained == 0;
  const uint32_t extra = empty ? 0 : static_cast<uint32_t>(trained - 1);
  exchange.SetStepBatches(extra, empty);
  rows_->SetStepBatches(extra, empty);
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor g = params_[i].grad();
    exchange.Offer(i, g.defined() ? g : at::zeros_like(params_[i]));
  }
  activity_.Enter(WorkerActivity::SHARDS, step_);
  absl::Status s = exchange.Finish();
  if (s.ok() && !empty) s = embeddings_->Backward(step_, rows_scale);
  if (s.ok() && empty) {  // an arrival with no batch: the shards count it
    s = rows_->Update(step_, std::vector<std::vector<int64_t>>(rows_->num_tables()),
                      std::vector<const float*>(rows_->num_tables(), nullptr));
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("step ", step_, ": ", s.message()));
  const auto now = Clock::now();
  if (trained > 1) loss = loss / static_cast<double>(trained);
  progress_->Add({step_ + 1, loss.defined() ? DeferredScalar(loss) : DeferredScalar(), examples,
                  Seconds(step_start, now), Seconds(compute_end, now), /*data_seconds=*/0, lr, grad_norm});
  ++step_;
  result_.samples += examples;
  return absl::OkStatus();
}

absl::Status CtrTrainer::PlaceRejoin(int64_t batch_size, int* epoch, int64_t* epoch_step) {
  // SSP ranks train examples_per_epoch_ each (counted); ASYNC ranks their
  // whole share, counted here.
  absl::StatusOr<int64_t> examples = examples_per_epoch_;
  if (*examples < 0) {
    activity_.Enter(WorkerActivity::DATA, step_);
    auto reader = Open(spec_.data.train_file, options_.rank, options_.world_size);
    if (!reader.ok()) return reader.status();
    examples = (*reader)->CountRemainingExamples();
    if (!examples.ok()) return examples.status();
  }
  const int64_t per_epoch = (*examples + batch_size - 1) / batch_size;
  if (per_epoch == 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", options_.rank, "'s share of train file ",
                                                      spec_.data.train_file, " is empty: nothing to continue"));
  }
  step_ = options_.rejoin_step;
  *epoch = static_cast<int>(std::min<int64_t>(step_ / per_epoch, spec_.epochs));
  *epoch_step = step_ - static_cast<int64_t>(*epoch) * per_epoch;
  spdlog::info("rank {}: taking over at step {}: epoch {}, batch {} of {}", options_.rank, step_, *epoch,
               *epoch_step, per_epoch);
  return absl::OkStatus();
}

void CtrTrainer::AtStepBoundary(int epoch, int64_t epoch_step) {
  if (!options_.at_step_boundary) return;
  StepBoundary at;
  at.step = step_;
  at.epoch = epoch;
  at.epoch_step = epoch_step;
  at.flush = [this, step = step_] { return exchange_.exchange->Flush(step); };
  options_.at_step_boundary(at);
}

void CtrTrainer::EmitProgress(int epoch) {
  const auto now = Clock::now();
  // steps: max_steps, 0 when unknown (the file is streamed, not counted).
  options_.emit(progress_->Event(options_.rank, epoch, spec_.epochs, step_, spec_.max_steps,
                                 activity_.TakeShardWindow(), now, Seconds(start_, now)));
}

absl::Status CtrTrainer::Evaluate() {
  activity_.Enter(WorkerActivity::EVALUATING, step_);
  auto reader = Open(spec_.data.test_file, 0, 1);
  if (!reader.ok()) return reader.status();
  std::vector<float> scores, labels;
  CriteoBatch batch;
  c10::NoGradGuard no_grad;
  model_->SetTraining(false);
  try {
    while (true) {
      absl::Status s = (*reader)->ReadBatch(std::max<int64_t>(spec_.batch_size, 1024), &batch);
      if (!s.ok()) return s;
      if (batch.size() == 0) break;
      std::vector<at::Tensor> pooled;
      s = embeddings_->Evaluate(step_, batch, &pooled);
      if (!s.ok()) return s;
      auto logits = model_->Forward(FromVector(batch.dense, {batch.size(), kCriteoDenseFields}), pooled);
      if (!logits.ok()) return logits.status();
      const at::Tensor p = at::sigmoid(*logits).contiguous();
      scores.insert(scores.end(), p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
      labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("evaluating: ", e.what_without_backtrace()));
  }
  auto auc = Auc(scores, labels);
  if (!auc.ok()) return auc.status();
  auto log_loss = LogLoss(scores, labels);
  if (!log_loss.ok()) return log_loss.status();
  int64_t right = 0;
  for (size_t i = 0; i < scores.size(); ++i) right += (scores[i] >= 0.5f) == (labels[i] > 0.5f);
  result_.final_auc = *auc;
  result_.final_log_loss = *log_loss;
  result_.final_test_loss = *log_loss;
  result_.final_accuracy = static_cast<double>(right) / static_cast<double>(scores.size());
  WorkerEvent e = EvalEvent(options_.rank, spec_.epochs, {*log_loss, result_.final_accuracy}, /*final=*/true);
  e.mutable_eval()->set_auc(*auc);
  e.mutable_eval()->set_log_loss(*log_loss);
  options_.emit(e);
  return absl::OkStatus();
}

absl::Status CtrTrainer::Finish(int epochs_run) {
  activity_.Enter(WorkerActivity::FINISHING, step_);
  result_.steps = step_;
  result_.seconds = Seconds(start_, Clock::now());
  // Final values. Under SYNC the version is the step. Otherwise wait for
  // every rank's last steps: all ran step_ steps where examples were
  // counted; else a rank's share of the file may be one example longer than
  // another's, so its step count per epoch one higher, and the others ran
  // at least step_ - epochs_run steps.
  const int64_t others = examples_per_epoch_ >= 0 ? step_ : std::max<int64_t>(0, step_ - epochs_run);
  absl::Status s = spec_.consistency == SYNC ? exchange_.exchange->Pull(step_) : exchange_.exchange->Pull(0, others);
  if (!s.ok()) return s;
  if (options_.rank == 0 && !spec_.data.test_file.empty()) {
    s = Evaluate();
    if (!s.ok()) return s;
  }
  if (options_.rank == 0 && options_.write_weights) {
    std::filesystem::create_directories(spec_.output_dir);
    const std::string path = spec_.output_dir + "/model.pt";
    s = SaveWeights(named_, path);
    if (!s.ok()) return s;
    options_.emit(WeightsEvent(options_.rank, path));
  }
  for (auto& [name, t] : named_) result_.parameters.emplace_back(name, t.detach().clone());
  options_.emit(DoneEvent(options_.rank, result_.steps, result_.samples, result_.seconds, /*skipped_steps=*/0));
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> CtrTrainer::Run() {
  absl::Status s = CheckSupported(options_, rows_);
  if (s.ok()) s = CountExamples();
  if (s.ok()) s = Build();
  if (!s.ok()) return s;
  if (options_.rank == 0) options_.emit(PlanEvent(options_.rank, spec_.chunk_bytes, specs_));
  start_ = Clock::now();
  progress_ = std::make_unique<ProgressWindow>(options_.on_step, start_);
  const int64_t max_steps = spec_.max_steps > 0 ? spec_.max_steps : INT64_MAX;
  const int64_t batch_size = std::max<int64_t>(spec_.batch_size, 1);
  const int accumulate = std::max(1, spec_.accumulate_steps);
  // Resuming: at the checkpoint's place (step, epoch, batches into it);
  // a spare: at the lost rank's.
  int epoch = options_.start_epoch, start_epoch = options_.start_epoch;
  int64_t start_epoch_step = options_.start_epoch_step;
  step_ = options_.start_step;
  // SYNC ps: the batches of vacant ranks are covered by the others, read in
  // windows of the file (every rank's reads aligned).
  const bool windows = spec_.consistency == SYNC && !spec_.allreduce();
  if (options_.rejoin_step >= 0) {
    s = PlaceRejoin(batch_size * accumulate, &start_epoch, &start_epoch_step);
    if (!s.ok()) return s;
    epoch = start_epoch;
  }
  if (windows && options_.rejoin_step > 0) {
    // The dense shards' step placed this spare, and the rows' shards may be
    // one behind, their step before it waiting for this rank (made active
    // while its batch was covered): an empty arrival for it (a retry where
    // that step is done).
    rows_->SetStepBatches(0, /*empty=*/true);
    s = rows_->Update(options_.rejoin_step - 1, std::vector<std::vector<int64_t>>(rows_->num_tables()),
                      std::vector<const float*>(rows_->num_tables(), nullptr));
    if (!s.ok()) return s;
  }
  CtrStep batches;
  auto cancelled = [this] { return options_.stop != nullptr && options_.stop->load(); };
  for (; epoch < spec_.epochs && step_ < max_steps; ++epoch) {
    auto file = Open(spec_.data.train_file, options_.rank, options_.world_size);
    if (!file.ok()) return file.status();
    // {rank, world, batch_size, accumulate, examples_per_epoch, windows, file, declared}
    const CtrBatchOptions bo{options_.rank, options_.world_size, batch_size, accumulate, examples_per_epoch_,
                             windows, spec_.data.train_file, spec_.data.train_examples > 0};
    CtrBatchReader reader(*std::move(file), bo);
    int64_t epoch_step = epoch == start_epoch ? start_epoch_step : 0;
    activity_.Enter(WorkerActivity::DATA, step_);
    if (s = reader.Skip(epoch_step, options_.stop); !s.ok()) return s;
    while (step_ < max_steps) {
      if (cancelled()) return absl::CancelledError(absl::StrCat("job cancelled at step ", step_));
      activity_.Enter(WorkerActivity::DATA, step_);
      StepBatches assigned;
      if (windows) assigned = AssignBatches(exchange_.exchange->VacantRanks(), options_.rank, options_.world_size);
      absl::StatusOr<bool> more = reader.Next(assigned, &batches);
      if (!more.ok()) return more.status();
      if (!*more) break;
      AtStepBoundary(epoch, epoch_step++);
      if (cancelled()) return absl::CancelledError(absl::StrCat("job cancelled at step ", step_));
      s = Step(epoch, batches);
      if (!s.ok()) return s;
      const bool log_now = step_ % spec_.log_every_steps == 0 || step_ == max_steps;
      progress_->ReadLosses(/*all=*/log_now);
      if (log_now) EmitProgress(epoch);
    }
  }
  progress_->ReadLosses(/*all=*/true);
  s = Finish(epoch);
  if (!s.ok()) return s;
  return std::move(result_);
}

}  // namespace

absl::StatusOr<TrainResult> RunCtrTrainer(const TrainerOptions& options, EmbeddingRows* rows) {
  return CtrTrainer(options, rows).Run();
}

}  // namespace pstrain
