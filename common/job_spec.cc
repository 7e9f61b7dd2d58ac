#include "common/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/mapping_reader.h"
#include "common/quote.h"

namespace pstrain {
namespace {

#define RETURN_IF_ERROR(expr)        \
  do {                               \
    absl::Status _s = (expr);        \
    if (!_s.ok()) return _s;         \
  } while (0)

}  // namespace

const char* Name(TrainMode mode) { return mode == TrainMode::kAllReduce ? "allreduce" : "ps"; }
const char* Name(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::kGloo: return "gloo";
    case CollectiveBackend::kNccl: return "nccl";
    default: return "auto";
  }
}
const char* Name(DeviceChoice device) {
  switch (device) {
    case DeviceChoice::kCpu: return "cpu";
    case DeviceChoice::kCuda: return "cuda";
    default: return "auto";
  }
}
const char* Name(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : precision == Precision::kFp16 ? "fp16" : "fp32";
}
const char* Name(WireDtype wire) {
  switch (wire) {
    case WireDtype::kBf16: return "bf16";
    case WireDtype::kFp16: return "fp16";
    case WireDtype::kFp32: break;
  }
  return "fp32";
}

namespace {
absl::StatusOr<JobSpec> ParseJobSpecOrThrow(const std::string& yaml, const std::string& origin);
}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& origin) {
  // yaml-cpp throws from places that look harmless (a non-scalar key read
  // as a string, a node of an unexpected kind): none of it leaves here.
  try {
    return ParseJobSpecOrThrow(yaml, origin);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": malformed: ", Quote(e.what(), 200)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": cannot be read: ", Quote(e.what(), 200)));
  }
}

