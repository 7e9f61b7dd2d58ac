// Where a model is cut into pipeline stages (issue 35): contiguous runs of
// its layers, one per stage, the largest run's cost as small as it can be.
// The cost of a layer is what the caller balances: its parameter count, or
// a measured forward + backward time.
#ifndef PSTRAIN_PIPELINE_STAGE_CUT_H_
#define PSTRAIN_PIPELINE_STAGE_CUT_H_

#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

inline constexpr int kMaxCutLayers = 1 << 16;

// first[s] = the first layer of stage s (first[0] = 0, increasing), for
// `stages` non-empty stages over costs.size() layers, minimizing the largest
// stage's sum of costs (one such cut, the same on every call).
// INVALID_ARGUMENT for stages outside 1..layers, more than
// kMaxCutLayers layers, or a cost that is negative or not finite.
absl::StatusOr<std::vector<int>> BalancedCut(const std::vector<double>& costs, int stages);

}  // namespace pstrain

#endif  // PSTRAIN_PIPELINE_STAGE_CUT_H_
