#include "server/ps/parameter_service_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

namespace pstrain {

ParameterServiceMetrics::ParameterServiceMetrics(prometheus::Registry& registry, int shard_index)
    : shard_(std::to_string(shard_index)),
      requests_(prometheus::BuildCounter()
                    .Name("pstrain_shard_requests_total")
                    .Help("ParameterService requests, by method and status code.")
                    .Register(registry)),
      bytes_(prometheus::BuildCounter()
                 .Name("pstrain_shard_bytes_total")
                 .Help("Bytes received (in: gradients, initial values) and sent (out: values), by method.")
                 .Register(registry)),
      latency_(prometheus::BuildHistogram()
                   .Name("pstrain_shard_request_seconds")
                   .Help("Time from a request's arrival to its response, waits included, by method.")
                   .Register(registry)) {}

void ParameterServiceMetrics::Record(const std::string& method, const std::string& code, size_t bytes_in,
                                     size_t bytes_out, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  requests_.Add({{"shard", shard_}, {"method", method}, {"code", code}}).Increment();
  bytes_.Add({{"shard", shard_}, {"method", method}, {"direction", "in"}}).Increment(static_cast<double>(bytes_in));
  bytes_.Add({{"shard", shard_}, {"method", method}, {"direction", "out"}}).Increment(static_cast<double>(bytes_out));
  latency_.Add({{"shard", shard_}, {"method", method}}, kBuckets).Observe(seconds);
}

}  // namespace pstrain
