// The all-reduce GradientExchange (MakeAllReduceExchange): buckets reduced
// among the workers while backward goes on, then the averaged gradients
// applied where the parameters live.
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "collective/collective.h"
#include "table/optimizer.h"
#include "table/shard_store.h"
#include "worker/gradient_exchange.h"
#include "worker/loss_scaler.h"
#include "worker/ps_client.h"
#include "worker/tensor_optimizer.h"

namespace pstrain {
namespace {

class AllReduceExchange : public GradientExchange {
 public:
  explicit AllReduceExchange(ExchangeOptions options) : GradientExchange(std::move(options)) {
    collective_ = options_.collective;
    // NCCL reduces device buffers; Gloo (and the CPU) host buffers.
    on_device_ = collective_->backend() == Collective::Backend::kNccl;
    wire_ = options_.wire_dtype;
    if (wire_ == at::kBFloat16 && !on_device_) {
      spdlog::warn("{}: wire_dtype bf16: Gloo in this LibTorch cannot sum bfloat16, so the buckets are reduced in "
                   "float32 (fp16 halves the bytes with Gloo; NCCL reduces bf16)",
                   options_.job);
      wire_ = at::kFloat;
    }
    for (const auto& bucket : buckets_) {
      int64_t numel = 0;
      for (size_t p : bucket) numel += options_.params[p].numel();
      const at::Tensor& first = options_.params[bucket.front()];
      at::Tensor flat = at::empty({numel}, first.options());
      flats_.push_back(on_device_ ? flat : HostBufferFor(flat, options_.device));
      if (narrow() && first.scalar_type() == at::kFloat) {
        wire_flats_.push_back(at::empty({numel}, flats_.back().options().dtype(wire_)));
      } else {
        wire_flats_.push_back(at::Tensor());
      }
    }
    reductions_.resize(buckets_.size());
  }
  bool processes_reduced() const override { return true; }

  absl::Status Broadcast() {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < options_.params.size(); ++i) {
      at::Tensor t = on_device_ || stager_->on_host() ? options_.params[i] : staging_[i].copy_(options_.params[i]);
      absl::Status s = collective_->Broadcast(t, 0)->Wait();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("broadcasting the initial parameters: ", s.message()));
      if (!t.is_same(options_.params[i])) options_.params[i].copy_(t);
    }
    return absl::OkStatus();
  }

  void Offer(size_t i, const at::Tensor& grad) override {
    ready_[i] = grad;
    const size_t b = bucket_of_[i];
    if (--missing_[b] > 0) return;
    int64_t offset = 0;
    for (size_t p : buckets_[b]) {
      const int64_t n = ready_[p].numel();
      at::Tensor part = flats_[b].narrow(0, offset, n);
      if (on_device_ || stager_->on_host()) {
        part.copy_(ready_[p].reshape({-1}));
      } else {
        stager_->Copy(ready_[p].reshape({-1}), part);
      }
      ready_[p] = at::Tensor();
      offset += n;
    }
    // NCCL orders its stream after the compute stream itself; a host buffer
    // is reduced once its copies landed.
    if (on_device_) {
      reductions_[b] = Reduce(b);
    } else {
      stager_->Then([this, b] { reductions_[b] = Reduce(b); });
    }
  }

  // Starts bucket b's reduction: as it is, or averaged then narrowed for the
  // wire (the sum of the narrow means is the mean).
  std::unique_ptr<CollectiveWork> Reduce(size_t b) {
    if (!wire_flats_[b].defined()) return collective_->AllReduce(flats_[b]);
    c10::NoGradGuard no_grad;
    flats_[b].div_(static_cast<double>(collective_->size()));
    wire_flats_[b].copy_(flats_[b]);
    return collective_->AllReduce(wire_flats_[b]);
  }