namespace {

absl::Status ReadData(MappingReader& d, DataSpec& ds) {
  RETURN_IF_ERROR(d.Read("format", &ds.format));
  RETURN_IF_ERROR(d.Read("dir", &ds.dir));
  RETURN_IF_ERROR(d.Read("train_images", &ds.train_images));
  RETURN_IF_ERROR(d.Read("train_labels", &ds.train_labels));
  RETURN_IF_ERROR(d.Read("test_images", &ds.test_images));
  RETURN_IF_ERROR(d.Read("test_labels", &ds.test_labels));
  RETURN_IF_ERROR(d.Read("train_csv", &ds.train_csv));
  RETURN_IF_ERROR(d.Read("test_csv", &ds.test_csv));
  RETURN_IF_ERROR(d.Read("train_file", &ds.train_file));
  RETURN_IF_ERROR(d.Read("test_file", &ds.test_file));
  RETURN_IF_ERROR(d.Read("train_examples", &ds.train_examples));
  RETURN_IF_ERROR(d.Read("synthetic_train", &ds.synthetic_train));
  RETURN_IF_ERROR(d.Read("synthetic_test", &ds.synthetic_test));
  RETURN_IF_ERROR(d.Read("num_classes", &ds.num_classes));
  RETURN_IF_ERROR(d.Read("mean", &ds.mean));
  RETURN_IF_ERROR(d.Read("std", &ds.std));
  RETURN_IF_ERROR(d.Read("limit_train", &ds.limit_train));
  RETURN_IF_ERROR(d.Read("limit_test", &ds.limit_test));
  return absl::OkStatus();
}

// The values of a spec whose fields were read: each in its range, and
// consistent with the others.
absl::Status CheckValues(const JobSpec& spec, const MappingReader& r) {
  if (spec.name.empty()) return r.Error("name", "must not be empty");
  if (spec.collective_timeout_s < 1) return r.Error("collective_timeout_s", "must be >= 1");
  // Hybrid (allreduce with embeddings): the shards hold the embedding rows
  // with the job's consistency; the dense part is all-reduced.
  if (spec.allreduce() && spec.embeddings.empty()) {
    if (spec.shards != 0) return r.Error("shards", "must be 0 in allreduce mode (workers reduce among themselves)");
    if (spec.consistency != SYNC) return r.Error("consistency", "must be sync in allreduce mode");
  }
  if (spec.model != "mlp" && spec.model != "mlp_wide" && spec.model != "mlp_deep" && spec.model != "lenet" &&
      spec.model != "dlrm" && spec.model.rfind("torchscript:", 0) != 0) {
    return r.Error("model", absl::StrCat("'", spec.model,
                                         "' is unknown: use mlp, mlp_wide, mlp_deep, lenet, dlrm (with embeddings) or ",
                                         "torchscript:<path to a saved scripted module>"));
  }
  if (spec.model == "torchscript:") return r.Error("model", "torchscript: needs a path");
  const DataSpec& d = spec.data;
  if (d.format != "idx" && d.format != "csv" && d.format != "synthetic" && d.format != "criteo") {
    return r.Error("data.format", "must be idx, csv, synthetic or criteo");
  }
  if (d.format == "csv" && (d.train_csv.empty() || d.test_csv.empty())) {
    return r.Error("data.train_csv", "and data.test_csv are needed for format csv");
  }
  if (d.synthetic_train < 1 || d.synthetic_test < 1) {
    return r.Error("data.synthetic_train", "and synthetic_test must be >= 1");
  }
  if (d.num_classes < 2) return r.Error("data.num_classes", "must be >= 2");
  if (!(d.std > 0)) return r.Error("data.std", "must be > 0");
  if (d.limit_train < 0 || d.limit_test < 0) return r.Error("data.limit_train", "must be >= 0");
  if (d.train_examples < 0) return r.Error("data.train_examples", "must be >= 0 (0: counted by the workers)");
  if (!(spec.optimizer.lr() > 0)) return r.Error("optimizer.lr", "must be > 0");
  const auto& ls = spec.lr_schedule;
  if (ls.kind != "constant" && ls.kind != "step" && ls.kind != "cosine") {
    return r.Error("lr_schedule.kind", "must be constant, step or cosine");
  }
  if (ls.step_epochs < 1) return r.Error("lr_schedule.step_epochs", "must be >= 1");
  if (!(ls.gamma > 0)) return r.Error("lr_schedule.gamma", "must be > 0");
  if (ls.warmup_steps < 0) return r.Error("lr_schedule.warmup_steps", "must be >= 0");
  if (spec.workers < 1 || spec.workers > 1024) return r.Error("workers", "must be in 1..1024");
  if ((!spec.allreduce() || !spec.embeddings.empty()) && (spec.shards < 1 || spec.shards > 1024)) {
    return r.Error("shards", spec.allreduce() ? "must be in 1..1024 in allreduce mode with embeddings (they hold the rows)"
                                              : "must be in 1..1024");
  }
  if (spec.replicas != 0) {
    if (spec.allreduce() && spec.embeddings.empty()) {
      return r.Error("replicas", "is for ps mode, or all-reduce with embeddings (all-reduce workers hold no shards)");
    }
    if (spec.replicas < 0 || spec.replicas >= spec.shards) {
      return r.Error("replicas", absl::StrCat("must be in 0..", spec.shards - 1, " (a chunk's copies are on distinct "
                                              "shards: at most shards - 1 backups)"));
    }
    if (!spec.embeddings.empty() && spec.replicas > 15) {
      return r.Error("replicas", "must be at most 15 with embeddings (a slot's rows on at most 16 shards)");
    }
  }
  if (spec.epochs < 1) return r.Error("epochs", "must be >= 1");
  if (spec.batch_size < 1) return r.Error("batch_size", "must be >= 1");
  if (spec.accumulate_steps < 1) return r.Error("accumulate_steps", "must be >= 1");
  if (spec.clip_grad_norm < 0) return r.Error("clip_grad_norm", "must be >= 0 (0 turns it off)");
  if (spec.threads_per_worker < 1) return r.Error("threads_per_worker", "must be >= 1");
  if (spec.chunk_bytes < 1024) return r.Error("chunk_bytes", "must be >= 1024");
  if (spec.requests_in_flight < 0 || spec.requests_in_flight > 1024) {
    return r.Error("requests_in_flight", "must be in [0, 1024] (0: no limit)");
  }
  if (spec.bucket_bytes < 1) return r.Error("bucket_bytes", "must be >= 1");
  if (spec.max_steps < 0) return r.Error("max_steps", "must be >= 0");
  if (spec.output_dir.empty()) return r.Error("output_dir", "must not be empty");
  if (spec.checkpoint_every_steps < 0) return r.Error("checkpoint_every_steps", "must be >= 0");
  if (spec.checkpoint_keep < 1) return r.Error("checkpoint_keep", "must be >= 1");
  if (spec.checkpoint_incremental < 0 || spec.checkpoint_incremental > 32) {
    return r.Error("checkpoint_incremental", "must be in 0..32 (incremental checkpoints after each whole one)");
  }
  if (spec.checkpoint_incremental > 0 && spec.embeddings.empty()) {
    return r.Error("checkpoint_incremental", "is for jobs with embeddings: (only their rows are written incrementally)");
  }
  if (spec.max_restarts < 0) return r.Error("max_restarts", "must be >= 0");
  if (spec.min_workers < 1 || spec.min_workers > spec.workers) {
    return r.Error("min_workers", "must be in 1..workers");
  }
  if (spec.allreduce() && spec.min_workers != spec.workers) {
    return r.Error("min_workers", "must equal workers in allreduce mode (a collective group cannot shrink: a lost "
                                  "worker restarts the job from its checkpoint)");
  }
  if (spec.replacement_timeout_s < 0 || spec.replacement_timeout_s > 86400) {
    return r.Error("replacement_timeout_s", "must be in 0..86400");
  }
  if (spec.log_every_steps < 1) return r.Error("log_every_steps", "must be >= 1");
  if (spec.eval_every_epochs < 0 || spec.eval_every_epochs > 1000000) {
    return r.Error("eval_every_epochs", "must be in 0..1000000 (0: only at the end)");
  }
  return CheckEmbeddingJob(spec, r);
}

// The job's name and the fields that choose how it trains (mode, backend, device,
// precision, wire dtype), with the defaults the mode implies.
absl::Status ReadModeFields(MappingReader& r, JobSpec& spec) {
  RETURN_IF_ERROR(r.Read("name", &spec.name));
  RETURN_IF_ERROR(r.ReadEnum<TrainMode>(
      "mode", {{"ps", TrainMode::kParameterServer}, {"allreduce", TrainMode::kAllReduce}}, &spec.mode));
  RETURN_IF_ERROR(r.ReadEnum<CollectiveBackend>(
      "backend", {{"gloo", CollectiveBackend::kGloo}, {"nccl", CollectiveBackend::kNccl}, {"auto", CollectiveBackend::kAuto}},
      &spec.backend));
  RETURN_IF_ERROR(r.ReadEnum<DeviceChoice>(
      "device", {{"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda}}, &spec.device));
  RETURN_IF_ERROR(r.ReadEnum<Precision>(
      "precision", {{"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}},
      &spec.precision));
  RETURN_IF_ERROR(r.ReadEnum<WireDtype>(
      "wire_dtype", {{"fp32", WireDtype::kFp32}, {"bf16", WireDtype::kBf16}, {"fp16", WireDtype::kFp16}},
      &spec.wire_dtype));
  RETURN_IF_ERROR(r.Read("wire_error_feedback", &spec.wire_error_feedback));
  if (spec.allreduce() && spec.wire_error_feedback) {
    return r.Error("wire_error_feedback", "is for ps mode: all-reduce buckets are averaged before they are narrowed");
  }
  RETURN_IF_ERROR(r.Read("collective_timeout_s", &spec.collective_timeout_s));
  if (spec.allreduce()) {
    // Defaults of the mode: no shards, DDP's bucket size, synchronous.
    spec.shards = 0;
    spec.bucket_bytes = 25 << 20;
  }
  return absl::OkStatus();
}

// The optimizer mapping's numbers into `optimizer` (its lr the default
// unless given) and its kind, as written, into `kind`.
absl::Status ReadOptimizer(MappingReader& o, OptimizerConfig& optimizer, std::string& kind) {
  double lr = optimizer.lr(), momentum = 0, dampening = 0, wd = 0, beta1 = 0, beta2 = 0, eps = 0, lr_decay = 0,
         init_acc = 0;
  bool nesterov = false;
  RETURN_IF_ERROR(o.Read("kind", &kind));
  RETURN_IF_ERROR(o.Read("lr", &lr));
  RETURN_IF_ERROR(o.Read("momentum", &momentum));
  RETURN_IF_ERROR(o.Read("dampening", &dampening));
  RETURN_IF_ERROR(o.Read("nesterov", &nesterov));
  RETURN_IF_ERROR(o.Read("weight_decay", &wd));
  RETURN_IF_ERROR(o.Read("beta1", &beta1));
  RETURN_IF_ERROR(o.Read("beta2", &beta2));
  RETURN_IF_ERROR(o.Read("eps", &eps));
  RETURN_IF_ERROR(o.Read("lr_decay", &lr_decay));
  RETURN_IF_ERROR(o.Read("initial_accumulator_value", &init_acc));
  optimizer.set_lr(lr);
  optimizer.set_momentum(momentum);
  optimizer.set_dampening(dampening);
  optimizer.set_nesterov(nesterov);
  optimizer.set_weight_decay(wd);
  optimizer.set_beta1(beta1);
  optimizer.set_beta2(beta2);
  optimizer.set_eps(eps);
  optimizer.set_lr_decay(lr_decay);
  optimizer.set_initial_accumulator_value(init_acc);
  return absl::OkStatus();
}

// The optimizer mapping (SGD unless it names another kind).
absl::Status ReadOptimizerField(MappingReader& r, OptimizerConfig& optimizer) {
  std::string kind = "sgd";
  RETURN_IF_ERROR(r.Nested("optimizer", [&](MappingReader& o) { return ReadOptimizer(o, optimizer, kind); }));
  static const std::map<std::string, OptimizerConfig::Kind> kKinds = {
      {"sgd", OptimizerConfig::SGD},
      {"adam", OptimizerConfig::ADAM},
      {"adamw", OptimizerConfig::ADAMW},
      {"adagrad", OptimizerConfig::ADAGRAD}};
  auto k = kKinds.find(kind);
  if (k == kKinds.end()) return r.Error("optimizer.kind", "must be sgd, adam, adamw or adagrad");
  optimizer.set_kind(k->second);
  return absl::OkStatus();
}

absl::Status ReadLrSchedule(MappingReader& l, LrScheduleSpec& schedule) {
  RETURN_IF_ERROR(l.Read("kind", &schedule.kind));
  RETURN_IF_ERROR(l.Read("step_epochs", &schedule.step_epochs));
  RETURN_IF_ERROR(l.Read("gamma", &schedule.gamma));
  RETURN_IF_ERROR(l.Read("min_lr", &schedule.min_lr));
  RETURN_IF_ERROR(l.Read("warmup_steps", &schedule.warmup_steps));
  return absl::OkStatus();
}

absl::Status ReadQuantization(MappingReader& q, QuantizationSpec& spec) {
  RETURN_IF_ERROR(q.Read("mode", &spec.mode));
  RETURN_IF_ERROR(q.Read("weights", &spec.weights));
  RETURN_IF_ERROR(q.Read("activations", &spec.activations));
  RETURN_IF_ERROR(q.Read("start_step", &spec.start_step));
  RETURN_IF_ERROR(q.Read("freeze_observers_step", &spec.freeze_observers_step));
  RETURN_IF_ERROR(q.Read("freeze_bn_step", &spec.freeze_bn_step));
  RETURN_IF_ERROR(q.Read("export", &spec.export_mode));
  RETURN_IF_ERROR(q.Read("calibration", &spec.calibration));
  return absl::OkStatus();
}

absl::Status CheckQuantization(const JobSpec& spec, const MappingReader& r) {
  const QuantizationSpec& q = spec.quantization;
  if (!q.mode.empty() && !q.qat()) {
    return r.Error("quantization.mode", "must be qat (post-training modes are `export: dynamic|static`)");
  }
  if (!q.export_mode.empty() && q.export_mode != "dynamic" && q.export_mode != "static") {
    return r.Error("quantization.export", "must be dynamic or static");
  }
  if (!q.qat() && q.export_mode.empty()) {
    return r.Error("quantization", "needs mode: qat, export: dynamic|static, or both");
  }
  if (q.calibration < 1 || q.calibration > 65536) return r.Error("quantization.calibration", "must be in 1..65536");
  if (q.weights != "per_channel" && q.weights != "per_tensor") {
    return r.Error("quantization.weights", "must be per_channel or per_tensor");
  }
  if (q.activations != "per_tensor") return r.Error("quantization.activations", "must be per_tensor");
  if (q.start_step < 0 || q.freeze_observers_step < 0 || q.freeze_bn_step < 0) {
    return r.Error("quantization.start_step", "and freeze_observers_step, freeze_bn_step must be >= 0");
  }
  if (spec.model != "mlp" && spec.model != "mlp_wide" && spec.model != "lenet") {
    return r.Error("quantization", absl::StrCat("knows the layers of the built-in models mlp, mlp_wide and lenet; "
                                                "model '", spec.model.substr(0, 64), "' cannot be quantized yet"));
  }
  if (!q.qat()) return absl::OkStatus();  // an export alone: any mode, device, precision
  // Several ps workers share their observers over a group of their own,
  // every forward: they must train in step, all of them.
  if (spec.workers != 1 && !spec.allreduce() && (spec.consistency != SYNC || spec.min_workers != spec.workers)) {
    return r.Error("quantization", "runs several ps workers only with consistency: sync and min_workers equal to "
                                   "workers (their observers are synchronised every step); use workers: 1, or "
                                   "mode: allreduce");
  }
  if (spec.device == DeviceChoice::kCuda) return r.Error("quantization", "runs on the CPU for now (device: cpu)");
  if (spec.precision != Precision::kFp32) return r.Error("quantization", "trains in fp32 (precision: fp32)");
  return absl::OkStatus();
}

// The fields that size and pace the run: consistency's staleness, the
// cluster, batches, transfers, checkpoints, elasticity and logging.
absl::Status ReadRunFields(MappingReader& r, JobSpec& spec) {
  RETURN_IF_ERROR(r.Read("staleness", &spec.staleness));
  RETURN_IF_ERROR(r.Read("workers", &spec.workers));
  RETURN_IF_ERROR(r.Read("shards", &spec.shards));
  RETURN_IF_ERROR(r.Read("replicas", &spec.replicas));
  RETURN_IF_ERROR(r.Read("epochs", &spec.epochs));
  RETURN_IF_ERROR(r.Read("batch_size", &spec.batch_size));
  RETURN_IF_ERROR(r.Read("accumulate_steps", &spec.accumulate_steps));
  RETURN_IF_ERROR(r.Read("clip_grad_norm", &spec.clip_grad_norm));
  RETURN_IF_ERROR(r.Read("seed", &spec.seed));
  RETURN_IF_ERROR(r.Read("threads_per_worker", &spec.threads_per_worker));
  RETURN_IF_ERROR(r.Read("chunk_bytes", &spec.chunk_bytes));
  RETURN_IF_ERROR(r.Read("requests_in_flight", &spec.requests_in_flight));
  RETURN_IF_ERROR(r.Read("bucket_bytes", &spec.bucket_bytes));
  RETURN_IF_ERROR(r.Read("max_steps", &spec.max_steps));
  RETURN_IF_ERROR(r.Read("output_dir", &spec.output_dir));
  RETURN_IF_ERROR(r.Read("checkpoint_every_steps", &spec.checkpoint_every_steps));
  RETURN_IF_ERROR(r.Read("checkpoint_keep", &spec.checkpoint_keep));
  RETURN_IF_ERROR(r.Read("checkpoint_incremental", &spec.checkpoint_incremental));
  RETURN_IF_ERROR(r.Read("max_restarts", &spec.max_restarts));
  RETURN_IF_ERROR(r.Read("min_workers", &spec.min_workers));
  RETURN_IF_ERROR(r.Read("replacement_timeout_s", &spec.replacement_timeout_s));
  RETURN_IF_ERROR(r.Read("log_every_steps", &spec.log_every_steps));
  RETURN_IF_ERROR(r.Read("eval_every_epochs", &spec.eval_every_epochs));
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpecOrThrow(const std::string& yaml, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid YAML: ", e.what()));
  }
  JobSpec spec;
  spec.optimizer.set_kind(OptimizerConfig::SGD);
  spec.optimizer.set_lr(0.05);
  MappingReader r(root, "", origin);
  if (!root.IsMap()) return r.Error("the top level", "must be a mapping of fields");

  RETURN_IF_ERROR(ReadModeFields(r, spec));
  RETURN_IF_ERROR(r.Read("model", &spec.model));
  RETURN_IF_ERROR(r.Nested("data", [&](MappingReader& d) { return ReadData(d, spec.data); }));
  RETURN_IF_ERROR(ReadOptimizerField(r, spec.optimizer));
  RETURN_IF_ERROR(r.Nested("lr_schedule", [&](MappingReader& l) { return ReadLrSchedule(l, spec.lr_schedule); }));
  std::string consistency = spec.allreduce() ? "sync" : "async";
  RETURN_IF_ERROR(r.Read("consistency", &consistency));
  RETURN_IF_ERROR(ReadRunFields(r, spec));
  RETURN_IF_ERROR(ReadEmbeddingsSpec(r, spec.seed, &spec.embeddings));  // after seed: a table's default
  bool quantization = false;
  RETURN_IF_ERROR(r.Nested("quantization", [&](MappingReader& q) {
    quantization = true;
    return ReadQuantization(q, spec.quantization);
  }));
  RETURN_IF_ERROR(ReadPipelineSpec(r, &spec.pipeline));
  RETURN_IF_ERROR(r.Check());

  if (consistency == "async") {
    spec.consistency = ASYNC;
  } else if (consistency == "sync") {
    spec.consistency = SYNC;
  } else if (consistency == "ssp") {
    spec.consistency = SSP;
  } else {
    return r.Error("consistency", "must be async, sync or ssp");
  }
  if (spec.min_workers == -1) spec.min_workers = spec.workers;
  RETURN_IF_ERROR(CheckValues(spec, r));
  if (quantization) RETURN_IF_ERROR(CheckQuantization(spec, r));
  RETURN_IF_ERROR(CheckPipelineJob(spec, r));
  if (spec.pipeline.enabled()) spec.device = DeviceChoice::kCpu;  // auto: the stages run on the CPU for now
  return spec;
}

}  // namespace

absl::StatusOr<std::string> WithDefaultField(const std::string& yaml, const std::string& field, int64_t value,
                                             bool* added) {
  *added = false;
  try {
    YAML::Node root = yaml.empty() ? YAML::Node(YAML::NodeType::Map) : YAML::Load(yaml);
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) return absl::InvalidArgumentError("job spec: the top level must be a mapping of fields");
    if (root[field]) return yaml;
    root[field] = value;
    YAML::Emitter out;
    out << root;
    if (!out.good()) return absl::InvalidArgumentError(absl::StrCat("job spec: ", out.GetLastError()));
    *added = true;
    return std::string(out.c_str()) + "\n";
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

absl::Status CheckDataFileNames(const JobSpec& spec, const std::string& origin) {
  auto relative = [&origin](const char* field, const std::string& name) {
    absl::Status s = CheckRelativeName(name, "the worker's --data_root (the directory that holds the jobs' data)");
    if (s.ok()) return s;
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", field, " (", s.message(), ")"));
  };
  if (spec.model.rfind("torchscript:", 0) == 0) RETURN_IF_ERROR(relative("model", spec.model.substr(12)));
  const DataSpec& d = spec.data;
  if (d.format == "csv") {
    RETURN_IF_ERROR(relative("data.train_csv", d.train_csv));
    RETURN_IF_ERROR(relative("data.test_csv", d.test_csv));
  }
  if (d.format == "criteo") {
    if (d.dir != ".") RETURN_IF_ERROR(relative("data.dir", d.dir));
    RETURN_IF_ERROR(relative("data.train_file", d.train_file));
    if (!d.test_file.empty()) RETURN_IF_ERROR(relative("data.test_file", d.test_file));
  }
  if (d.format == "idx") {
    if (d.dir != ".") RETURN_IF_ERROR(relative("data.dir", d.dir));
    RETURN_IF_ERROR(relative("data.train_images", d.train_images));
    RETURN_IF_ERROR(relative("data.train_labels", d.train_labels));
    RETURN_IF_ERROR(relative("data.test_images", d.test_images));
    RETURN_IF_ERROR(relative("data.test_labels", d.test_labels));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("cannot read job spec ", path));
  return ParseJobSpec(*text, path);
}

double LearningRate(const JobSpec& spec, int epoch, int64_t step) {
  const double base = spec.optimizer.lr();
  const LrScheduleSpec& s = spec.lr_schedule;
  double lr = base;
  if (s.kind == "step") {
    lr = base * std::pow(s.gamma, epoch / s.step_epochs);
  } else if (s.kind == "cosine") {
    const double t = spec.epochs <= 1 ? 0.0 : static_cast<double>(epoch) / spec.epochs;
    lr = s.min_lr + 0.5 * (base - s.min_lr) * (1 + std::cos(M_PI * t));
  }
  if (s.warmup_steps > 0 && step >= 0 && step < s.warmup_steps) {
    lr *= static_cast<double>(step + 1) / s.warmup_steps;
  }
  return lr;
}

TableConfig MakeTableConfig(const JobSpec& spec) {
  TableConfig c;
  *c.mutable_optimizer() = spec.optimizer;
  c.set_consistency(spec.consistency);
  c.set_num_workers(static_cast<uint32_t>(spec.workers));
  if (spec.allreduce()) {
    // Each worker's local store: one worker's SYNC table of the averaged
    // gradients.
    c.set_consistency(SYNC);
    c.set_num_workers(1);
  } else if (spec.pipeline.stages > 1) {
    c.set_pipeline_stages(static_cast<uint32_t>(spec.pipeline.stages));
  }
  c.set_staleness(spec.staleness);
  return c;
}

}  // namespace pstrain
