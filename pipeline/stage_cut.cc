#include "pipeline/stage_cut.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<std::vector<int>> BalancedCut(const std::vector<double>& costs, int stages) {
  const int layers = static_cast<int>(costs.size());
  if (costs.size() > static_cast<size_t>(kMaxCutLayers)) {
    return absl::InvalidArgumentError(absl::StrCat(costs.size(), " layers; at most ", kMaxCutLayers, " are cut"));
  }
  if (stages < 1 || stages > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot cut ", layers, " layer(s) into ", stages, " non-empty stage(s)"));
  }
  std::vector<double> prefix(layers + 1, 0);
  for (int i = 0; i < layers; ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", i, " has cost ", costs[i], "; costs are >= 0"));
    }
    prefix[i + 1] = prefix[i] + costs[i];
  }
  // best[p][i]: the smallest largest stage over the first i layers in p + 1
  // stages; from[p][i]: where its last stage starts. best[p - 1][j] does
  // not fall as j grows and the last stage's cost prefix[i] - prefix[j]
  // does, so the best j is where they cross, and it moves right with i.
  std::vector<std::vector<double>> best(stages, std::vector<double>(layers + 1, 0));
  std::vector<std::vector<int>> from(stages, std::vector<int>(layers + 1, 0));
  for (int i = 1; i <= layers; ++i) best[0][i] = prefix[i];
  for (int p = 1; p < stages; ++p) {
    int j = p;  // the last stage starts at j in [p, i - 1]
    for (int i = p + 1; i <= layers; ++i) {
      const auto cost = [&](int k) { return std::max(best[p - 1][k], prefix[i] - prefix[k]); };
      while (j + 1 <= i - 1 && cost(j + 1) <= cost(j) && best[p - 1][j + 1] <= prefix[i] - prefix[j + 1]) ++j;
      int pick = j;
      if (j + 1 <= i - 1 && cost(j + 1) < cost(j)) pick = j + 1;
      best[p][i] = cost(pick);
      from[p][i] = pick;
    }
  }
  std::vector<int> first(stages, 0);
  int end = layers;
  for (int p = stages - 1; p > 0; --p) {
    first[p] = from[p][end];
    end = first[p];
  }
  return first;
}

}  // namespace pstrain
