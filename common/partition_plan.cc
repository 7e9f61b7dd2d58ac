#include "common/partition_plan.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace pstrain {

absl::StatusOr<PartitionPlan> MakePartitionPlan(const std::vector<ParameterSpec>& params,
                                                int num_shards, size_t chunk_bytes) {
  if (num_shards < 1) return absl::InvalidArgumentError("num_shards must be >= 1");
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  PartitionPlan plan;
  plan.num_shards = num_shards;
  plan.chunk_bytes = chunk_bytes;
  plan.params = params;
  std::unordered_set<std::string> names;
  for (size_t p = 0; p < params.size(); ++p) {
    const ParameterSpec& spec = params[p];
    if (spec.name.empty()) return absl::InvalidArgumentError(absl::StrCat("parameter ", p, " has no name"));
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter name '", spec.name, "' appears twice"));
    }
    absl::StatusOr<size_t> bytes = ExpectedBytes(spec.dtype, spec.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "': ", bytes.status().message()));
    }
    const size_t elem = DataTypeSize(spec.dtype);
    const int64_t numel = static_cast<int64_t>(*bytes / elem);
    if (numel == 0) continue;  // nothing to train
    // Elements per chunk, at least one even when an element exceeds chunk_bytes.
    const int64_t max_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / elem));
    const int64_t pieces = (numel + max_per_chunk - 1) / max_per_chunk;
    const int64_t base = numel / pieces, extra = numel % pieces;
    int64_t offset = 0;
    for (int64_t i = 0; i < pieces; ++i) {
      ChunkSpec c;
      c.key = absl::StrCat(spec.name, "#", i);
      c.param = p;
      c.offset = offset;
      c.numel = base + (i < extra ? 1 : 0);
      c.bytes = static_cast<size_t>(c.numel) * elem;
      offset += c.numel;
      plan.chunks.push_back(std::move(c));
    }
  }

  std::vector<size_t> order(plan.chunks.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; ties broken by position so the result is deterministic.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan.chunks[a].bytes > plan.chunks[b].bytes;
  });
  plan.shard_bytes.assign(num_shards, 0);
  plan.shard_chunks.assign(num_shards, {});
  for (size_t idx : order) {
    const int shard = static_cast<int>(
        std::min_element(plan.shard_bytes.begin(), plan.shard_bytes.end()) - plan.shard_bytes.begin());
    plan.chunks[idx].shard = shard;
    plan.shard_bytes[shard] += plan.chunks[idx].bytes;
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) plan.shard_chunks[plan.chunks[i].shard].push_back(i);
  return plan;
}

}  // namespace pstrain
