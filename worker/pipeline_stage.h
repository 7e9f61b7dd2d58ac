// One stage of a pipeline-parallel step (issue 35; pipeline/schedule.h has
// the schedules): runs the stage's forwards and backwards of a step's
// micro-batches in its schedule's order, receiving activations from the
// previous stage and sending its outputs to the next, and the activations'
// gradients the other way, through a StageLink. The gradients of the
// stage's parameters accumulate in their .grad() over the micro-batches,
// each micro-batch's loss weighted by its share of the batch, so a step's
// gradients equal the non-pipelined step's (up to reassociation).
//
// Messages carry their dtype and shape (the last micro-batch of an epoch
// may be smaller), tagged by micro-batch and direction.
#ifndef PSTRAIN_WORKER_PIPELINE_STAGE_H_
#define PSTRAIN_WORKER_PIPELINE_STAGE_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collective/collective.h"
#include "pipeline/schedule.h"

namespace pstrain {

// Point-to-point between stages. Send does not wait for the receiver;
// Recv waits (bounded by the link's deadline: DEADLINE_EXCEEDED, so a lost
// neighbour fails the step instead of hanging it).
class StageLink {
 public:
  virtual ~StageLink() = default;
  virtual absl::Status Send(int to_stage, int64_t tag, const at::Tensor& tensor) = 0;
  virtual absl::StatusOr<at::Tensor> Recv(int from_stage, int64_t tag) = 0;
  // Waits until every message sent has left (the end of a step).
  virtual absl::Status Flush() { return absl::OkStatus(); }
};

// Stages as ranks of a Collective's point-to-point (Gloo): stage s is rank
// stage_ranks[s]. A message is a header (dtype, rank, dims; int64) and then
// the tensor, so its shape may change from one micro-batch to the next. A
// header is checked before anything is allocated: a dtype a stage sends
// (floating, int64, uint8), at most 8 dims, at most max_bytes in all;
// otherwise DATA_LOSS.
// Sends are asynchronous (c10d's isend); Flush waits for them. Not
// thread-safe: one stage's thread uses it.
class CollectiveStageLink : public StageLink {
 public:
  static constexpr int64_t kDefaultMaxBytes = int64_t{1} << 30;
  CollectiveStageLink(Collective* group, std::vector<int> stage_ranks, int64_t max_bytes = kDefaultMaxBytes)
      : group_(group), stage_ranks_(std::move(stage_ranks)), max_bytes_(max_bytes) {}
  ~CollectiveStageLink() override;
  absl::Status Send(int to_stage, int64_t tag, const at::Tensor& tensor) override;
  absl::StatusOr<at::Tensor> Recv(int from_stage, int64_t tag) override;
  absl::Status Flush() override;

 private:
  absl::StatusOr<int> RankOf(int stage) const;
  Collective* group_;
  const std::vector<int> stage_ranks_;
  const int64_t max_bytes_;
  // Sends in flight, with the tensors they read.
  std::vector<std::pair<std::unique_ptr<CollectiveWork>, at::Tensor>> pending_;
};

// Every stage of a pipeline in one process (tests, one-machine runs):
// messages queue in memory. Thread-safe.
class InProcessStageLinks {
 public:
  InProcessStageLinks(int stages, absl::Duration timeout);
  ~InProcessStageLinks();
  // Stage s's view (owned here).
  StageLink* link(int stage);

 private:
  class Link;
  struct Key;
  friend class Link;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Link>> links_;
  // (from, to, tag) -> tensor, as the sender left it.
  struct Box;
  std::unique_ptr<Box> box_;
  const absl::Duration timeout_;
};

struct PipelineStageOptions {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int stages = 1;
  int stage = 0;
  // The stage's part of the model: activations in, activations out.
  std::function<at::Tensor(const at::Tensor&)> forward;
  // Last stage: the mean loss of one micro-batch's outputs against its
  // targets (a scalar).
  std::function<at::Tensor(const at::Tensor& outputs, const at::Tensor& targets)> loss;
};

// Not thread-safe: one step at a time. The link must outlive it.
class PipelineStage {
 public:
  PipelineStage(PipelineStageOptions options, StageLink* link);

  // One step of `micro` micro-batches whose sizes are `sizes` (examples;
  // they weight each micro-batch's loss). Stage 0 reads inputs[m], the last
  // stage targets[m]; others leave them empty. Returns the step's loss on
  // the last stage (the batch's mean, times `scale`, as its gradients are:
  // accumulated batches), 0 elsewhere. INVALID_ARGUMENT for inputs that do
  // not match; a link's error as it is.
  absl::StatusOr<double> Step(const std::vector<int64_t>& sizes, const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& targets, double scale = 1.0);

  // The most micro-batches whose activations this stage held at once in
  // the last step.
  int peak_activations() const { return peak_; }

 private:
  absl::Status Forward(int m, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                       double weight);
  absl::Status Backward(int m);

  const PipelineStageOptions options_;
  StageLink* link_;
  // Per micro-batch in flight: the input (requires grad past stage 0) and
  // the output (or the weighted loss on the last stage).
  std::vector<at::Tensor> in_, out_;
  double loss_ = 0;
  int held_ = 0, peak_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PIPELINE_STAGE_H_
