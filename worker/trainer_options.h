// What a training loop is given (TrainerOptions) and what it returns
// (TrainResult): shared by the dense loop (worker/trainer.h), the CTR loop
// (worker/ctr_trainer.h) and the exchange they build
// (worker/exchange_setup.h).
#ifndef PSTRAIN_WORKER_TRAINER_OPTIONS_H_
#define PSTRAIN_WORKER_TRAINER_OPTIONS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/weights_file.h"
#include "proto/events.pb.h"
#include "proto/parameter.pb.h"
#include "table/parameter_store.h"
#include "worker/data_root.h"
#include "worker/loss_scaler.h"

namespace pstrain {

class Activity;
class Collective;
class ShardStore;

// Where the loop stands before an optimizer step (TrainerOptions::
// at_step_boundary).
struct StepBoundary {
  int64_t step = 0;  // the step about to run
  int epoch = 0;
  int64_t epoch_step = 0;
  // Makes the parameter store current (all-reduce applies the optimizer on
  // the worker's device): call it before saving the store.
  std::function<absl::Status()> flush;
  // fp16: the loss scale the step will use (a checkpoint keeps it with the
  // rank's place); empty without loss scaling. A function: where the scale
  // lives on the device, asking reads it.
  std::function<double()> loss_scale;
  // A model with buffers (QAT's quantizers): writes them to `path`
  // (common/weights_file.h's format), answering its size and crc32. Empty
  // for a model without.
  std::function<absl::StatusOr<SaveTableResponse>(const std::string& path)> save_buffers;
};

struct TrainerOptions {
  JobSpec spec;
  int rank = 0;
  int world_size = 1;
  uint64_t attempt = 0;  // the job's attempt (0 standalone): fences its requests
  // Where the model, the batches and the gradient buckets live (see
  // ResolveDevice); the shards and the local store stay on the host.
  c10::Device device = c10::Device(c10::kCPU);
  // Where a torchscript:<path> model is read from (the worker's --data_root).
  DataRoot data_root;
  std::vector<ParameterStore*> shards;  // not owned; shard i of the plan
  // Replicated shards (spec replicas > 0): each shard's host:port, and the
  // coordinator's routings (PsClientOptions::shard_targets, next_routing).
  std::vector<std::string> shard_targets;
  std::function<absl::StatusOr<Routing>(uint64_t generation, absl::Duration wait)> next_routing;
  std::function<ParameterStore*(const std::string& target)> connect_shard;  // PsClientOptions::connect
  // All-reduce mode: the group of workers (not owned), and the in-process
  // store holding the whole model (not owned; the checkpoint format);
  // `shards` is then empty.
  Collective* collective = nullptr;
  ShardStore* local_store = nullptr;
  // All-reduce mode, resuming: loads the checkpoint into the local store
  // (keys: every chunk of the model) before training starts.
  std::function<absl::Status(const std::vector<std::string>& keys)> restore_local;
  // Pipelined jobs (spec.pipeline): the whole job's group, whose
  // point-to-point carries the stages' activations and gradients (not
  // owned); `collective` is then this rank's stage's replicas.
  Collective* pipeline = nullptr;
  // Quantization-aware training in ps mode with several (SYNC) workers: a
  // group of the workers for the observers alone (not owned), so that each
  // activation observer takes every rank's batch range, as in all-reduce
  // mode (which uses `collective`).
  Collective* observer_group = nullptr;
  std::function<void(const WorkerEvent& event)> emit = [](const WorkerEvent&) {};
  // Rank 0 writes <output_dir>/model.pt at the end (whatever the other
  // ranks are told: a pipeline's stages send rank 0 theirs in any case).
  bool write_weights = true;
  // When set and true, training stops at the next step with CANCELLED.
  const std::atomic<bool>* stop = nullptr;
  // Called before every optimizer step; may block (a checkpoint pauses
  // workers here).
  std::function<void(const StepBoundary& at)> at_step_boundary;
  // Called after every optimizer step (metrics): the step just finished, its
  // loss and examples, and its wall time with and without waiting on the
  // shards.
  std::function<void(int64_t step, double loss, int64_t samples, double seconds, double wait_seconds)> on_step;
  // Resuming from a checkpoint: the first step to run and where it is.
  int64_t start_step = 0;
  int start_epoch = 0;
  int64_t start_epoch_step = 0;
  // Resuming an fp16 job: the loss scale the rank had at the checkpoint (0:
  // start from LossScalerOptions::init_scale).
  double start_loss_scale = 0;
  // Resumed from a checkpoint with model buffers (QAT's quantizers): reads
  // them, to be loaded into the model before its first step.
  std::function<absl::StatusOr<NamedTensors>()> restore_buffers;
  // Parameter-server mode: this worker's hold on its rank (carried by its
  // pushes), and, taking over a lost worker's rank while the job runs, the
  // step the rank continues at (-1: not a replacement). Its data continues
  // at the matching place of the rank's slice, counted from start_*.
  uint32_t generation = 0;
  // Assignment.job_secret: the shards serve the job's table only with it.
  std::string job_secret;
  // Assignment.table_grant: the coordinator's leave to make the job's table.
  std::string table_grant;
  int64_t rejoin_step = -1;
  // Told what the loop is doing and of every shard call (the heartbeat
  // reads it; not owned; null: the trainer keeps its own).
  Activity* activity = nullptr;
  // Dynamic loss scaling: on for precision fp16, with these settings where
  // set (GradScaler's defaults where not). Set with another precision it
  // scales too -- what lets the tests drive the scaler where this LibTorch
  // has no fp16 autocast.
  std::optional<LossScalerOptions> loss_scaling;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t samples = 0;
  double seconds = 0;
  double final_accuracy = -1;  // rank 0 only
  double final_test_loss = -1;
  double final_auc = -1;       // model: dlrm, rank 0 with a test_file
  double final_log_loss = -1;  // likewise
  int64_t skipped_steps = 0;  // loss scaling: steps skipped for an overflow
  std::vector<std::pair<std::string, at::Tensor>> parameters;  // final values
  std::vector<std::pair<std::string, at::Tensor>> buffers;     // final values (QAT's quantizers)
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAINER_OPTIONS_H_
