// GradientExchange: how one worker's gradients become the next values of
// its parameters, behind one interface so the training loop has no mode
// branches.
//
//  - Parameter server (MakePsExchange): a bucket of gradients is pushed to
//    the shards holding its chunks as soon as autograd completed it, and the
//    shards answer with the bucket's new values (PushPull).
//  - All-reduce (MakeAllReduceExchange): a complete bucket is packed into
//    one flat buffer and reduced among the workers while backward goes on;
//    after backward the averaged (and clipped) gradients update the
//    parameters where they live, with the shards' optimizer arithmetic
//    (TensorOptimizer); an in-process ShardStore holding the whole model
//    keeps checkpoints in the shards' file format (Flush).
//
// Devices: the parameters may live on an accelerator. The shards are on the
// host: gradients go to pinned host buffers on a copy stream (DeviceStager),
// ordered after the compute stream by an event, and the new values come back
// with non_blocking copies on the compute stream, so nothing synchronises
// the whole device. NCCL reduces device buffers in place; Gloo reduces host
// copies (it reduces CUDA tensors only through host staging anyway). With
// NCCL the host never waits for a step: the compute stream waits for the
// reductions, clipping and the NaN/Inf check run on the device (and, with
// fused SGD, decide there whether the update applies), and the host checks
// the reductions and the verdict one step later (Finish, Pull, Flush).
//
// Buckets follow backward's order (the parameters reversed), up to
// bucket_bytes each, one dtype per bucket.
//
// Files: gradient_exchange.cc holds what both modes share (the buckets,
// staging, InitTables, Pull); ps_exchange.cc and allreduce_exchange.cc one
// mode each.
#ifndef PSTRAIN_WORKER_GRADIENT_EXCHANGE_H_
#define PSTRAIN_WORKER_GRADIENT_EXCHANGE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "table/parameter_store.h"
#include "worker/device.h"

namespace pstrain {

class Collective;
class LossScaler;
class PsClient;
class ShardStore;

struct ExchangeOptions {
  PsClient* ps = nullptr;          // not owned: the shards, or the local store (all-reduce)
  std::vector<at::Tensor> params;  // the model's parameters (detached), on `device`
  c10::Device device = c10::Device(c10::kCPU);
  int64_t bucket_bytes = 25 << 20;
  // All-reduce: the group (not owned), and the norm the averaged gradients
  // are clipped to (0: off).
  Collective* collective = nullptr;
  double clip_grad_norm = 0;
  // A pipelined job (not owned): the whole group, whose ranks hold the
  // model's stages, each stage `norm_copies` times (its replicas). The
  // norm clip_grad_norm bounds is then the whole model's: the stages'
  // squared norms summed over this group (and divided by the copies).
  Collective* norm_group = nullptr;
  int norm_copies = 1;
  // The job's wire_dtype: at::kFloat, or kHalf/kBFloat16.
  // All-reduce: the dtype buckets are reduced in -- each bucket divided by
  // the group size, narrowed, summed, widened, as DDP's fp16_compress_hook
  // does. Where the backend cannot sum the dtype (Gloo in LibTorch 1.13 has
  // no bfloat16), buckets stay float32 and a warning says so.
  // Parameter server, with narrow_on_device: the float32 buckets' gradients
  // are narrowed (with error_feedback: what rounding lost is added to the
  // next step's, as the PsClient does on the host) where the parameters
  // live, and their pulled values widened there, so the host copies half
  // the bytes and converts none. The trainer sets it on an accelerator;
  // otherwise the PsClient narrows and widens on the host, request by
  // request. Both give the same bits.
  at::ScalarType wire_dtype = at::kFloat;
  bool narrow_on_device = false;
  bool error_feedback = false;
  // All-reduce: the in-process store holding the whole model (not owned).
  // The exchange applies the optimizer itself, where the parameters live
  // (TensorOptimizer); the store is the checkpoint format and the source of
  // a restore, brought up to date by Flush.
  ShardStore* local_store = nullptr;
  // All-reduce, precision fp16: the trainer's scaler (not owned). The
  // reduced gradients are unscaled and checked here -- every rank holds the
  // same, so every rank skips the same steps -- and the scale updated.
  LossScaler* loss_scaler = nullptr;
  std::string job;
};

class GradientExchange {
 public:
  virtual ~GradientExchange();

  // Creates the tables from the parameters' values (every worker offers the
  // same seeded values), then loads the tables' values into the parameters.
  virtual absl::Status InitTables(const TableConfig& config);
  // The tables' values into the parameters, once every chunk reached
  // `min_version` updates (or, ASYNC/SSP, every active rank pushed
  // `min_worker_steps` steps).
  virtual absl::Status Pull(int64_t min_version = 0, int64_t min_worker_steps = 0);
  // Makes the tables current with the parameters after `steps` steps (an
  // exchange that applies the optimizer itself; the others' tables always
  // are). Called before a checkpoint is written.
  virtual absl::Status Flush(int64_t steps) { return absl::OkStatus(); }

  // Whether the exchange clips (and, fp16, unscales and checks) the reduced
  // gradients itself (all-reduce); otherwise the caller does, before
  // offering.
  virtual bool processes_reduced() const = 0;
  // Before a step's first backward.
  void BeginStep(int64_t step, double lr);
  // Parameter server under SYNC: the ranks the shards had vacant when the
  // step of the values last pulled completed -- whose batches the active
  // workers cover in the next step -- and what this step's pushes carry
  // (PushRequest.extra_batches, .empty). Nothing for all-reduce.
  virtual std::vector<uint32_t> VacantRanks() const { return {}; }
  virtual void SetStepBatches(uint32_t extra_batches, bool empty) {}
  // Parameter i's gradient for this step is complete: hooks call this during
  // backward; whatever they did not offer is offered after it.
  virtual void Offer(size_t i, const at::Tensor& grad) = 0;
  // Every parameter was offered: waits for the exchange and writes the new
  // values into the parameters (asynchronously on the compute stream).
  virtual absl::Status Finish() = 0;
  // After a failed step: waits for whatever is in flight (it uses this
  // step's buffers). Idempotent.
  virtual void Abandon();
  // Whether gradients are narrowed for the wire before they leave the
  // parameters' device (see ExchangeOptions::narrow_on_device).
  virtual bool narrows_on_device() const { return false; }

 protected:
  explicit GradientExchange(ExchangeOptions options);
  // staging_ into the parameters, asynchronously on the compute stream
  // (all of them, or those `skip` leaves).
  void UploadStaging(const std::vector<bool>* skip = nullptr);

  const ExchangeOptions options_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> missing_;       // per bucket: gradients not yet offered this step
  std::vector<at::Tensor> staging_;   // host (pinned on an accelerator): pulled values
  std::vector<at::Tensor> ready_;     // per parameter: this step's offered gradient
  std::unique_ptr<DeviceStager> stager_;
  int64_t step_ = 0;
  double lr_ = 0;
};

std::unique_ptr<GradientExchange> MakePsExchange(ExchangeOptions options);
// Broadcasts rank 0's parameter values to every rank first (as DDP does).
absl::StatusOr<std::unique_ptr<GradientExchange>> MakeAllReduceExchange(ExchangeOptions options);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_GRADIENT_EXCHANGE_H_
