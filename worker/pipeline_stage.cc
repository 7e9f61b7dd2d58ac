#include "worker/pipeline_stage.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <deque>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

int64_t ActivationTag(int m) { return 2 * static_cast<int64_t>(m); }
int64_t GradientTag(int m) { return 2 * static_cast<int64_t>(m) + 1; }

}  // namespace

struct InProcessStageLinks::Box {
  std::map<std::tuple<int, int, int64_t>, std::deque<at::Tensor>> queues;
};

class InProcessStageLinks::Link : public StageLink {
 public:
  Link(InProcessStageLinks* all, int stage) : all_(all), stage_(stage) {}
  absl::Status Send(int to_stage, int64_t tag, const at::Tensor& tensor) override {
    absl::MutexLock lock(&all_->mu_);
    // A copy, as a wire would make: the receiver's autograd graph starts at
    // its own leaf.
    all_->box_->queues[{stage_, to_stage, tag}].push_back(tensor.detach().clone());
    return absl::OkStatus();
  }
  absl::StatusOr<at::Tensor> Recv(int from_stage, int64_t tag) override {
    absl::MutexLock lock(&all_->mu_);
    auto& q = all_->box_->queues[{from_stage, stage_, tag}];
    auto ready = [&q]() { return !q.empty(); };
    if (!all_->mu_.AwaitWithTimeout(absl::Condition(&ready), all_->timeout_)) {
      return absl::DeadlineExceededError(absl::StrCat("stage ", stage_, " waited ",
                                                      absl::FormatDuration(all_->timeout_), " for stage ",
                                                      from_stage, "'s message ", tag));
    }
    at::Tensor t = std::move(q.front());
    q.pop_front();
    return t;
  }

 private:
  InProcessStageLinks* all_;
  const int stage_;
};

InProcessStageLinks::InProcessStageLinks(int stages, absl::Duration timeout)
    : box_(std::make_unique<Box>()), timeout_(timeout) {
  for (int s = 0; s < stages; ++s) links_.push_back(std::make_unique<Link>(this, s));
}

InProcessStageLinks::~InProcessStageLinks() = default;

StageLink* InProcessStageLinks::link(int stage) { return links_[stage].get(); }

namespace {

constexpr int kMaxDims = 8;
constexpr int kHeaderLongs = 2 + kMaxDims;  // dtype, dims, sizes

}  // namespace

CollectiveStageLink::~CollectiveStageLink() { Flush().IgnoreError(); }

