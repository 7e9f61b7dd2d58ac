// EmbeddingTable's stripe (embedding_table.h): one lock's rows, their
// index, blocks, free list and LRU order, and the memory they are charged.
// For embedding_table.cc only.
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_TABLE_STRIPE_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_TABLE_STRIPE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"
#include "common/byte_budget.h"
#include "embedding/embedding_table.h"

namespace pstrain {

namespace embedding_internal {

inline constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
// Rows per allocation: small enough that a table of a few rows costs little,
// large enough that the block pointers are noise.
inline constexpr uint32_t kBlockRows = 64;
// Count-min sketch for admission.min_count: kSketchDepth rows of counters,
// kSketchCounters per table and shard in all (2 MiB).
inline constexpr int kSketchDepth = 4;
inline constexpr uint32_t kSketchCounters = 1 << 18;

struct RowMeta {
  int64_t id;
  int64_t last_step;
  uint32_t count;
  uint32_t prev;  // toward the most recently used
  uint32_t next;  // toward the least recently used; a free row: the next free
  // The table's epoch at the row's last change (EmbeddingTable::NextEpoch):
  // what an incremental checkpoint writes. In what was padding.
  uint32_t epoch;
};
static_assert(sizeof(RowMeta) == 32, "a row's metadata stays 32 bytes");

// The index of a stripe holds row numbers, found by id: a row's id is in its
// metadata, so a slot is 4 bytes (a map from int64 to uint32 pads each pair
// to 16). Lookups by id go through IdKey (heterogeneous lookup); hashing a
// stored row reads its id, so a row leaves the index before its metadata
// changes.
struct IdKey {
  int64_t id;
};

class RowIds {
 public:
  virtual ~RowIds() = default;
  virtual int64_t IdOf(uint32_t row) const = 0;
};

struct RowHash {
  using is_transparent = void;
  const RowIds* rows;
  size_t operator()(uint32_t r) const { return absl::Hash<int64_t>()(rows->IdOf(r)); }
  size_t operator()(IdKey k) const { return absl::Hash<int64_t>()(k.id); }
};

struct RowEq {
  using is_transparent = void;
  const RowIds* rows;
  bool operator()(uint32_t a, uint32_t b) const { return a == b; }
  bool operator()(IdKey k, uint32_t r) const { return rows->IdOf(r) == k.id; }
  bool operator()(uint32_t r, IdKey k) const { return rows->IdOf(r) == k.id; }
};

using Index = absl::flat_hash_set<uint32_t, RowHash, RowEq>;
// What one index slot costs: its row number and its control byte.
inline constexpr uint64_t kIndexSlotBytes = sizeof(uint32_t) + 1;

}  // namespace embedding_internal

// Everything below `mu` is guarded by it. Row r lives in block r / kBlockRows
// at r % kBlockRows: its metadata in meta_blocks, its value then its slots
// (row_floats floats) in data_blocks.
// Free rows are chained through their `next`.
struct EmbeddingTable::Stripe : embedding_internal::RowIds {
  using RowMeta = embedding_internal::RowMeta;
  using Index = embedding_internal::Index;
  static constexpr uint32_t kNil = embedding_internal::kNil;
  static constexpr uint32_t kBlockRows = embedding_internal::kBlockRows;
  static constexpr uint64_t kIndexSlotBytes = embedding_internal::kIndexSlotBytes;

  Stripe(ByteBudget* budget, int row_floats, uint64_t cap_bytes, const std::atomic<uint32_t>* epoch)
      : budget(budget),
        row_floats(row_floats),
        cap_bytes(cap_bytes),
        epoch(epoch),
        index(0, embedding_internal::RowHash{this}, embedding_internal::RowEq{this}) {}
  // Only under `mu` (the index hashes and compares under it).
  int64_t IdOf(uint32_t r) const override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return meta_blocks[r / kBlockRows][r % kBlockRows].id;
  }

  ByteBudget* const budget;  // the shard's (null: none)
  const int row_floats;      // value and slots
  // The table's eviction.max_memory_mb, this stripe's share (max: none).
  const uint64_t cap_bytes;
  // The table's epoch, read under `mu` whenever a row changes: a save that
  // advanced it before taking `mu` sees every change made under the old
  // one, and every later change is tagged with the new one.
  const std::atomic<uint32_t>* const epoch;

  absl::Mutex mu;
  std::vector<std::unique_ptr<RowMeta[]>> meta_blocks ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<float[]>> data_blocks ABSL_GUARDED_BY(mu);
  Index index ABSL_GUARDED_BY(mu);
  uint32_t free_head ABSL_GUARDED_BY(mu) = kNil;
  uint32_t head ABSL_GUARDED_BY(mu) = kNil;  // most recently used
  uint32_t tail ABSL_GUARDED_BY(mu) = kNil;  // least recently used
  std::vector<uint16_t> sketch ABSL_GUARDED_BY(mu);
  uint64_t charged ABSL_GUARDED_BY(mu) = 0;  // bytes taken from the budget

