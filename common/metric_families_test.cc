#include "common/metric_families.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <string>
#include <vector>

namespace pstrain {
namespace {

// Expects each of `lines` in the registry's text exposition.
void ExpectScraped(prometheus::Registry& registry, const std::vector<std::string>& lines) {
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  for (const std::string& line : lines) EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
}

TEST(MetricFamiliesTest, CountersAndGaugesCarryNameHelpAndLabels) {
  prometheus::Registry registry;
  AddCounterFamily(registry, "t_calls_total", "Calls.").Add({{"method", "Pull"}}).Increment(3);
  AddGaugeFamily(registry, "t_loss", "Loss.").Add({{"job", "j"}}).Set(0.5);
  ExpectScraped(registry, {
                    "# HELP t_calls_total Calls.",
                    "# TYPE t_calls_total counter",
                    "t_calls_total{method=\"Pull\"} 3",
                    "# TYPE t_loss gauge",
                    "t_loss{job=\"j\"} 0.5",
                });
}

TEST(MetricFamiliesTest, HistogramsUseTheFamilysBuckets) {
  prometheus::Registry registry;
  HistogramFamily seconds(registry, "t_seconds", "Latency.", {0.1, 1});
  seconds.Add({{"method", "Pull"}}).Observe(0.05);
  seconds.Add({{"method", "Pull"}}).Observe(0.5);
  seconds.Add({{"method", "Push"}}).Observe(5);
  ExpectScraped(registry, {
                    "# TYPE t_seconds histogram",
                    "t_seconds_bucket{method=\"Pull\",le=\"0.1\"} 1",
                    "t_seconds_bucket{method=\"Pull\",le=\"1\"} 2",
                    "t_seconds_bucket{method=\"Push\",le=\"1\"} 0",
                    "t_seconds_count{method=\"Push\"} 1",
                });
}

}  // namespace
}  // namespace pstrain
