// The parameter-server GradientExchange (MakePsExchange): buckets pushed
// to the shards as backward completes them, their new values pulled back in
// the same round trip.
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "common/fan_out.h"
#include "worker/gradient_exchange.h"
#include "worker/ps_client.h"

namespace pstrain {
namespace {

class PsExchange : public GradientExchange {
 public:
  explicit PsExchange(ExchangeOptions options) : GradientExchange(std::move(options)) {
    const auto& params = options_.params;
    const at::ScalarType wire = options_.wire_dtype;
    const bool narrow = options_.narrow_on_device && (wire == at::kBFloat16 || wire == at::kHalf);
    narrow_.resize(buckets_.size());
    narrowed_param_.assign(params.size(), false);
    wire_views_.resize(params.size());
    host_wire_views_.resize(params.size());
    value_views_.resize(params.size());
    host_value_views_.resize(params.size());
    residual_views_.resize(params.size());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const at::Tensor& first = params[buckets_[b].front()];
      NarrowBucket& nb = narrow_[b];
      if (!narrow || first.scalar_type() != at::kFloat) continue;
      int64_t numel = 0;
      for (size_t p : buckets_[b]) numel += params[p].numel();
      // One flat buffer per bucket and side: one copy each way per bucket.
      nb.wire = at::empty({numel}, first.options().dtype(wire));
      nb.host_wire = stager_->on_host() ? nb.wire : HostBufferFor(nb.wire, options_.device);
      nb.host_values = HostBufferFor(nb.wire, options_.device);
      nb.values = stager_->on_host() ? nb.host_values : at::empty({numel}, nb.wire.options());
      if (options_.error_feedback) nb.residual = at::zeros({numel}, first.options());
      int64_t offset = 0;
      for (size_t p : buckets_[b]) {
        auto view = [&](const at::Tensor& flat) { return flat.narrow(0, offset, params[p].numel()).view(params[p].sizes()); };
        wire_views_[p] = view(nb.wire);
        host_wire_views_[p] = view(nb.host_wire);
        value_views_[p] = view(nb.values);
        host_value_views_[p] = view(nb.host_values);
        if (nb.residual.defined()) residual_views_[p] = view(nb.residual);
        narrowed_param_[p] = true;
        offset += params[p].numel();
      }
    }
    if (!stager_->on_host()) {
      for (size_t p = 0; p < params.size(); ++p) {
        host_grads_.push_back(narrowed_param_[p] ? at::Tensor() : HostBufferFor(params[p], options_.device));
      }
    }
    held_.resize(buckets_.size());
  }
  bool processes_reduced() const override { return false; }
  bool narrows_on_device() const override {
    return std::find(narrowed_param_.begin(), narrowed_param_.end(), true) != narrowed_param_.end();
  }
  std::vector<uint32_t> VacantRanks() const override { return options_.ps->vacant_ranks(); }
  void SetStepBatches(uint32_t extra_batches, bool empty) override {
    options_.ps->SetStepBatches(extra_batches, empty);
  }

  void Offer(size_t i, const at::Tensor& grad) override {
    const size_t b = bucket_of_[i];
    if (narrowed_param_[i]) {
      // Narrowed where it lies: at once, or (error feedback) with the
      // bucket, in a few multi-tensor kernels.
      if (narrow_[b].residual.defined()) {
        ready_[i] = grad;
      } else {
        c10::NoGradGuard no_grad;
        wire_views_[i].copy_(grad);
      }
    } else {
      ready_[i] = stager_->on_host() ? grad.contiguous() : stager_->Copy(grad, host_grads_[i]);
    }
    if (--missing_[b] > 0) return;
    if (narrow_[b].wire.defined()) {
      Narrow(b);
      for (size_t p : buckets_[b]) held_[b].push_back(host_wire_views_[p]);
    } else {
      for (size_t p : buckets_[b]) held_[b].push_back(ready_[p]);
    }
    // Buckets go out in one order on every worker, bucket 0 (backward's
    // first) first: a shard's requests take turns (requests_in_flight), and
    // under SYNC a request is answered only once every worker sent it, so
    // a worker offering after backward (covering, clipping, fp16) and one
    // whose hooks offer during it must not queue them differently. With
    // hooks, buckets complete in this order already.
    for (; next_ < buckets_.size() && !held_[next_].empty(); ++next_) {
      // On an accelerator the push starts when the bucket's copies landed,
      // from the stager's thread; backward goes on meanwhile.
      stager_->Then([this, b = next_, grads = std::move(held_[next_])]() mutable { PushPull(b, std::move(grads)); });
      held_[next_].clear();
    }
  }

