// Quality figures of a binary classifier on held-out examples: the area
// under the ROC curve and the log loss, as the recommendation literature
// (DLRM on Criteo) reports them. Pure functions of their arguments; no
// LibTorch, so a benchmark or a tool can use them without it.
//
// Labels are 0 or 1 (stored as float, as a batch holds them); anything else
// is refused, as are scores that are not finite and spans of unequal length,
// with INVALID_ARGUMENT naming the first bad index.
#ifndef PSTRAIN_WORKER_BINARY_METRICS_H_
#define PSTRAIN_WORKER_BINARY_METRICS_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pstrain {

// The exact AUC: the probability that a random positive scores above a
// random negative, a tie counting one half (the Mann-Whitney U statistic
// over positives times negatives, with tied scores given their average
// rank). Sorts a copy of the indices: O(n log n) time, 8 n bytes of memory.
// INVALID_ARGUMENT when either class is absent (the AUC is undefined then).
absl::StatusOr<double> Auc(absl::Span<const float> scores, absl::Span<const float> labels);
absl::StatusOr<double> Auc(absl::Span<const double> scores, absl::Span<const float> labels);

// The mean of -(y log p + (1 - y) log(1 - p)), natural logarithm, with p
// clipped to [eps, 1 - eps] so one confident mistake costs -log(eps), not
// infinity (eps: 1e-7, PyTorch's BCELoss clamps its logarithms similarly).
// `probabilities` must lie in [0, 1]. INVALID_ARGUMENT on no examples.
absl::StatusOr<double> LogLoss(absl::Span<const float> probabilities, absl::Span<const float> labels,
                               double eps = 1e-7);
absl::StatusOr<double> LogLoss(absl::Span<const double> probabilities, absl::Span<const float> labels,
                               double eps = 1e-7);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_BINARY_METRICS_H_
