// JobSpec: what to train and how -- the YAML a user writes (see docs/job-spec.md
// for every field and its default). Parsed and validated in
// one place; an unknown field or a bad value is refused with a message that
// names the field, before anything starts.
#ifndef PSTRAIN_COMMON_JOB_SPEC_H_
#define PSTRAIN_COMMON_JOB_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/embedding_spec.h"
#include "common/pipeline_spec.h"
#include "proto/parameter.pb.h"

namespace pstrain {

struct DataSpec {
  std::string format = "idx";  // idx | csv | synthetic | criteo
  // Every file below is named relative to the worker's --data_root (no
  // absolute names, no "." or ".." components): a job reads only what the
  // worker's operator put there.
  // idx: a directory under the data root ("." for the root itself) with the
  // four MNIST-format files (gzip or raw), named relative to it.
  std::string dir = "fashion-mnist";
  std::string train_images = "train-images-idx3-ubyte.gz";
  std::string train_labels = "train-labels-idx1-ubyte.gz";
  std::string test_images = "t10k-images-idx3-ubyte.gz";
  std::string test_labels = "t10k-labels-idx1-ubyte.gz";
  // csv: files with numeric features and an integer label in the last column.
  std::string train_csv;
  std::string test_csv;
  // criteo: Criteo's TSV (label, 13 integer and 26 categorical fields;
  // gzip or plain), as worker/criteo_data.h reads it; named relative to
  // `dir`, as the idx files are. test_file may be empty (no evaluation).
  std::string train_file;
  std::string test_file;
  // The examples train_file holds, when known: workers that must train
  // equal steps (sync, ssp, hybrid) then skip counting them (a pass over
  // the file). 0: counted.
  int64_t train_examples = 0;
  // synthetic: class blobs shaped like 28x28 images (for tests).
  int64_t synthetic_train = 4096;
  int64_t synthetic_test = 1024;
  int64_t num_classes = 10;
  // Normalisation: (x / 255 - mean) / std for idx; (x - mean) / std for csv.
  double mean = 0.2860;
  double std = 0.3530;
  // Use only the first N examples (0: all).
  int64_t limit_train = 0;
  int64_t limit_test = 0;
};

struct LrScheduleSpec {
  std::string kind = "constant";  // constant | step | cosine
  int64_t step_epochs = 1;        // step: multiply by gamma every this many epochs
  double gamma = 0.1;
  double min_lr = 0.0;  // cosine: floor
  // Linear warm-up from lr/warmup_steps to the schedule's lr over the first
  // optimizer steps of each worker (0: none).
  int64_t warmup_steps = 0;
};

// quantization: quantization-aware training (docs/quantization.md). The
// built-in models' Linear and Conv layers train with fake-quantized weights
// and activations (quantize/qat_network.h); fp32 master weights and the
// optimizer stay as they are.
struct QuantizationSpec {
  std::string mode;                     // "" (off) | qat
  std::string weights = "per_channel";  // per_channel | per_tensor
  std::string activations = "per_tensor";
  int64_t start_step = 0;             // fake quantization from this step on
  int64_t freeze_observers_step = 0;  // observers frozen from this step on (0: never)
  int64_t freeze_bn_step = 0;         // accepted; the built-in models have no BatchNorm
  // At the job's end rank 0 also writes model-int8.pt beside model.pt:
  // "" (not), dynamic, or static (a QAT job's learned scales, else
  // calibrated on the first `calibration` training examples).
  std::string export_mode;
  int64_t calibration = 256;
  bool qat() const { return mode == "qat"; }
};

// The spec's enumerated fields; in YAML (and in messages) by their names.
enum class TrainMode { kParameterServer, kAllReduce };  // ps | allreduce
enum class CollectiveBackend { kAuto, kGloo, kNccl };   // auto | gloo | nccl
enum class DeviceChoice { kAuto, kCpu, kCuda };         // auto | cpu | cuda
enum class Precision { kFp32, kBf16, kFp16 };           // fp32 | bf16 | fp16
enum class WireDtype { kFp32, kBf16, kFp16 };           // fp32 | bf16 | fp16
const char* Name(TrainMode mode);
const char* Name(CollectiveBackend backend);
const char* Name(DeviceChoice device);
const char* Name(Precision precision);
const char* Name(WireDtype wire);

struct JobSpec {
  std::string name = "job";
  TrainMode mode = TrainMode::kParameterServer;
  // allreduce: the collective library; auto = nccl when this build has it
  // and the machine a CUDA device, else gloo.
  CollectiveBackend backend = CollectiveBackend::kAuto;
  int collective_timeout_s = 60;  // a collective (or rendezvous) slower than this fails
  // Where a worker trains: auto = cuda:LOCAL_RANK (or the pool worker's
  // --device) when this LibTorch has CUDA and the machine a device, else the
  // CPU; cuda fails where there is none.
  DeviceChoice device = DeviceChoice::kAuto;
  // fp32, or bf16/fp16 autocast for forward and backward (the parameters,
  // the optimizer and what travels stay fp32). fp16 adds dynamic loss
  // scaling (worker/loss_scaler.h): steps that overflow are skipped and
  // counted; it needs CUDA, or LibTorch 2.2+ on the CPU.
  Precision precision = Precision::kFp32;
  // ps mode: the dtype gradients and values travel in. bf16/fp16 halve the
  // bytes; the shards keep fp32 values and optimizer state (widened on
  // arrival), checkpoints and exports stay fp32. With wire_error_feedback,
  // each worker adds what rounding lost from a gradient to its next one
  // (one gradient of memory per worker).
  WireDtype wire_dtype = WireDtype::kFp32;
  bool wire_error_feedback = false;
  bool allreduce() const { return mode == TrainMode::kAllReduce; }
  // mlp | mlp_wide | mlp_deep | lenet | dlrm (with embeddings and data.format criteo) |
  // torchscript:<path>, <path> relative to the worker's --data_root.
  std::string model = "lenet";
  DataSpec data;
  // model dlrm: the embedding tables on the shards and the fields reading them.
  EmbeddingsSpec embeddings;
  QuantizationSpec quantization;
  // Pipeline parallelism: stages, micro-batches, schedule (off by default).
  PipelineSpec pipeline;
  OptimizerConfig optimizer;    // kind SGD, lr 0.05 unless set
  LrScheduleSpec lr_schedule;
  Consistency consistency = ASYNC;
  uint32_t staleness = 0;
  int workers = 1;
  int shards = 1;                 // ps mode; allreduce uses none
  // ps mode: backups of each chunk on other shards (docs/replication.md);
  // a lost shard's chunks are then led by a backup and the job goes on
  // without a restart. 0..shards-1.
  int replicas = 0;
  int epochs = 1;
  int64_t batch_size = 64;      // per worker
  int accumulate_steps = 1;
  double clip_grad_norm = 0;    // 0: off
  uint64_t seed = 42;
  int threads_per_worker = 1;
  // The largest piece of a parameter on one shard, and so the finest piece
  // a push-pull request can carry (see requests_in_flight).
  int64_t chunk_bytes = 1 << 20;
  // ps mode: push-pull requests a worker keeps in flight to each shard (0:
  // no limit); the rest take turns, in order, so the first pieces' values
  // come back while later pieces go out (bench/README.md, commhosts).
  int requests_in_flight = 2;
  // Gradients exchanged together: pushed in one request per shard (ps), or
  // reduced in one all-reduce (allreduce; default 25 MiB as in DDP).
  int64_t bucket_bytes = 4 << 20;
  int64_t max_steps = 0;        // stop each worker after this many steps (0: all epochs)
  std::string output_dir = "out";
  int64_t checkpoint_every_steps = 0;  // 0: only on demand (pstrain checkpoint)
  int checkpoint_keep = 3;             // newest checkpoints kept (and those they are incremental on)
  // With embeddings: after a whole checkpoint, up to this many write only
  // the rows changed since the checkpoint before (0..32; 0: all whole).
  int checkpoint_incremental = 0;
  // After a member is lost or shuts down, the job restarts from its last
  // checkpoint this many times at most (without a checkpoint it fails).
  int max_restarts = 3;
  // ps mode: a lost worker's rank is left empty (the others go on; a free
  // pool worker takes it over when there is one) as long as at least this
  // many workers remain; below it the job waits replacement_timeout_s for a
  // replacement, then restarts from its checkpoint. Default: workers (any
  // loss waits, then restarts); all-reduce always restarts.
  int min_workers = -1;  // -1: workers
  int replacement_timeout_s = 0;
  int log_every_steps = 20;
  // Rank 0 evaluates on the test set after every this many epochs while
  // training (the others go on); 0: only once, at the end.
  int eval_every_epochs = 1;
};

// Parses YAML text. `origin` (a file name) prefixes error messages.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml, const std::string& origin = "job spec");
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

// INVALID_ARGUMENT when a file the workers would read (data.dir and the idx
// files, data.train_csv and data.test_csv, torchscript:<path>; only those
// the data format uses; criteo: data.dir, data.train_file and
// data.test_file) is named in a way that cannot lie under a worker's
// --data_root: absolute, with a "." or ".." component, a NUL or a control
// byte (data.dir may be "." itself). Apart from ParseJobSpec so that the
// specs of jobs stored before this rule still load (their workers refuse
// such names when they read them); submissions are checked with it.
absl::Status CheckDataFileNames(const JobSpec& spec, const std::string& origin = "job spec");

// `yaml` with a top-level `field: value` where it does not set the field
// (re-emitted: comments are dropped); unchanged, *added false, where it
// does. A restore takes the checkpoint's chunk_bytes this way when the spec
// leaves it to the default (which changed from 4 MiB to 1 MiB).
absl::StatusOr<std::string> WithDefaultField(const std::string& yaml, const std::string& field, int64_t value,
                                             bool* added);

// The learning rate for `epoch` (0-based) and this worker's optimizer `step`
// (0-based) under the spec's schedule and warm-up.
double LearningRate(const JobSpec& spec, int epoch, int64_t step = -1);

// The shard table configuration that the spec implies (in allreduce mode:
// the table of each worker's local store).
TableConfig MakeTableConfig(const JobSpec& spec);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_JOB_SPEC_H_
