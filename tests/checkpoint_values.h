// What a checkpoint holds and what a job wrote, as tensors, for tests that
// compare a resumed job's parameters with its checkpoint's, bit for bit.
#ifndef PSTRAIN_TESTS_CHECKPOINT_VALUES_H_
#define PSTRAIN_TESTS_CHECKPOINT_VALUES_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

using NamedTensors = std::map<std::string, at::Tensor>;

// The parameter values a checkpoint directory (manifest.json and its shard
// files) holds, read the way a restore reads them: the files loaded into a
// ShardStore of its own, every chunk pulled and put back together.
absl::StatusOr<NamedTensors> ReadCheckpointValues(const std::string& dir);

// A weights file a job's worker 0 wrote (model.pt: torch.save's format of a
// dict of name to tensor).
absl::StatusOr<NamedTensors> ReadWeightsFile(const std::string& path);

// "" when `a` and `b` have the same names and bitwise equal tensors, else
// what differs first (a name and the largest difference).
std::string BitwiseDifference(const NamedTensors& a, const NamedTensors& b);

// Every row of a set of embedding checkpoint files (one checkpoint's; an
// incremental one's after its bases', as ReadEmbeddingChain takes them):
// table name -> id -> the row's bytes (value, slots, last step, count).
using EmbeddingRows = std::map<std::string, std::map<int64_t, std::string>>;
absl::StatusOr<EmbeddingRows> ReadEmbeddingRows(const std::vector<std::vector<std::string>>& chain);

// "" when `a` and `b` hold the same rows, else the first difference.
std::string EmbeddingRowDifference(const EmbeddingRows& a, const EmbeddingRows& b);

// The test accuracy of the job spec's model (its data, on the CPU) holding
// `values`: what a job evaluating those values scores.
absl::StatusOr<double> TestAccuracyOf(const std::string& spec_yaml, const NamedTensors& values);

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_CHECKPOINT_VALUES_H_
