#include "worker/binary_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

template <typename T>
absl::Status CheckInputs(absl::Span<const T> scores, absl::Span<const float> labels, const char* what) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(scores.size(), " ", what, " but ", labels.size(), " labels: they must pair up"));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0.0f && labels[i] != 1.0f) {
      return absl::InvalidArgumentError(absl::StrCat("label ", labels[i], " at index ", i, " is not 0 or 1"));
    }
    if (!std::isfinite(scores[i])) {
      return absl::InvalidArgumentError(absl::StrCat("score ", scores[i], " at index ", i, " is not finite"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> AucImpl(absl::Span<const T> scores, absl::Span<const float> labels) {
  if (absl::Status s = CheckInputs(scores, labels, "scores"); !s.ok()) return s;
  // 32-bit indices halve the sort's memory; 4 billion held-out examples
  // would not fit a batch of float scores in one process anyway.
  if (scores.size() > UINT32_MAX) return absl::InvalidArgumentError("more than 2^32 scores");
  std::vector<uint32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Ranks count from 1; a run of equal scores all get the run's mean rank,
  // which is what makes a tie count one half.
  double positive_rank_sum = 0;
  uint64_t positives = 0;
  for (size_t start = 0; start < order.size();) {
    size_t end = start + 1;
    while (end < order.size() && scores[order[end]] == scores[order[start]]) ++end;
    const double mean_rank = 0.5 * (static_cast<double>(start + 1) + static_cast<double>(end));
    for (size_t k = start; k < end; ++k) {
      if (labels[order[k]] == 1.0f) {
        positive_rank_sum += mean_rank;
        ++positives;
      }
    }
    start = end;
  }
  const uint64_t negatives = order.size() - positives;
  if (positives == 0 || negatives == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the AUC needs both classes; the ", order.size(),
                                                   " labels are all ", positives == 0 ? 0 : 1));
  }
  const double p = static_cast<double>(positives);
  const double u = positive_rank_sum - p * (p + 1) / 2;  // Mann-Whitney U of the positives
  return u / (p * static_cast<double>(negatives));
}

template <typename T>
absl::StatusOr<double> LogLossImpl(absl::Span<const T> probabilities, absl::Span<const float> labels, double eps) {
  if (absl::Status s = CheckInputs(probabilities, labels, "probabilities"); !s.ok()) return s;
  if (labels.empty()) return absl::InvalidArgumentError("the log loss of no examples is undefined");
  if (!(eps > 0 && eps < 0.5)) return absl::InvalidArgumentError(absl::StrCat("eps ", eps, " is not in (0, 0.5)"));
  double sum = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double p = static_cast<double>(probabilities[i]);
    if (p < 0 || p > 1) {
      return absl::InvalidArgumentError(absl::StrCat("probability ", p, " at index ", i, " is not in [0, 1]"));
    }
    const double clipped = std::min(std::max(p, eps), 1 - eps);
    sum -= labels[i] == 1.0f ? std::log(clipped) : std::log1p(-clipped);
  }
  return sum / static_cast<double>(labels.size());
}

}  // namespace

absl::StatusOr<double> Auc(absl::Span<const float> scores, absl::Span<const float> labels) {
  return AucImpl(scores, labels);
}
absl::StatusOr<double> Auc(absl::Span<const double> scores, absl::Span<const float> labels) {
  return AucImpl(scores, labels);
}
absl::StatusOr<double> LogLoss(absl::Span<const float> probabilities, absl::Span<const float> labels, double eps) {
  return LogLossImpl(probabilities, labels, eps);
}
absl::StatusOr<double> LogLoss(absl::Span<const double> probabilities, absl::Span<const float> labels,
                               double eps) {
  return LogLossImpl(probabilities, labels, eps);
}

}  // namespace pstrain