  absl::Status Finish() override {
    stager_->Drain();
    absl::Status s = pushes_.Wait();
    if (s.ok()) {
      UploadStaging(&narrowed_param_);
      UploadNarrowValues();
    }
    Reset();
    return s;
  }

  void Abandon() override {
    stager_->Drain();
    (void)pushes_.Wait();
    Reset();
  }

 private:
  // A float32 bucket narrowed on the parameters' device (narrow_on_device),
  // flat: the gradients as they go on the wire and the values as they come
  // back, on the device and in (pinned) host memory -- the same tensors on
  // the CPU -- and, with error feedback, what rounding lost last time.
  struct NarrowBucket {
    at::Tensor wire, host_wire;
    at::Tensor values, host_values;
    at::Tensor residual;
  };

  // Bucket b's gradients into its wire buffer (error feedback: through its
  // residual, as NarrowElements does on the host: want = grad + residual,
  // sent = want rounded, residual = want - sent, none where sent is not
  // finite), then the wire buffer to the host on the copy stream.
  void Narrow(size_t b) {
    NarrowBucket& nb = narrow_[b];
    if (nb.residual.defined()) {
      c10::NoGradGuard no_grad;
      std::vector<at::Tensor> residuals, grads;
      for (size_t p : buckets_[b]) {
        residuals.push_back(residual_views_[p]);
        grads.push_back(ready_[p]);
        ready_[p] = at::Tensor();
      }
      at::_foreach_add_(residuals, grads);
      nb.wire.copy_(nb.residual);
      nb.residual.sub_(nb.wire);
      // Not finite exactly where what is sent is not (Inf, NaN, or a value
      // beyond the narrow format's range): no residual there.
      nb.residual.nan_to_num_(0.0, 0.0, 0.0);
    }
    stager_->Copy(nb.wire, nb.host_wire);
  }

  // The narrow buckets' pulled values to the device and widened into the
  // parameters, on the compute stream.
  void UploadNarrowValues() {
    c10::NoGradGuard no_grad;
    for (NarrowBucket& nb : narrow_) {
      if (nb.values.defined() && !nb.values.is_same(nb.host_values)) DeviceStager::Upload(nb.host_values, nb.values);
    }
    for (size_t p = 0; p < options_.params.size(); ++p) {
      if (narrowed_param_[p]) options_.params[p].copy_(value_views_[p]);
    }
  }

  // Starts the PushPull of bucket b: grads[k] (host) of its parameters, the
  // new values into staging_ (or, narrowed on the device, the bucket's
  // narrow host values).
  void PushPull(size_t b, std::vector<at::Tensor> grads) {
    std::vector<at::Tensor> intos;
    for (size_t p : buckets_[b]) intos.push_back(narrowed_param_[p] ? host_value_views_[p] : staging_[p]);
    pushes_.Add();
    options_.ps->PushPullAsync(step_, buckets_[b], grads, intos, lr_,
                               [this](absl::Status s) { pushes_.Done(s); });
  }

  // The next step starts with bucket 0 and nothing held.
  void Reset() {
    next_ = 0;
    for (auto& h : held_) h.clear();
  }

  FanOut pushes_;  // this step's PushPulls
  std::vector<at::Tensor> host_grads_;  // accelerator: pinned copies of the gradients not narrowed there
  std::vector<std::vector<at::Tensor>> held_;  // per bucket: complete, waiting for its turn
  size_t next_ = 0;                            // the bucket whose push goes out next
  std::vector<NarrowBucket> narrow_;           // per bucket (empty tensors: not narrowed on the device)
  std::vector<bool> narrowed_param_;           // per parameter: in a bucket narrowed on the device
  // Per parameter narrowed on the device: its views of its bucket's buffers.
  std::vector<at::Tensor> wire_views_, host_wire_views_, value_views_, host_value_views_, residual_views_;
};

}  // namespace

std::unique_ptr<GradientExchange> MakePsExchange(ExchangeOptions options) {
  return std::make_unique<PsExchange>(std::move(options));
}

}  // namespace pstrain
