// Prometheus metrics of a parameter shard's RPCs: requests by method and
// status code, bytes in and out by method, and latency by method.
// Thread-safe (prometheus-cpp families are).
#ifndef PSTRAIN_SERVER_PS_PARAMETER_SERVICE_METRICS_H_
#define PSTRAIN_SERVER_PS_PARAMETER_SERVICE_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <string>

#include "common/metric_families.h"

namespace pstrain {

class ParameterServiceMetrics {
 public:
  ParameterServiceMetrics(prometheus::Registry& registry, int shard_index);
  void Record(const std::string& method, const std::string& code, size_t bytes_in, size_t bytes_out,
              double seconds);

 private:
  const std::string shard_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& bytes_;
  HistogramFamily latency_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_PARAMETER_SERVICE_METRICS_H_
