#include "pipeline/stage_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

namespace pstrain {
namespace {

double Largest(const std::vector<double>& costs, const std::vector<int>& first) {
  double largest = 0;
  for (size_t s = 0; s < first.size(); ++s) {
    const int end = s + 1 < first.size() ? first[s + 1] : static_cast<int>(costs.size());
    double sum = 0;
    for (int i = first[s]; i < end; ++i) sum += costs[i];
    largest = std::max(largest, sum);
  }
  return largest;
}

// Every cut of `layers` into `stages`, by recursion: the smallest largest stage.
double BruteForce(const std::vector<double>& costs, int start, int stages) {
  const int layers = static_cast<int>(costs.size());
  if (stages == 1) {
    double sum = 0;
    for (int i = start; i < layers; ++i) sum += costs[i];
    return sum;
  }
  double best = std::numeric_limits<double>::infinity(), head = 0;
  for (int end = start + 1; end <= layers - (stages - 1); ++end) {
    head += costs[end - 1];
    best = std::min(best, std::max(head, BruteForce(costs, end, stages - 1)));
  }
  return best;
}

TEST(BalancedCutTest, MatchesEveryCutTriedOnSmallModels) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> cost(0, 20);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + trial % 11;
    std::vector<double> costs(layers);
    for (double& c : costs) c = cost(rng);  // zeros included: flat stretches
    for (int stages = 1; stages <= layers; ++stages) {
      auto first = BalancedCut(costs, stages);
      ASSERT_TRUE(first.ok()) << first.status();
      ASSERT_EQ(first->size(), static_cast<size_t>(stages));
      EXPECT_EQ((*first)[0], 0);
      for (int s = 1; s < stages; ++s) EXPECT_LT((*first)[s - 1], (*first)[s]) << "an empty stage";
      EXPECT_LT(first->back(), layers);
      EXPECT_EQ(Largest(costs, *first), BruteForce(costs, 0, stages)) << "trial " << trial << " stages " << stages;
    }
  }
}

TEST(BalancedCutTest, SplitsAnEvenModelEvenlyAndALargeOneFast) {
  EXPECT_EQ(*BalancedCut({1, 1, 1, 1, 1, 1}, 3), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(*BalancedCut({10, 1, 1, 1}, 2), (std::vector<int>{0, 1}));
  std::vector<double> many(kMaxCutLayers, 1.0);
  auto first = BalancedCut(many, 64);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(Largest(many, *first), kMaxCutLayers / 64);
}

TEST(BalancedCutTest, RefusesWhatCannotBeCut) {
  EXPECT_EQ(BalancedCut({1, 2}, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedCut({1, 2}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedCut({}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedCut({1, -2}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedCut({1, std::numeric_limits<double>::quiet_NaN()}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BalancedCut(std::vector<double>(kMaxCutLayers + 1, 1.0), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
