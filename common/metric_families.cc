#include "common/metric_families.h"

#include <utility>

namespace pstrain {

prometheus::Family<prometheus::Counter>& AddCounterFamily(prometheus::Registry& registry, const std::string& name,
                                                          const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& AddGaugeFamily(prometheus::Registry& registry, const std::string& name,
                                                      const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

HistogramFamily::HistogramFamily(prometheus::Registry& registry, const std::string& name, const std::string& help,
                                 prometheus::Histogram::BucketBoundaries buckets)
    : family_(prometheus::BuildHistogram().Name(name).Help(help).Register(registry)),
      buckets_(std::move(buckets)) {}

}  // namespace pstrain
