#include "worker/trainer_events.h"

namespace pstrain {

WorkerEvent PlanEvent(int rank, int64_t chunk_bytes, const std::vector<ParameterSpec>& params) {
  WorkerEvent e;
  e.set_rank(rank);
  WorkerEvent::Plan* plan = e.mutable_plan();
  plan->set_chunk_bytes(chunk_bytes);
  for (const ParameterSpec& p : params) {
    ParameterInfo* info = plan->add_params();
    info->set_name(p.name);
    for (int64_t d : p.shape) info->add_shape(d);
    info->set_dtype(static_cast<int>(p.dtype));
  }
  return e;
}

WorkerEvent EvalEvent(int rank, int epoch, const EvalResult& ev, bool final) {
  WorkerEvent e;
  e.set_rank(rank);
  e.mutable_eval()->set_epoch(epoch);
  e.mutable_eval()->set_test_loss(ev.loss);
  e.mutable_eval()->set_accuracy(ev.accuracy);
  e.mutable_eval()->set_final(final);
  return e;
}

WorkerEvent WeightsEvent(int rank, const std::string& path) {
  WorkerEvent e;
  e.set_rank(rank);
  e.mutable_weights()->set_path(path);
  return e;
}

WorkerEvent DoneEvent(int rank, int64_t steps, int64_t samples, double seconds, int64_t skipped_steps) {
  WorkerEvent e;
  e.set_rank(rank);
  e.mutable_done()->set_steps(steps);
  e.mutable_done()->set_samples(samples);
  e.mutable_done()->set_seconds(seconds);
  e.mutable_done()->set_skipped_steps(skipped_steps);
  return e;
}

}  // namespace pstrain
