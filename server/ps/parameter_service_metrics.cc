#include "server/ps/parameter_service_metrics.h"

namespace pstrain {

ParameterServiceMetrics::ParameterServiceMetrics(prometheus::Registry& registry, int shard_index)
    : shard_(std::to_string(shard_index)),
      requests_(AddCounterFamily(registry, "pstrain_shard_requests_total",
                                 "ParameterService requests, by method and status code.")),
      bytes_(AddCounterFamily(registry, "pstrain_shard_bytes_total",
                              "Bytes received (in: gradients, initial values) and sent (out: values), by method.")),
      latency_(registry, "pstrain_shard_request_seconds",
               "Time from a request's arrival to its response, waits included, by method.",
               {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}) {}

void ParameterServiceMetrics::Record(const std::string& method, const std::string& code, size_t bytes_in,
                                     size_t bytes_out, double seconds) {
  requests_.Add({{"shard", shard_}, {"method", method}, {"code", code}}).Increment();
  bytes_.Add({{"shard", shard_}, {"method", method}, {"direction", "in"}}).Increment(static_cast<double>(bytes_in));
  bytes_.Add({{"shard", shard_}, {"method", method}, {"direction", "out"}}).Increment(static_cast<double>(bytes_out));
  latency_.Add({{"shard", shard_}, {"method", method}}).Observe(seconds);
}

}  // namespace pstrain