  absl::Status Finish() override {
    stager_->Drain();
    // What the previous step left for the host to check, first: so a lost
    // peer or a rejected step stops the job before this step changes
    // anything.
    absl::Status first = Settle();
    // Whether the device decides this step's update by itself (a fused
    // optimizer where the averaged gradients lie; fp16's scaler with it,
    // where its scale fits float32).
    LossScaler* scaler = options_.loss_scaler;
    const bool can_decide =
        optimizer_ != nullptr && optimizer_->CanStepUnlessFound() && (on_device_ || stager_->on_host());
    if (scaler != nullptr && !(can_decide && scaler->MoveToDevice(options_.device))) scaler->MoveToHost();
    const bool device_decides = can_decide && (scaler == nullptr || scaler->on_device());
    // NCCL: then the device waits for the reductions and the host goes on,
    // checking them in the next Settle (next step, Pull, Flush). Otherwise
    // the host reads something before the update, and a read behind a
    // reduction that never ends would hang past the collective's timeout:
    // so the host waits for them here.
    const bool defer = on_device_ && device_decides;
    for (auto& r : reductions_) {
      absl::Status st;
      if (r == nullptr) {
        st = absl::InternalError("a bucket was never reduced");
      } else if (defer) {
        st = r->OrderComputeAfter();
        if (st.ok()) unverified_.push_back(std::move(r));
      } else {
        st = r->Wait();
      }
      if (!st.ok() && first.ok()) first = st;
      r.reset();
    }
    if (!first.ok()) return first;
    c10::NoGradGuard no_grad;
    const double size = static_cast<double>(collective_->size());
    for (size_t b = 0; b < flats_.size(); ++b) {
      if (wire_flats_[b].defined()) {
        flats_[b].copy_(wire_flats_[b]);  // widened; already the mean
      } else if (scaler == nullptr) {
        flats_[b].div_(size);
      }
    }
    at::Tensor overflow;  // fp16 on the device: the scaler's verdict there
    if (scaler != nullptr) {
      // The mean and the unscale in one pass (the narrow buckets were
      // averaged before the wire); an overflow skips the step on every rank.
      std::vector<at::Tensor> sums, means;
      for (size_t b = 0; b < flats_.size(); ++b) (wire_flats_[b].defined() ? means : sums).push_back(flats_[b]);
      if (scaler->on_device()) {
        overflow = scaler->UnscaleCheckAndUpdateOnDevice(sums, size, means);
      } else {
        const bool sums_finite = scaler->UnscaleAndCheck(sums, size);
        const bool finite = scaler->UnscaleAndCheck(means) && sums_finite;
        absl::Status s = scaler->Update(finite);
        if (!s.ok() || !finite) return s;
      }
    }
    if (options_.clip_grad_norm > 0) {
      absl::Status s = ClipOnDevice();
      if (!s.ok()) return s;
    }
    return ApplyLocally(device_decides, overflow);
  }

  void Abandon() override {
    stager_->Drain();
    for (auto& r : reductions_) {
      if (r != nullptr) (void)r->Wait();
      r.reset();
    }
    for (auto& r : unverified_) (void)r->Wait();
    unverified_.clear();
    pending_check_ = DeferredScalar();
  }

  ~AllReduceExchange() override {
    // NCCL may still be writing the buffers (reductions only ordered).
    Abandon();
  }

