#include "server/coordinator/job_status.h"

#include <algorithm>
#include <climits>

namespace pstrain {

const char* JobStateName(JobState state) {
  switch (state) {
    case PENDING: return "Pending";
    case RUNNING: return "Running";
    case CHECKPOINTING: return "Checkpointing";
    case SUCCEEDED: return "Succeeded";
    case FAILED: return "Failed";
    case CANCELLED: return "Cancelled";
    default: return "Unknown";
  }
}

bool IsTerminal(JobState state) { return state == SUCCEEDED || state == FAILED || state == CANCELLED; }

void AddCondition(JobStatus& st, JobState state, const std::string& reason, const std::string& message,
                  absl::Time now, size_t max_conditions) {
  st.set_state(state);
  if (max_conditions >= 2 && static_cast<size_t>(st.conditions_size()) >= max_conditions) {
    st.mutable_conditions()->DeleteSubrange(1, st.conditions_size() - static_cast<int>(max_conditions) + 1);
  }
  JobCondition* c = st.add_conditions();
  c->set_state(state);
  c->set_time_unix_ms(absl::ToUnixMillis(now));
  c->set_reason(reason);
  c->set_message(message);
}

void MergeProgress(JobStatus& st, int workers, int rank, const WorkerEvent::Progress& p) {
  while (st.workers_size() < workers) st.add_workers()->set_rank(st.workers_size() - 1);
  if (rank < 0 || rank >= st.workers_size()) return;
  WorkerProgress* w = st.mutable_workers(rank);
  w->set_epoch(p.epoch());
  w->set_step(p.step());
  w->set_steps(p.steps());
  w->set_loss(p.loss());
  w->set_samples_per_s(p.samples_per_s());
  if (p.has_stage()) {
    w->set_stage(p.stage());
    w->set_stages(p.stages());
    w->set_bubble(p.bubble());
  }
  int64_t step = INT64_MAX;
  int epoch = INT32_MAX, reporting = 0;
  double loss = 0, rate = 0;
  for (const WorkerProgress& wp : st.workers()) {
    // Not reported yet, or vacated (coordinator_elastic.cc clears both). A
    // dlrm job streaming its data without max_steps reports steps 0 (unknown)
    // with a rate, and counts.
    if (wp.steps() == 0 && wp.samples_per_s() == 0) continue;
    step = std::min(step, wp.step());
    epoch = std::min(epoch, wp.epoch());
    // A pipeline's samples pass every stage (counted at the first), and
    // only its last stage computes the loss.
    if (!wp.has_stage() || wp.stage() == 0) rate += wp.samples_per_s();
    if (wp.has_stage() && wp.stage() != wp.stages() - 1) continue;
    ++reporting;
    loss += wp.loss();
  }
  if (step != INT64_MAX) {
    st.set_step(step);
    st.set_epoch(epoch);
    st.set_steps(w->steps());
    if (reporting > 0) st.set_loss(loss / reporting);
    st.set_samples_per_s(rate);
  }
}

absl::Status AddEval(JobStatus& st, const WorkerEvent::Eval& eval) {
  if (st.evals_size() >= 10000) return absl::ResourceExhaustedError("a job keeps at most 10000 evaluations");
  EpochEval* ev = st.add_evals();
  ev->set_epoch(eval.epoch());
  ev->set_accuracy(eval.accuracy());
  ev->set_test_loss(eval.test_loss());
  ev->set_auc(eval.auc());
  ev->set_log_loss(eval.log_loss());
  if (eval.final() && eval.auc() > 0) {
    st.set_final_auc(eval.auc());
  } else if (eval.final()) {
    st.set_final_accuracy(eval.accuracy());
  }
  return absl::OkStatus();
}

}  // namespace pstrain
