// PartitionPlan: which shard holds which piece of which parameter. A pure,
// deterministic function of the parameters' names, shapes and dtypes, the
// shard count and the chunk size, so the coordinator, every worker and every
// shard compute the same plan independently.
//
// Each parameter is flattened and cut into ceil(bytes / chunk_bytes) chunks of
// near-equal size (never above chunk_bytes). Chunks are assigned largest first
// to the shard with the fewest bytes so far (lowest index on ties): the
// largest shard then holds at most the mean plus one chunk.
//
// With `replicas` R (issue 34, replicated shards), each chunk also gets R
// backups on R other shards, no two copies of a chunk on one shard. Backups
// are placed after the primaries, one round per replica, largest chunk
// first, each on the allowed shard with the fewest backup bytes so far
// (then the fewest bytes of both kinds, then the lowest index), so backups
// spread as primaries do. The primaries are those of R = 0: a plan with
// replicas never moves a primary. backups[0] is the first to take over.
#ifndef PSTRAIN_COMMON_PARTITION_PLAN_H_
#define PSTRAIN_COMMON_PARTITION_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

namespace pstrain {

constexpr size_t kDefaultChunkBytes = 4 << 20;

struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;
  DataType dtype = DT_FLOAT32;
};

struct ChunkSpec {
  std::string key;       // "<name>#<index>", the shard table's key
  size_t param = 0;      // index into the plan's parameter list
  int64_t offset = 0;    // first element of the flattened parameter
  int64_t numel = 0;     // elements in this chunk (its wire shape is [numel])
  size_t bytes = 0;
  int shard = 0;             // the primary
  std::vector<int> backups;  // the plan's `replicas` other shards, in takeover order
};

struct PartitionPlan {
  int num_shards = 0;
  size_t chunk_bytes = 0;
  std::vector<ParameterSpec> params;
  std::vector<ChunkSpec> chunks;        // in parameter order, then offset order
  std::vector<size_t> shard_bytes;      // bytes assigned to each shard
  std::vector<std::vector<size_t>> shard_chunks;  // chunk indices per shard
  int replicas = 0;
  std::vector<size_t> shard_backup_bytes;               // backup bytes per shard
  std::vector<std::vector<size_t>> shard_backup_chunks;  // chunks each shard backs up
};

// INVALID_ARGUMENT for no shards, a zero chunk size, duplicate or empty names,
// negative dimensions, an unknown dtype, or replicas outside 0..num_shards-1.
absl::StatusOr<PartitionPlan> MakePartitionPlan(const std::vector<ParameterSpec>& params,
                                                int num_shards,
                                                size_t chunk_bytes = kDefaultChunkBytes, int replicas = 0);

// The part of `whole` that holds `params` (each one of whole's, by name,
// with its shape and dtype; in any order): a pipeline stage's plan of the
// whole model's. Its chunks keep their keys and shards, in whole's order,
// and refer to `params`; shard_bytes count them only. INVALID_ARGUMENT for
// a parameter not in whole or not alike, or a replicated plan.
absl::StatusOr<PartitionPlan> RestrictPlan(const PartitionPlan& whole, const std::vector<ParameterSpec>& params);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_PARTITION_PLAN_H_
