#include "worker/worker_metrics.h"

namespace pstrain {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : steps_(prometheus::BuildCounter()
                 .Name("pstrain_worker_steps_total")
                 .Help("Optimizer steps this worker completed.")
                 .Register(registry)),
      examples_(prometheus::BuildCounter()
                    .Name("pstrain_worker_examples_total")
                    .Help("Training examples this worker processed.")
                    .Register(registry)),
      wait_(prometheus::BuildCounter()
                .Name("pstrain_worker_shard_wait_seconds_total")
                .Help("Time spent after the backward pass waiting for pushes and pulls to the shards.")
                .Register(registry)),
      loss_(prometheus::BuildGauge()
                .Name("pstrain_worker_loss")
                .Help("Training loss of the last step.")
                .Register(registry)),
      step_(prometheus::BuildGauge()
                .Name("pstrain_worker_step")
                .Help("Global step of the last completed step.")
                .Register(registry)),
      running_(prometheus::BuildGauge()
                   .Name("pstrain_worker_job_running")
                   .Help("1 while the job runs on this worker.")
                   .Register(registry)),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("pstrain_worker_step_seconds")
                        .Help("Wall time of one optimizer step, communication included.")
                        .Register(registry)) {}

void WorkerMetrics::RecordStep(const std::string& job, int rank, int64_t step, double loss, int64_t samples,
                               double seconds, double wait_seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                                   0.1,   0.25,   0.5,   1,    2.5,   10};
  const prometheus::Labels labels = {{"job", job}, {"rank", std::to_string(rank)}};
  steps_.Add(labels).Increment();
  examples_.Add(labels).Increment(static_cast<double>(samples));
  wait_.Add(labels).Increment(wait_seconds);
  loss_.Add(labels).Set(loss);
  step_.Add(labels).Set(static_cast<double>(step));
  step_seconds_.Add(labels, kBuckets).Observe(seconds);
}

void WorkerMetrics::SetRunning(const std::string& job, int rank, bool running) {
  running_.Add({{"job", job}, {"rank", std::to_string(rank)}}).Set(running ? 1 : 0);
}

}  // namespace pstrain
