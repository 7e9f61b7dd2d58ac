#include "worker/binary_metrics.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pstrain {
namespace {

// The definition itself: every (positive, negative) pair, a tie worth 1/2.
double PairwiseAuc(const std::vector<float>& s, const std::vector<float>& y) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    for (size_t j = 0; j < s.size(); ++j) {
      if (y[i] != 1 || y[j] != 0) continue;
      pairs += 1;
      wins += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

TEST(AucTest, HandComputed) {
  // sklearn's roc_auc_score example: 3 of the 4 pairs are ordered right.
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, std::vector<float>{0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{1, 2, 3}, std::vector<float>{0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{3, 2, 1}, std::vector<float>{0, 1, 1}), 0.0);
}

TEST(AucTest, TiesCountHalf) {
  // Pairs: (0.5>0.1)=1, (0.5=0.5)=1/2, (0.9>0.1)=1, (0.9>0.5)=1 -> 3.5 / 4.
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.1f, 0.5f, 0.5f, 0.9f}, std::vector<float>{0, 1, 0, 1}), 0.875);
  // Every score equal: no information, 1/2 whatever the labels.
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, std::vector<float>{0, 1, 0, 1, 1}), 0.5);
}

TEST(AucTest, AgreesWithPairCountingOnManyTies) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> s(200), y(200);
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = static_cast<float>(rng() % 9) / 8;  // 9 distinct values: ties everywhere
      y[i] = (rng() % 3 == 0) ? 1 : 0;
    }
    y[0] = 1;
    y[1] = 0;
    EXPECT_NEAR(*Auc(s, y), PairwiseAuc(s, y), 1e-12) << "trial " << trial;
    std::vector<double> d(s.begin(), s.end());
    EXPECT_NEAR(*Auc(d, y), PairwiseAuc(s, y), 1e-12);
  }
}

TEST(AucTest, RefusesWhatHasNoAnswer) {
  EXPECT_EQ(Auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Auc(std::vector<float>{}, std::vector<float>{}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Auc(std::vector<float>{0.1f}, std::vector<float>{1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{1, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Auc(std::vector<float>{NAN, 0.2f}, std::vector<float>{1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LogLossTest, HandComputed) {
  // -(ln 0.9 + ln 0.8) / 2
  EXPECT_NEAR(*LogLoss(std::vector<float>{0.9f, 0.2f}, std::vector<float>{1, 0}),
              (0.10536051565782628 + 0.2231435513142097) / 2, 1e-7);
  EXPECT_NEAR(*LogLoss(std::vector<double>{0.5, 0.5}, std::vector<float>{1, 0}), std::log(2.0), 1e-12);
}

TEST(LogLossTest, ClipsCertainMistakes) {
  // p = 0 for a positive costs -ln(1e-7), not infinity; a certain right
  // answer costs -ln(1 - 1e-7).
  EXPECT_NEAR(*LogLoss(std::vector<double>{0.0}, std::vector<float>{1}), -std::log(1e-7), 1e-9);
  EXPECT_NEAR(*LogLoss(std::vector<double>{1.0}, std::vector<float>{1}), -std::log1p(-1e-7), 1e-12);
  EXPECT_NEAR(*LogLoss(std::vector<double>{1.0}, std::vector<float>{0}, 1e-3), -std::log(1e-3), 1e-9);
}

TEST(LogLossTest, RefusesBadInput) {
  EXPECT_FALSE(LogLoss(std::vector<float>{}, std::vector<float>{}).ok());
  EXPECT_FALSE(LogLoss(std::vector<float>{1.5f}, std::vector<float>{1}).ok());
  EXPECT_FALSE(LogLoss(std::vector<float>{-0.1f}, std::vector<float>{1}).ok());
  EXPECT_FALSE(LogLoss(std::vector<float>{0.5f}, std::vector<float>{0.5f}).ok());
  EXPECT_FALSE(LogLoss(std::vector<float>{0.5f}, std::vector<float>{1}, 0.0).ok());
}

}  // namespace
}  // namespace pstrain
