// Prometheus metrics of a worker's training steps, fed by
// TrainerOptions::on_step: steps, examples, loss, step time and the part of
// it spent waiting on the shards (push + pull after the backward pass), by
// job and rank. Thread-safe (prometheus-cpp families are).
#ifndef PSTRAIN_WORKER_WORKER_METRICS_H_
#define PSTRAIN_WORKER_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <string>

#include "common/metric_families.h"

namespace pstrain {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);
  void RecordStep(const std::string& job, int rank, int64_t step, double loss, int64_t samples, double seconds,
                  double wait_seconds);
  // 1 while `job` runs on this worker, 0 after.
  void SetRunning(const std::string& job, int rank, bool running);

 private:
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& examples_;
  prometheus::Family<prometheus::Counter>& wait_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& running_;
  HistogramFamily step_seconds_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_WORKER_METRICS_H_