  RowMeta& Meta(uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return meta_blocks[r / kBlockRows][r % kBlockRows]; }
  float* Data(uint32_t r, int row_floats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return data_blocks[r / kBlockRows].get() + static_cast<size_t>(r % kBlockRows) * row_floats;
  }

  void Unlink(uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    RowMeta& m = Meta(r);
    (m.prev == kNil ? head : Meta(m.prev).next) = m.next;
    (m.next == kNil ? tail : Meta(m.next).prev) = m.prev;
  }
  void PushFront(uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    RowMeta& m = Meta(r);
    m.prev = kNil;
    m.next = head;
    (head == kNil ? tail : Meta(head).prev) = r;
    head = r;
  }
  uint32_t Epoch() const { return epoch->load(std::memory_order_relaxed); }
  void Touch(uint32_t r, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    RowMeta& m = Meta(r);
    m.last_step = std::max(m.last_step, step);
    m.epoch = Epoch();
    if (head != r) {
      Unlink(r);
      PushFront(r);
    }
  }
  void Evict(uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    index.erase(r);  // first: erasing hashes the row's id
    Unlink(r);
    Free(r);
  }
  void Free(uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Meta(r).next = free_head;
    free_head = r;
  }
  // A free row for `id` at `step` (MakeRoom made sure there is one), in the
  // index and at the front of the LRU order; its floats are the caller's.
  uint32_t Take(int64_t id, int64_t step, uint32_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint32_t r = free_head;
    free_head = Meta(r).next;
    Meta(r) = RowMeta{id, step, count, kNil, kNil, Epoch()};
    const size_t capacity = index.capacity();
    index.insert(r);
    if (index.capacity() != capacity) Reconcile();  // MakeRoom keeps this rare
    PushFront(r);
    return r;
  }

  // Makes room for one more row: a free row, and index capacity for it.
  // Takes the bytes from the budget before allocating; where they are not
  // there, or would take the stripe past cap_bytes, and the table evicts
  // (`evict`), drops the least recently used row instead. False: no room.
  bool MakeRoom(bool evict, std::atomic<int64_t>& evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (;;) {
      const bool need_block = free_head == kNil;
      // Grown ahead of absl's own 7/8: erased rows leave tombstones, and
      // under 25/32 full absl clears them in place instead of doubling.
      const size_t cap = index.capacity();
      const bool need_index = index.size() + 1 > cap * 25 / 32;
      const uint64_t bytes =
          (need_block
               ? kBlockRows * (sizeof(RowMeta) + sizeof(float) * static_cast<uint64_t>(row_floats)) + 2 * sizeof(void*)
               : 0) +
          (need_index ? (cap + 1) * kIndexSlotBytes : 0);
      if (bytes == 0) return true;
      const bool fits = charged + bytes <= cap_bytes;
      if (fits && (budget == nullptr || budget->TryReserve(bytes))) {
        charged += bytes;
        if (need_block) AddBlock();
        if (need_index) index.reserve(std::max<size_t>(cap, 1));
        Reconcile();
        return true;
      }
      if (!evict || tail == kNil) return false;
      Evict(tail);
      ++evicted;
    }
  }
  void AddBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint32_t first = static_cast<uint32_t>(meta_blocks.size()) * kBlockRows;
    meta_blocks.push_back(std::make_unique<RowMeta[]>(kBlockRows));
    data_blocks.push_back(std::make_unique<float[]>(kBlockRows * static_cast<size_t>(row_floats)));
    for (uint32_t r = first + kBlockRows; r > first; --r) Free(r - 1);
  }
  // Charges (or gives back) the difference between what was estimated and
  // what the containers really allocated, so the budget stays the truth.
  void Reconcile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t now = Bytes();
    if (budget != nullptr) {
      if (now > charged) budget->Charge(now - charged);
      if (now < charged) budget->Release(charged - now);
    }
    charged = now;
  }

  // What the stripe has allocated, by the same arithmetic that charged it.
  uint64_t Bytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t block = kBlockRows * (sizeof(RowMeta) + sizeof(float) * static_cast<uint64_t>(row_floats));
    return meta_blocks.size() * block + index.capacity() * kIndexSlotBytes + sketch.capacity() * sizeof(uint16_t) +
           (meta_blocks.capacity() + data_blocks.capacity()) * sizeof(void*);
  }
};

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_TABLE_STRIPE_H_