  absl::Status InitTables(const TableConfig& config) override {
    absl::Status s = GradientExchange::InitTables(config);
    if (!s.ok()) return s;
    config_ = config;
    OptimizerConfig optimizer = config.optimizer();
    s = NormalizeOptimizerConfig(&optimizer);
    if (!s.ok()) return s;
    optimizer_ = std::make_unique<TensorOptimizer>(optimizer, options_.params);
    for (size_t i = 0; i < options_.params.size(); ++i) {
      std::vector<at::Tensor> set;
      for (int k = 0; k < optimizer_->slots(); ++k) set.push_back(HostBufferFor(options_.params[i], options_.device));
      host_state_.push_back(std::move(set));
    }
    // A restored table's values and optimizer state (or the initial ones)
    // to the parameters and the device: ExportChunks writes into staging_
    // and host_state_, and the parameters are the table's from here on. (The
    // values once stopped in staging_: every resume trained on from the
    // initial weights with the checkpoint's step and optimizer state.)
    std::vector<ShardStore::ChunkState> chunks = ChunkStates();
    s = options_.local_store->ExportChunks(options_.job, &chunks);
    if (!s.ok()) return s;
    UploadStaging();
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < host_state_.size(); ++i) {
      for (int k = 0; k < optimizer_->slots(); ++k) DeviceStager::Upload(host_state_[i][k], optimizer_->state(i)[k]);
    }
    optimizer_->set_step(chunks.empty() ? 0 : chunks.front().optimizer_step);
    return absl::OkStatus();
  }

  // After InitTables the parameters are the current values: nothing to
  // pull, only what the last step left to check.
  absl::Status Pull(int64_t, int64_t) override { return Settle(); }

  absl::Status Flush(int64_t steps) override {
    if (absl::Status s = Settle(); !s.ok()) return s;
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < options_.params.size(); ++i) {
      staging_[i].copy_(options_.params[i]);
      for (int k = 0; k < optimizer_->slots(); ++k) host_state_[i][k].copy_(optimizer_->state(i)[k]);
    }
    std::vector<ShardStore::ChunkState> chunks = ChunkStates();
    for (auto& c : chunks) c.optimizer_step = optimizer_->step();
    return options_.local_store->ImportChunks(options_.job, chunks, steps - 1);
  }

 private:
  // The plan's chunks as views of staging_ (values) and host_state_.
  std::vector<ShardStore::ChunkState> ChunkStates() {
    std::vector<ShardStore::ChunkState> out;
    for (const ChunkSpec& c : options_.ps->plan().chunks) {
      auto span = [&c](const at::Tensor& t) -> ShardStore::ElementSpan {  // {}: a dtype no table keeps (refused)
        if (t.scalar_type() == at::kFloat) return {t.data_ptr<float>() + c.offset, static_cast<size_t>(c.numel)};
        if (t.scalar_type() == at::kDouble) return {t.data_ptr<double>() + c.offset, static_cast<size_t>(c.numel)};
        return {};
      };
      out.push_back({c.key, span(staging_[c.param]), {}, 0});
      for (const at::Tensor& slot : host_state_[c.param]) out.back().slots.push_back(span(slot));
    }
    return out;
  }

  // What earlier steps left for the host to check: NCCL reductions only
  // ordered on the device (waited for here, within the collective's
  // timeout -- a lost peer fails the job here, its communicator aborted),
  // and a step applied only if its gradients were finite, whose verdict
  // is read here (REJECT fails the job naming that step; nothing of it, or
  // of any later step, was applied).
  absl::Status Settle() {
    if (!settle_error_.ok()) return settle_error_;  // whoever asks next hears it too
    absl::Status first;
    for (auto& r : unverified_) {
      absl::Status st = r->Wait();
      if (!st.ok() && first.ok()) first = st;
    }
    unverified_.clear();
    // fp16 on the device: the verdicts of the steps since (skipped steps, a
    // run of overflows that fails the job).
    if (options_.loss_scaler != nullptr) {
      absl::Status s = options_.loss_scaler->Settle();
      if (!s.ok() && first.ok()) first = s;
    }
    DeferredScalar check = std::move(pending_check_);
    pending_check_ = DeferredScalar();
    if (first.ok() && check.defined() && check.Value() != 0) first = NonFiniteError(pending_step_);
    settle_error_ = first;
    return first;
  }

  absl::Status NonFiniteError(int64_t step) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "the averaged gradients of step ", step,
        " have NaN or Inf; nothing was applied (lower the learning rate, clip gradients, or set the table's nonfinite "
        "policy to SKIP)"));
  }

  // Clips the averaged gradients to clip_grad_norm, computed and applied on
  // their device (the host never waits for the norm). A non-finite norm
  // leaves them non-finite, for the check that follows. The norms in the
  // gradients' dtype, as torch::nn::utils::clip_grad_norm_ (and so a
  // parameter server's worker) computes them: asking for float64 made a
  // float64 copy of each bucket on the CPU first (57 ms for ResNet-18's
  // 11.2M gradients on one core, against 2). A pipeline's stages add their
  // squared norms over the whole group first (the host waits for that one).
  absl::Status ClipOnDevice() {
    at::Tensor sq;
    for (const auto& f : flats_) {
      at::Tensor n = at::linalg_vector_norm(f, 2);
      sq = sq.defined() ? sq.add(n.square()) : n.square();
    }
    if (options_.norm_group != nullptr) {
      at::Tensor total = sq.reshape({1}).to(at::kFloat).contiguous();
      if (absl::Status s = options_.norm_group->AllReduce(total)->Wait(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("the pipeline's gradient norm: ", s.message()));
      }
      sq = total.reshape({}).div(options_.norm_copies).to(sq.scalar_type());
    }
    at::Tensor coef = sq.sqrt().add(1e-6).reciprocal().mul(options_.clip_grad_norm).clamp_max(1.0);
    for (auto& f : flats_) f.mul_(coef.to(f.scalar_type()));
    return absl::OkStatus();
  }

  // 1 (float32, on the gradients' device) where any averaged gradient is
  // NaN or Inf, else 0. Host buffers are scanned where they lie.
  at::Tensor FoundNonFinite() const {
    if (flats_.front().device().is_cpu()) {
      bool finite = true;
      for (const auto& f : flats_) finite = finite && HostAllFinite(f);
      return at::scalar_tensor(finite ? 0.0 : 1.0, at::kFloat);
    }
    at::Tensor all_finite;
    for (const auto& f : flats_) {
      at::Tensor ok = at::isfinite(f).all();
      all_finite = all_finite.defined() ? all_finite.logical_and(ok) : ok;
    }
    return all_finite.logical_not().to(at::kFloat);
  }

  // The averaged gradients update the parameters where they are, with the
  // shards' arithmetic and their policy for NaN and Inf, decided on the
  // device or (otherwise) read by the host first. fp16: the scaler checked
  // them already, on the host, or on the device (`overflow`).
  absl::Status ApplyLocally(bool device_decides, const at::Tensor& overflow) {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> grads(options_.params.size());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      at::Tensor flat = flats_[b];
      if (flat.device() != options_.device) {
        // Gloo reduced a host copy of CUDA gradients: back to the device.
        if (device_flats_.size() <= b) device_flats_.resize(buckets_.size());
        if (!device_flats_[b].defined()) device_flats_[b] = at::empty(flat.sizes(), flat.options().device(options_.device));
        DeviceStager::Upload(flat, device_flats_[b]);
        flat = device_flats_[b];
      }
      int64_t offset = 0;
      for (size_t p : buckets_[b]) {
        const at::Tensor& param = options_.params[p];
        grads[p] = flat.narrow(0, offset, param.numel()).view(param.sizes());
        offset += param.numel();
      }
    }
    if (options_.loss_scaler != nullptr) {
      if (overflow.defined()) {
        optimizer_->StepUnlessFound(grads, lr_, overflow);
      } else {
        optimizer_->Step(grads, lr_);
      }
      return absl::OkStatus();
    }
    at::Tensor found = FoundNonFinite();
    if (device_decides) {
      // Decided on the device: a non-finite step changes nothing, and the
      // host learns it (REJECT) in the next Settle, without waiting now.
      optimizer_->StepUnlessFound(grads, lr_, found);
      if (config_.nonfinite() == NONFINITE_REJECT) {
        pending_check_ = DeferredScalar(found);
        pending_step_ = step_;
      }
      return absl::OkStatus();
    }
    if (found.item<float>() != 0) {
      if (config_.nonfinite() == NONFINITE_REJECT) return settle_error_ = NonFiniteError(step_);
      return absl::OkStatus();  // SKIP: this step changes nothing
    }
    optimizer_->Step(grads, lr_);
    return absl::OkStatus();
  }

  TableConfig config_;
  std::unique_ptr<TensorOptimizer> optimizer_;
  std::vector<std::vector<at::Tensor>> host_state_;  // per parameter: its slots on the host
  std::vector<at::Tensor> device_flats_;              // gloo on a GPU: the reduced buckets, uploaded
  Collective* collective_ = nullptr;
  bool on_device_ = false;
  bool narrow() const { return wire_ != at::kFloat; }

  std::vector<at::Tensor> flats_;       // per bucket: the gradients, float32
  std::vector<at::Tensor> wire_flats_;  // per bucket: the narrow buffer reduced (undefined: flats_ is)
  at::ScalarType wire_ = at::kFloat;
  std::vector<std::unique_ptr<CollectiveWork>> reductions_;
  // NCCL: earlier steps' reductions the device waits for and the host has
  // not checked yet (see Settle).
  std::vector<std::unique_ptr<CollectiveWork>> unverified_;
  // REJECT with a device-decided step: step pending_step_'s verdict.
  DeferredScalar pending_check_;
  int64_t pending_step_ = 0;
  absl::Status settle_error_;  // sticky: a failed Settle fails every later one
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradientExchange>> MakeAllReduceExchange(ExchangeOptions options) {
  if (options.collective == nullptr) return absl::InvalidArgumentError("all-reduce needs a collective");
  if (options.local_store == nullptr) {
    return absl::InvalidArgumentError("all-reduce needs its in-process ShardStore (the checkpoint format)");
  }
  auto exchange = std::make_unique<AllReduceExchange>(std::move(options));
  absl::Status s = exchange->Broadcast();
  if (!s.ok()) return s;
  return std::unique_ptr<GradientExchange>(std::move(exchange));
}

}  // namespace pstrain
