#include "common/partition_plan.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace pstrain {

namespace {

// Each round gives every chunk (largest first, `order`) one more backup on
// the shard, among those holding no copy of it yet, with the fewest backup
// bytes, then the fewest bytes in all, then the lowest index.
void PlaceBackups(const std::vector<size_t>& order, PartitionPlan* plan) {
  const int n = plan->num_shards;
  plan->shard_backup_bytes.assign(n, 0);
  plan->shard_backup_chunks.assign(n, {});
  for (int round = 0; round < plan->replicas; ++round) {
    for (size_t idx : order) {
      ChunkSpec& c = plan->chunks[idx];
      int best = -1;
      for (int s = 0; s < n; ++s) {
        if (s == c.shard || std::find(c.backups.begin(), c.backups.end(), s) != c.backups.end()) continue;
        if (best < 0) {
          best = s;
          continue;
        }
        const size_t b = plan->shard_backup_bytes[s], bb = plan->shard_backup_bytes[best];
        const size_t all = b + plan->shard_bytes[s], best_all = bb + plan->shard_bytes[best];
        if (b < bb || (b == bb && all < best_all)) best = s;
      }
      c.backups.push_back(best);  // replicas < n: some shard holds no copy yet
      plan->shard_backup_bytes[best] += c.bytes;
    }
  }
  for (size_t i = 0; i < plan->chunks.size(); ++i) {
    for (int s : plan->chunks[i].backups) plan->shard_backup_chunks[s].push_back(i);
  }
}

}  // namespace

absl::StatusOr<PartitionPlan> MakePartitionPlan(const std::vector<ParameterSpec>& params,
                                                int num_shards, size_t chunk_bytes, int replicas) {
  if (num_shards < 1) return absl::InvalidArgumentError("num_shards must be >= 1");
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  if (replicas < 0 || replicas >= num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas must be in 0..", num_shards - 1, " (each copy of a chunk on another of the ",
                     num_shards, " shards), not ", replicas));
  }
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
  plan.replicas = replicas;
  PlaceBackups(order, &plan);
  return plan;
}

absl::StatusOr<PartitionPlan> RestrictPlan(const PartitionPlan& whole, const std::vector<ParameterSpec>& params) {
  if (whole.replicas > 0) return absl::InvalidArgumentError("a replicated plan cannot be restricted");
  std::unordered_map<std::string, size_t> in_whole;
  for (size_t p = 0; p < whole.params.size(); ++p) in_whole.emplace(whole.params[p].name, p);
  std::vector<int64_t> mine(whole.params.size(), -1);  // whole's parameter -> index in params
  for (size_t p = 0; p < params.size(); ++p) {
    auto it = in_whole.find(params[p].name);
    if (it == in_whole.end() || whole.params[it->second].shape != params[p].shape ||
        whole.params[it->second].dtype != params[p].dtype || mine[it->second] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", params[p].name,
                                                     "' is not one of the whole model's, with its shape and dtype"));
    }
    mine[it->second] = static_cast<int64_t>(p);
  }
  PartitionPlan plan;
  plan.num_shards = whole.num_shards;
  plan.chunk_bytes = whole.chunk_bytes;
  plan.params = params;
  plan.shard_bytes.assign(whole.num_shards, 0);
  plan.shard_chunks.assign(whole.num_shards, {});
  for (const ChunkSpec& c : whole.chunks) {
    if (mine[c.param] < 0) continue;
    plan.chunks.push_back(c);
    plan.chunks.back().param = static_cast<size_t>(mine[c.param]);
    plan.shard_bytes[c.shard] += c.bytes;
    plan.shard_chunks[c.shard].push_back(plan.chunks.size() - 1);
  }
  plan.shard_backup_bytes.assign(whole.num_shards, 0);
  plan.shard_backup_chunks.assign(whole.num_shards, {});
  return plan;
}

}  // namespace pstrain
