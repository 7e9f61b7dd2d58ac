#include "worker/worker_metrics.h"

namespace pstrain {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : steps_(AddCounterFamily(registry, "pstrain_worker_steps_total", "Optimizer steps this worker completed.")),
      examples_(
          AddCounterFamily(registry, "pstrain_worker_examples_total", "Training examples this worker processed.")),
      wait_(AddCounterFamily(registry, "pstrain_worker_shard_wait_seconds_total",
                             "Time spent after the backward pass waiting for pushes and pulls to the shards.")),
      loss_(AddGaugeFamily(registry, "pstrain_worker_loss", "Training loss of the last step.")),
      step_(AddGaugeFamily(registry, "pstrain_worker_step", "Global step of the last completed step.")),
      running_(AddGaugeFamily(registry, "pstrain_worker_job_running", "1 while the job runs on this worker.")),
      step_seconds_(registry, "pstrain_worker_step_seconds",
                    "Wall time of one optimizer step, communication included.",
                    {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}) {}

void WorkerMetrics::RecordStep(const std::string& job, int rank, int64_t step, double loss, int64_t samples,
                               double seconds, double wait_seconds) {
  const prometheus::Labels labels = {{"job", job}, {"rank", std::to_string(rank)}};
  steps_.Add(labels).Increment();
  examples_.Add(labels).Increment(static_cast<double>(samples));
  wait_.Add(labels).Increment(wait_seconds);
  loss_.Add(labels).Set(loss);
  step_.Add(labels).Set(static_cast<double>(step));
  step_seconds_.Add(labels).Observe(seconds);
}

void WorkerMetrics::SetRunning(const std::string& job, int rank, bool running) {
  running_.Add({{"job", job}, {"rank", std::to_string(rank)}}).Set(running ? 1 : 0);
}

}  // namespace pstrain
