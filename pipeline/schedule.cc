#include "pipeline/schedule.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<std::vector<PipelineAction>> StageActions(PipelineSchedule schedule, int stages, int stage,
                                                         int micro_batches) {
  if (stages < 1 || stages > kMaxPipelineStages) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stages must be in 1..", kMaxPipelineStages));
  }
  if (stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " of a ", stages, "-stage pipeline"));
  }
  if (micro_batches < 1 || micro_batches > kMaxMicroBatches) {
    return absl::InvalidArgumentError(absl::StrCat("micro_batches must be in 1..", kMaxMicroBatches));
  }
  std::vector<PipelineAction> out;
  out.reserve(2 * static_cast<size_t>(micro_batches));
  const auto forward = [&](int m) { out.push_back({PipelineAction::kForward, m}); };
  const auto backward = [&](int m) { out.push_back({PipelineAction::kBackward, m}); };
  if (schedule == PipelineSchedule::kGPipe) {
    for (int m = 0; m < micro_batches; ++m) forward(m);
    for (int m = micro_batches - 1; m >= 0; --m) backward(m);
    return out;
  }
  const int warmup = std::min(stages - 1 - stage, micro_batches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) forward(next_forward);
  while (next_forward < micro_batches) {
    forward(next_forward++);
    backward(next_backward++);
  }
  while (next_backward < micro_batches) backward(next_backward++);
  return out;
}

absl::StatusOr<PipelineSimulation> SimulatePipeline(const std::vector<std::vector<PipelineAction>>& actions,
                                                    int micro_batches, const std::vector<double>& forward_time,
                                                    const std::vector<double>& backward_time) {
  const int stages = static_cast<int>(actions.size());
  if (stages < 1 || forward_time.size() != actions.size() || backward_time.size() != actions.size() ||
      micro_batches < 1) {
    return absl::InvalidArgumentError("one action list and one forward and backward time per stage");
  }
  constexpr double kNotYet = -1;
  // When each stage's forward and backward of each micro-batch ended.
  std::vector<std::vector<double>> fwd_end(stages, std::vector<double>(micro_batches, kNotYet));
  std::vector<std::vector<double>> bwd_end = fwd_end;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0), busy(stages, 0);
  PipelineSimulation sim;
  sim.peak_activations.assign(stages, 0);
  std::vector<int> held(stages, 0);
  size_t left = 0;
  for (const auto& a : actions) left += a.size();
  while (left > 0) {
    bool progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < actions[s].size()) {
        const PipelineAction& a = actions[s][next[s]];
        if (a.micro_batch < 0 || a.micro_batch >= micro_batches) {
          return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": micro-batch ", a.micro_batch));
        }
        const int m = a.micro_batch;
        double ready;
        if (a.kind == PipelineAction::kForward) {
          if (fwd_end[s][m] != kNotYet) return absl::FailedPreconditionError(absl::StrCat("stage ", s, ": forward ", m, " twice"));
          ready = s == 0 ? 0 : fwd_end[s - 1][m];
        } else {
          if (fwd_end[s][m] == kNotYet) {
            return absl::FailedPreconditionError(absl::StrCat("stage ", s, ": backward ", m, " before its forward"));
          }
          if (bwd_end[s][m] != kNotYet) return absl::FailedPreconditionError(absl::StrCat("stage ", s, ": backward ", m, " twice"));
          ready = s == stages - 1 ? fwd_end[s][m] : bwd_end[s + 1][m];
        }
        if (ready == kNotYet) break;  // blocked in a receive
        const double start = std::max(free_at[s], ready);
        const double length = a.kind == PipelineAction::kForward ? forward_time[s] : backward_time[s];
        free_at[s] = start + length;
        busy[s] += length;
        if (a.kind == PipelineAction::kForward) {
          fwd_end[s][m] = free_at[s];
          sim.peak_activations[s] = std::max(sim.peak_activations[s], ++held[s]);
        } else {
          bwd_end[s][m] = free_at[s];
          --held[s];
        }
        ++next[s];
        --left;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string where;
      for (int s = 0; s < stages && where.size() < 256; ++s) {
        if (next[s] < actions[s].size()) {
          const PipelineAction& a = actions[s][next[s]];
          absl::StrAppend(&where, where.empty() ? "" : ", ", "stage ", s, " waits in ",
                          a.kind == PipelineAction::kForward ? "forward " : "backward ", a.micro_batch);
        }
      }
      return absl::FailedPreconditionError(absl::StrCat("the schedule deadlocks: ", where));
    }
  }
  for (int s = 0; s < stages; ++s) {
    for (int m = 0; m < micro_batches; ++m) {
      if (bwd_end[s][m] == kNotYet) {
        return absl::FailedPreconditionError(absl::StrCat("stage ", s, " never runs backward ", m));
      }
    }
    sim.step_time = std::max(sim.step_time, free_at[s]);
  }
  for (int s = 0; s < stages; ++s) {
    sim.bubble.push_back(sim.step_time > 0 ? 1.0 - busy[s] / sim.step_time : 0.0);
  }
  return sim;
}

double TheoreticalBubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace pstrain
