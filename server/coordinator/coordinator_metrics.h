// CoordinatorMetrics: the coordinator's state as Prometheus metrics,
// computed at scrape time: jobs by state, each running job's step, loss and
// samples/s, and member liveness.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_METRICS_H_

#include <prometheus/collectable.h>

#include "server/coordinator/coordinator.h"

namespace pstrain {

class CoordinatorMetrics : public prometheus::Collectable {
 public:
  // `coordinator` must outlive this object.
  explicit CoordinatorMetrics(Coordinator* coordinator) : coordinator_(coordinator) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_METRICS_H_
