#include "common/metric_families.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <string>

namespace pstrain {
namespace {

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST(MetricFamiliesTest, CountersAndGaugesCarryNameHelpAndLabels) {
  prometheus::Registry registry;
  AddCounterFamily(registry, "t_calls_total", "Calls.").Add({{"method", "Pull"}}).Increment(3);
  AddGaugeFamily(registry, "t_loss", "Loss.").Add({{"job", "j"}}).Set(0.5);
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("# HELP t_calls_total Calls."), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE t_calls_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("t_calls_total{method=\"Pull\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE t_loss gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("t_loss{job=\"j\"} 0.5"), std::string::npos) << text;
}

TEST(MetricFamiliesTest, HistogramsUseTheFamilysBuckets) {
  prometheus::Registry registry;
  HistogramFamily seconds(registry, "t_seconds", "Latency.", {0.1, 1});
  seconds.Add({{"method", "Pull"}}).Observe(0.05);
  seconds.Add({{"method", "Pull"}}).Observe(0.5);
  seconds.Add({{"method", "Push"}}).Observe(5);
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("# TYPE t_seconds histogram"), std::string::npos) << text;
  EXPECT_NE(text.find("t_seconds_bucket{method=\"Pull\",le=\"0.1\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("t_seconds_bucket{method=\"Pull\",le=\"1\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("t_seconds_bucket{method=\"Push\",le=\"1\"} 0"), std::string::npos) << text;
  EXPECT_NE(text.find("t_seconds_count{method=\"Push\"} 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace pstrain