absl::StatusOr<int> CollectiveStageLink::RankOf(int stage) const {
  if (stage < 0 || stage >= static_cast<int>(stage_ranks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no stage ", stage, " of ", stage_ranks_.size()));
  }
  return stage_ranks_[stage];
}

absl::Status CollectiveStageLink::Send(int to_stage, int64_t tag, const at::Tensor& tensor) {
  auto rank = RankOf(to_stage);
  if (!rank.ok()) return rank.status();
  if (tensor.dim() > kMaxDims || tag < 0 || tag > (1 << 29)) {
    return absl::InvalidArgumentError(absl::StrCat("a stage message of ", tensor.dim(), " dims, tag ", tag));
  }
  at::Tensor header = at::zeros({kHeaderLongs}, at::kLong);
  int64_t* h = header.data_ptr<int64_t>();
  h[0] = static_cast<int64_t>(tensor.scalar_type());
  h[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) h[2 + d] = tensor.size(d);
  at::Tensor payload = tensor.detach().contiguous();
  const int t = static_cast<int>(tag);
  pending_.emplace_back(group_->Send(header, *rank, 2 * t), header);
  pending_.emplace_back(group_->Send(payload, *rank, 2 * t + 1), payload);
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> CollectiveStageLink::Recv(int from_stage, int64_t tag) {
  auto rank = RankOf(from_stage);
  if (!rank.ok()) return rank.status();
  const int t = static_cast<int>(tag);
  at::Tensor header = at::zeros({kHeaderLongs}, at::kLong);
  absl::Status s = group_->Recv(header, *rank, 2 * t)->Wait();
  if (!s.ok()) return s;
  const int64_t* h = header.data_ptr<int64_t>();
  const auto dtype = static_cast<at::ScalarType>(h[0]);
  const bool known = h[0] >= 0 && h[0] < static_cast<int64_t>(at::ScalarType::NumOptions) &&
                     (at::isFloatingType(dtype) || dtype == at::kLong || dtype == at::kByte);
  if (h[1] < 0 || h[1] > kMaxDims || !known) {
    return absl::DataLossError(absl::StrCat("stage ", from_stage, " sent a header of ", h[1], " dims, dtype ", h[0]));
  }
  std::vector<int64_t> sizes(h + 2, h + 2 + h[1]);
  // Bytes, counted without overflow: each factor is checked against what
  // is left of the bound.
  int64_t bytes = static_cast<int64_t>(at::elementSize(dtype));
  for (int64_t d : sizes) {
    if (d < 0) return absl::DataLossError(absl::StrCat("stage ", from_stage, " sent a negative size"));
    if (d > 0 && bytes > max_bytes_ / d) {
      return absl::DataLossError(absl::StrCat("stage ", from_stage, " announced a tensor of more than ", max_bytes_,
                                              " bytes"));
    }
    bytes *= d;
  }
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(dtype));
  s = group_->Recv(out, *rank, 2 * t + 1)->Wait();
  if (!s.ok()) return s;
  return out;
}

absl::Status CollectiveStageLink::Flush() {
  absl::Status first;
  for (auto& [work, tensor] : pending_) {
    absl::Status s = work->Wait();
    if (!s.ok() && first.ok()) first = s;
  }
  pending_.clear();
  return first;
}

PipelineStage::PipelineStage(PipelineStageOptions options, StageLink* link)
    : options_(std::move(options)), link_(link) {}

absl::Status PipelineStage::Forward(int m, const std::vector<at::Tensor>& inputs,
                                    const std::vector<at::Tensor>& targets, double weight) {
  const int s = options_.stage;
  const bool first = s == 0, last = s == options_.stages - 1;
  at::Tensor x;
  if (first) {
    x = inputs[m];
  } else {
    auto got = link_->Recv(s - 1, ActivationTag(m));
    if (!got.ok()) return got.status();
    x = got->requires_grad_(true);
  }
  at::Tensor y = options_.forward(x);
  if (last) {
    at::Tensor l = options_.loss(y, targets[m]);
    loss_ += l.item<double>() * weight;
    y = l.mul(weight);  // this micro-batch's share of the batch's mean loss
  } else {
    absl::Status sent = link_->Send(s + 1, ActivationTag(m), y);
    if (!sent.ok()) return sent;
  }
  in_[m] = x;
  out_[m] = y;
  peak_ = std::max(peak_, ++held_);
  return absl::OkStatus();
}

absl::Status PipelineStage::Backward(int m) {
  const int s = options_.stage;
  if (!out_[m].defined()) return absl::FailedPreconditionError(absl::StrCat("backward ", m, " before its forward"));
  if (s == options_.stages - 1) {
    out_[m].backward();
  } else {
    auto grad = link_->Recv(s + 1, GradientTag(m));
    if (!grad.ok()) return grad.status();
    out_[m].backward(*grad);
  }
  if (s > 0) {
    absl::Status sent = link_->Send(s - 1, GradientTag(m), in_[m].grad());
    if (!sent.ok()) return sent;
  }
  in_[m] = at::Tensor();
  out_[m] = at::Tensor();
  --held_;
  return absl::OkStatus();
}

absl::StatusOr<double> PipelineStage::Step(const std::vector<int64_t>& sizes, const std::vector<at::Tensor>& inputs,
                                           const std::vector<at::Tensor>& targets, double scale) {
  const int micro = static_cast<int>(sizes.size());
  const int s = options_.stage;
  if ((s == 0 && static_cast<int>(inputs.size()) != micro) ||
      (s == options_.stages - 1 && static_cast<int>(targets.size()) != micro)) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": ", micro, " micro-batches but ", inputs.size(),
                                                   " inputs and ", targets.size(), " targets"));
  }
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 1) return absl::InvalidArgumentError("every micro-batch holds at least one example");
    total += n;
  }
  auto actions = StageActions(options_.schedule, options_.stages, s, micro);
  if (!actions.ok()) return actions.status();
  in_.assign(micro, at::Tensor());
  out_.assign(micro, at::Tensor());
  loss_ = 0;
  held_ = peak_ = 0;
  try {
    for (const PipelineAction& a : *actions) {
      const double weight = scale * static_cast<double>(sizes[a.micro_batch]) / static_cast<double>(total);
      absl::Status st = a.kind == PipelineAction::kForward ? Forward(a.micro_batch, inputs, targets, weight)
                                                           : Backward(a.micro_batch);
      if (!st.ok()) return st;
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": ", e.what_without_backtrace()));
  }
  absl::Status flushed = link_->Flush();
  if (!flushed.ok()) return flushed;
  return s == options_.stages - 1 ? loss_ : 0.0;
}

}  // namespace pstrain
