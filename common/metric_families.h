// Registers prometheus-cpp metric families by name and help line, so that a
// process's metrics class states each family in one line. A histogram
// family keeps its bucket boundaries beside it: prometheus-cpp asks for them
// on every Add(labels, buckets), and they belong with the metric's
// definition, not with each place that observes it.
// Thread-safe as prometheus-cpp's families are. The families live in (and
// are owned by) the registry, which must outlive every reference returned.
#ifndef PSTRAIN_COMMON_METRIC_FAMILIES_H_
#define PSTRAIN_COMMON_METRIC_FAMILIES_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/registry.h>

#include <string>

namespace pstrain {

prometheus::Family<prometheus::Counter>& AddCounterFamily(prometheus::Registry& registry, const std::string& name,
                                                          const std::string& help);
prometheus::Family<prometheus::Gauge>& AddGaugeFamily(prometheus::Registry& registry, const std::string& name,
                                                      const std::string& help);

// A histogram family and its bucket boundaries.
class HistogramFamily {
 public:
  HistogramFamily(prometheus::Registry& registry, const std::string& name, const std::string& help,
                  prometheus::Histogram::BucketBoundaries buckets);
  // The histogram of `labels`, made with this family's buckets on first use.
  prometheus::Histogram& Add(const prometheus::Labels& labels) { return family_.Add(labels, buckets_); }

 private:
  prometheus::Family<prometheus::Histogram>& family_;
  const prometheus::Histogram::BucketBoundaries buckets_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_METRIC_FAMILIES_H_
