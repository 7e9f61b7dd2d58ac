// PartitionPlan: which shard holds which piece of which parameter. A pure,
// deterministic function of the parameters' names, shapes and dtypes, the
// shard count and the chunk size, so the coordinator, every worker and every
// shard compute the same plan independently.
//
// Each parameter is flattened and cut into ceil(bytes / chunk_bytes) chunks of
// near-equal size (never above chunk_bytes). Chunks are assigned largest first
// to the shard with the fewest bytes so far (lowest index on ties): the
// largest shard then holds at most the mean plus one chunk.
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
  int shard = 0;
};

struct PartitionPlan {
  int num_shards = 0;
  size_t chunk_bytes = 0;
  std::vector<ParameterSpec> params;
  std::vector<ChunkSpec> chunks;        // in parameter order, then offset order
  std::vector<size_t> shard_bytes;      // bytes assigned to each shard
  std::vector<std::vector<size_t>> shard_chunks;  // chunk indices per shard
};

// INVALID_ARGUMENT for no shards, a zero chunk size, duplicate or empty names,
// negative dimensions, or an unknown dtype.
absl::StatusOr<PartitionPlan> MakePartitionPlan(const std::vector<ParameterSpec>& params,
                                                int num_shards,
                                                size_t chunk_bytes = kDefaultChunkBytes);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_PARTITION_PLAN_H_
