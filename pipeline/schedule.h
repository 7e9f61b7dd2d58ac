// Pipeline schedules (issue 35): in which order each stage of a pipeline
// runs the forward and backward passes of a step's micro-batches. A pure
// function of (schedule, stages, stage, micro-batches), so every stage
// computes its own list and the lists agree.
//
// Stage s's forward of micro-batch m needs stage s-1's forward of m (its
// activation arrives over point-to-point); its backward of m needs its own
// forward of m and stage s+1's backward of m (the activation's gradient).
// Sends never block (they are buffered, as c10d's isend is); receives do.
//
//   GPipe  every forward, then every backward (in reverse order, as
//          autograd would): a stage holds the activations of all M
//          micro-batches at once.
//   1F1B   PipeDream-Flush (Narayanan et al. 2021): stage s runs
//          min(P-1-s, M) warm-up forwards, then alternates one forward and
//          one backward, then drains its backwards: it holds at most
//          min(P-s, M) micro-batches' activations.
//
// Both leave the same bubble, (P-1)/(M+P-1) of a step when forward and
// backward times are even across stages; SimulatePipeline computes it for
// any times, and checks that a set of lists can run without a deadlock.
#ifndef PSTRAIN_PIPELINE_SCHEDULE_H_
#define PSTRAIN_PIPELINE_SCHEDULE_H_

#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

enum class PipelineSchedule { kGPipe, k1F1B };

struct PipelineAction {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int micro_batch = 0;
  bool operator==(const PipelineAction& o) const { return kind == o.kind && micro_batch == o.micro_batch; }
};

// Bounds (hostile specs): a pipeline has at most this many stages and
// micro-batches per step.
inline constexpr int kMaxPipelineStages = 1024;
inline constexpr int kMaxMicroBatches = 65536;

// Stage `stage`'s actions for one step: each micro-batch's forward and
// backward once. INVALID_ARGUMENT for stages, stage or micro_batches out of
// range.
absl::StatusOr<std::vector<PipelineAction>> StageActions(PipelineSchedule schedule, int stages, int stage,
                                                         int micro_batches);

// A step run with per-stage action lists (actions[s] is stage s's), each
// forward taking forward_time[s] and each backward backward_time[s], sends
// free. FAILED_PRECONDITION when the lists deadlock or break a dependency
// (a backward before its forward); INVALID_ARGUMENT for malformed input.
struct PipelineSimulation {
  double step_time = 0;                  // the last action's end
  std::vector<double> bubble;            // per stage: idle share of step_time
  std::vector<int> peak_activations;     // per stage: forwards not yet backed
};
absl::StatusOr<PipelineSimulation> SimulatePipeline(const std::vector<std::vector<PipelineAction>>& actions,
                                                    int micro_batches, const std::vector<double>& forward_time,
                                                    const std::vector<double>& backward_time);

// (P-1)/(M+P-1): the bubble of either schedule with even times.
double TheoreticalBubble(int stages, int micro_batches);

}  // namespace pstrain

#endif  // PSTRAIN_PIPELINE_SCHEDULE_H_
