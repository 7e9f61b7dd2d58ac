// The arithmetic of one embedding row, with no table around it: where an id
// lives (hash, virtual shard, shard), its first value, and the optimizers'
// per-row updates. Pure functions of their arguments, so a row's value does
// not depend on which shard holds it or when it was created.
#ifndef PSTRAIN_EMBEDDING_ROW_MATH_H_
#define PSTRAIN_EMBEDDING_ROW_MATH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/embedding.pb.h"

namespace pstrain {

// SplitMix64's finalizer: a bijection on 64 bits that spreads consecutive or
// patterned ids (hashed feature values often are) over every bit.
inline uint64_t MixId(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The virtual shard of `id` among `virtual_shards` (the low bits of the
// mixed id; a table's stripes use the high bits, so they stay independent).
inline uint32_t VirtualShardOf(int64_t id, uint32_t virtual_shards) {
  return static_cast<uint32_t>(MixId(static_cast<uint64_t>(id)) % virtual_shards);
}
inline uint32_t ShardOfVirtual(uint32_t virtual_shard, uint32_t shards) { return virtual_shard % shards; }
inline uint32_t ShardOfId(int64_t id, uint32_t virtual_shards, uint32_t shards) {
  return ShardOfVirtual(VirtualShardOf(id, virtual_shards), shards);
}

// A stable 64-bit hash of a table's name (FNV-1a), part of every row's seed.
uint64_t TableSalt(absl::string_view name);

// Fills the defaults (docs/embeddings.md) into unset fields of `config` and
// checks every range; INVALID_ARGUMENT names the field. Kinds never seen
// before (a newer client) are refused, not treated as SGD.
absl::Status NormalizeEmbeddingConfig(EmbeddingTableConfig* config);

// Floats of optimizer state a row of `dim` keeps (Adagrad: dim; row-wise
// Adagrad: 1; lazy Adam and FTRL: 2 dim; SGD: 0).
int SlotFloats(EmbeddingOptimizer::Kind kind, int dim);

// Writes the first value of row `id` of the table salted `salt` into
// value[0, dim) and its slots' initial values into slots[0, SlotFloats).
void InitRow(const EmbeddingTableConfig& config, uint64_t salt, int64_t id, float* value, float* slots);

// Applies one update to a row: `grad` (dim floats) times `grad_scale`. `step`
// counts from 1 (lazy Adam's bias correction uses it, as SparseAdam uses its
// step count). The config must be normalized. Returns false, leaving value
// and slots untouched, when the result would not be finite.
bool ApplyRowUpdate(const EmbeddingTableConfig& config, int64_t step, const float* grad, double grad_scale,
                    float* value, float* slots);

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_ROW_MATH_H_
