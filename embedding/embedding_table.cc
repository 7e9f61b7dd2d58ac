#include "embedding/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
// Rows per allocation: small enough that a table of a few rows costs little,
// large enough that the block pointers are noise.
constexpr uint32_t kBlockRows = 64;
// Count-min sketch for admission.min_count: kSketchDepth rows of counters,
// kSketchCounters per table and shard in all (2 MiB).
constexpr int kSketchDepth = 4;
constexpr uint32_t kSketchCounters = 1 << 18;

struct RowMeta {
  int64_t id;
  int64_t last_step;
  uint32_t count;
  uint32_t prev;  // toward the most recently used
  uint32_t next;  // toward the least recently used
};

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
constexpr uint64_t kIndexSlotBytes = sizeof(uint32_t) + 1;

bool Finite(const float* x, int n) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) acc += x[j] * 0.0f;
  return acc == 0.0f;
}

float Unit(uint64_t bits) { return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f); }

}  // namespace

// Everything below `mu` is guarded by it. Row r lives in block r / kBlockRows
// at r % kBlockRows: its metadata in meta_blocks, its value then its slots
// (row_floats floats) in data_blocks.
// Free rows are chained through their `next`.
struct EmbeddingTable::Stripe : RowIds {
  Stripe(ByteBudget* budget, int row_floats, uint64_t cap_bytes)
      : budget(budget), row_floats(row_floats), cap_bytes(cap_bytes), index(0, RowHash{this}, RowEq{this}) {}
  // Only under `mu` (the index hashes and compares under it).
  int64_t IdOf(uint32_t r) const override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return meta_blocks[r / kBlockRows][r % kBlockRows].id;
  }

  ByteBudget* const budget;  // the shard's (null: none)
  const int row_floats;      // value and slots
  // The table's eviction.max_memory_mb, this stripe's share (max: none).
  const uint64_t cap_bytes;

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
  void Touch(uint32_t r, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    RowMeta& m = Meta(r);
    m.last_step = std::max(m.last_step, step);
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
    Meta(r) = RowMeta{id, step, count, kNil, kNil};
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

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(EmbeddingTableConfig config, ByteBudget* budget,
                                                                       int stripes) {
  absl::Status s = NormalizeEmbeddingConfig(&config);
  if (!s.ok()) return s;
  if (stripes < 1 || stripes > 4096 || (stripes & (stripes - 1)) != 0) {
    return absl::InvalidArgumentError("embedding stripes must be a power of two in 1..4096");
  }
  std::unique_ptr<EmbeddingTable> table(new EmbeddingTable(std::move(config), budget, stripes));
  const EmbeddingTableConfig& c = table->config_;
  if (const uint64_t cap = c.eviction().max_memory_mb() << 20; cap > 0) {
    // Each stripe must hold a few blocks of rows (and its admission sketch)
    // within its share, or it could hold no row at all.
    const uint64_t sketch = c.admission().min_count() > 1 ? uint64_t{kSketchDepth} * kSketchCounters * 2 : 0;
    const uint64_t least =
        uint64_t(stripes) * 4 * kBlockRows * (sizeof(RowMeta) + sizeof(float) * (c.dim() + table->slot_floats_)) +
        sketch;
    if (cap < least) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table '", c.name(), "': eviction.max_memory_mb ",
                                                     c.eviction().max_memory_mb(), " is too small for its ", stripes,
                                                     " stripes; at least ", (least + (1 << 20) - 1) >> 20));
    }
  }
  if (table->config_.admission().min_count() > 1) {
    const uint32_t width = std::max<uint32_t>(64, kSketchCounters / stripes);
    const uint64_t bytes = uint64_t{kSketchDepth} * width * sizeof(uint16_t);
    if (budget != nullptr && !budget->TryReserve(bytes * stripes)) return table->ResourceExhausted();
    for (auto& stripe : table->stripes_) {
      absl::MutexLock lock(&stripe->mu);
      stripe->sketch.assign(size_t{kSketchDepth} * width, 0);
      stripe->charged = bytes;
    }
  }
  return table;
}

EmbeddingTable::EmbeddingTable(EmbeddingTableConfig config, ByteBudget* budget, int stripes)
    : config_(std::move(config)),
      budget_(budget),
      salt_(TableSalt(config_.name())),
      slot_floats_(SlotFloats(config_.optimizer().kind(), static_cast<int>(config_.dim()))),
      stripe_shift_(64 - __builtin_ctz(static_cast<unsigned>(stripes))) {
  const uint64_t cap = config_.eviction().max_memory_mb() << 20;
  evicts_ = cap > 0;
  for (int i = 0; i < stripes; ++i) {
    stripes_.push_back(std::make_unique<Stripe>(budget, static_cast<int>(config_.dim()) + slot_floats_,
                                                evicts_ ? cap / stripes : std::numeric_limits<uint64_t>::max()));
  }
}

EmbeddingTable::~EmbeddingTable() {
  if (budget_ == nullptr) return;
  for (auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    budget_->Release(stripe->charged);
  }
}

int EmbeddingTable::StripeOf(int64_t id) const {
  // The high bits of the mixed id (virtual shards use its low bits).
  return stripe_shift_ == 64 ? 0 : static_cast<int>(MixId(static_cast<uint64_t>(id)) >> stripe_shift_);
}

void EmbeddingTable::GroupByStripe(absl::Span<const int64_t> ids, std::vector<uint32_t>* order,
                                   std::vector<uint32_t>* begin) const {
  const size_t n = stripes_.size();
  std::vector<uint32_t> stripe_of(ids.size());
  begin->assign(n + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    stripe_of[i] = static_cast<uint32_t>(StripeOf(ids[i]));
    ++(*begin)[stripe_of[i] + 1];
  }
  for (size_t s = 0; s < n; ++s) (*begin)[s + 1] += (*begin)[s];
  std::vector<uint32_t> next(begin->begin(), begin->end() - 1);
  order->resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) (*order)[next[stripe_of[i]]++] = static_cast<uint32_t>(i);
}

absl::Status EmbeddingTable::ResourceExhausted() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("embedding table '", config_.name(), "' needs more memory than this shard has free (",
                   budget_ == nullptr ? 0 : budget_->used(), " of ", budget_ == nullptr ? 0 : budget_->max(),
                   " bytes in use, pstrain-ps --max_memory_mb); give the table an eviction.max_memory_mb so it drops "
                   "its least recently used rows, or admit fewer ids (admission.min_count)"));
}

bool EmbeddingTable::Admit(Stripe& stripe, int64_t id, int64_t step) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const EmbeddingAdmission& a = config_.admission();
  if (a.min_count() > 1) {
    // Conservative update: raise only the counters at the minimum.
    const size_t width = stripe.sketch.size() / kSketchDepth;
    uint16_t* c[kSketchDepth];
    uint16_t low = std::numeric_limits<uint16_t>::max();
    for (int d = 0; d < kSketchDepth; ++d) {
      const uint64_t h = MixId(static_cast<uint64_t>(id) ^ (salt_ + (d + 1) * 0x9e3779b97f4a7c15ULL));
      c[d] = &stripe.sketch[d * width + h % width];
      low = std::min(low, *c[d]);
    }
    if (low < std::numeric_limits<uint16_t>::max()) ++low;
    for (uint16_t* counter : c) *counter = std::max(*counter, low);
    if (low < a.min_count()) return false;
  }
  const double p = a.probability();
  if (p > 0 && p < 1) {
    const uint64_t h = MixId(salt_ ^ MixId(static_cast<uint64_t>(id)) ^ MixId(static_cast<uint64_t>(step) + 1));
    if (Unit(h) >= p) return false;
  }
  return true;
}

absl::Status EmbeddingTable::Lookup(absl::Span<const int64_t> ids, int64_t step, float* out) {
  if (ids.size() > kMaxEmbeddingIdsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("a lookup of ", ids.size(), " ids in embedding table '",
                                                   config_.name(), "'; at most ", kMaxEmbeddingIdsPerRequest));
  }
  const int dim = this->dim(), row_floats = dim + slot_floats_;
  counters_.lookups += static_cast<int64_t>(ids.size());
  std::vector<uint32_t> order, begin;
  GroupByStripe(ids, &order, &begin);
  bool refused = false;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (begin[s] == begin[s + 1]) continue;
    Stripe& stripe = *stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t k = begin[s]; k < begin[s + 1]; ++k) {
      const uint32_t i = order[k];
      const int64_t id = ids[i];
      float* dst = out + static_cast<size_t>(i) * dim;
      auto it = stripe.index.find(IdKey{id});
      uint32_t r;
      if (it != stripe.index.end()) {
        r = *it;
      } else if (!Admit(stripe, id, step)) {
        std::fill(dst, dst + dim, 0.0f);
        ++counters_.not_admitted;
        continue;
      } else if (!stripe.MakeRoom(evicts_, counters_.evicted_lru)) {
        std::fill(dst, dst + dim, 0.0f);
        ++counters_.refused;
        refused = true;
        continue;
      } else {
        r = stripe.Take(id, step, 0);
        float* row = stripe.Data(r, row_floats);
        InitRow(config_, salt_, id, row, row + dim);
        ++counters_.created;
      }
      RowMeta& m = stripe.Meta(r);
      if (m.count < std::numeric_limits<uint32_t>::max()) ++m.count;
      stripe.Touch(r, step);
      std::memcpy(dst, stripe.Data(r, row_floats), sizeof(float) * dim);
    }
  }
  return refused ? ResourceExhausted() : absl::OkStatus();
}

absl::Status EmbeddingTable::Update(absl::Span<const int64_t> ids, const float* grads, int64_t step,
                                    double grad_scale) {
  if (ids.size() > kMaxEmbeddingIdsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("an update of ", ids.size(), " ids in embedding table '",
                                                   config_.name(), "'; at most ", kMaxEmbeddingIdsPerRequest));
  }
  if (step < 1) return absl::InvalidArgumentError("an embedding update's step counts from 1");
  const int dim = this->dim(), row_floats = dim + slot_floats_;
  // Duplicates summed: one gradient per unique id, in first-seen order.
  absl::flat_hash_map<int64_t, uint32_t> first;
  first.reserve(ids.size());
  std::vector<int64_t> unique;
  std::vector<float> summed;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = first.emplace(ids[i], static_cast<uint32_t>(unique.size()));
    const float* g = grads + i * dim;
    if (fresh) {
      unique.push_back(ids[i]);
      summed.insert(summed.end(), g, g + dim);
    } else {
      float* acc = summed.data() + static_cast<size_t>(it->second) * dim;
      for (int j = 0; j < dim; ++j) acc[j] += g[j];
    }
  }
  std::vector<char> finite(unique.size());
  for (size_t u = 0; u < unique.size(); ++u) {
    finite[u] = Finite(summed.data() + u * dim, dim);
    if (!finite[u] && config_.nonfinite() == NONFINITE_REJECT) {
      return absl::InvalidArgumentError(
          absl::StrCat("the gradient for id ", unique[u], " of embedding table '", config_.name(),
                       "' has NaN or Inf; nothing was applied (the table's nonfinite policy is reject)"));
    }
  }
  std::vector<uint32_t> order, begin;
  GroupByStripe(unique, &order, &begin);
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (begin[s] == begin[s + 1]) continue;
    Stripe& stripe = *stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t k = begin[s]; k < begin[s + 1]; ++k) {
      const uint32_t u = order[k];
      auto it = stripe.index.find(IdKey{unique[u]});
      if (it == stripe.index.end()) {
        ++counters_.dropped_updates;
        continue;
      }
      float* row = stripe.Data(*it, row_floats);
      if (!finite[u] ||
          !ApplyRowUpdate(config_, step, summed.data() + static_cast<size_t>(u) * dim, grad_scale, row, row + dim)) {
        ++counters_.nonfinite;
        continue;
      }
      ++counters_.updates;
      stripe.Touch(*it, step);
    }
  }
  return absl::OkStatus();
}

int64_t EmbeddingTable::EvictExpired(int64_t step) {
  const int64_t ttl = config_.eviction().ttl_steps();
  if (ttl <= 0) return 0;
  int64_t evicted = 0;
  for (auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    // The LRU order is the order of last touches, so the expired rows are
    // the tail's.
    while (stripe->tail != kNil && stripe->Meta(stripe->tail).last_step < step - ttl) {
      stripe->Evict(stripe->tail);
      ++evicted;
    }
  }
  counters_.evicted_ttl += evicted;
  return evicted;
}

absl::Status EmbeddingTable::ForEachRow(const std::function<absl::Status(const EmbeddingRowView&)>& visit) const {
  const int row_floats = dim() + slot_floats_;
  std::vector<RowMeta> meta;
  std::vector<float> data;
  for (const auto& stripe : stripes_) {
    meta.clear();
    data.clear();
    {
      absl::MutexLock lock(&stripe->mu);
      meta.reserve(stripe->index.size());
      data.reserve(stripe->index.size() * row_floats);
      for (uint32_t r : stripe->index) {
        meta.push_back(stripe->Meta(r));
        const float* row = stripe->Data(r, row_floats);
        data.insert(data.end(), row, row + row_floats);
      }
    }
    for (size_t k = 0; k < meta.size(); ++k) {
      const float* row = data.data() + k * row_floats;
      absl::Status s = visit(EmbeddingRowView{meta[k].id, row, row + dim(), meta[k].last_step, meta[k].count});
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::InsertRow(const EmbeddingRowView& row) {
  const int dim = this->dim(), row_floats = dim + slot_floats_;
  Stripe& stripe = *stripes_[StripeOf(row.id)];
  absl::MutexLock lock(&stripe.mu);
  auto it = stripe.index.find(IdKey{row.id});
  uint32_t r;
  if (it != stripe.index.end()) {
    r = *it;
    RowMeta& m = stripe.Meta(r);
    m.last_step = row.last_step;
    m.count = row.count;
    stripe.Unlink(r);
    stripe.PushFront(r);
  } else {
    if (!stripe.MakeRoom(evicts_, counters_.evicted_lru)) {
      return ResourceExhausted();
    }
    r = stripe.Take(row.id, row.last_step, row.count);
  }
  float* dst = stripe.Data(r, row_floats);
  std::memcpy(dst, row.value, sizeof(float) * dim);
  std::memcpy(dst + dim, row.slots, sizeof(float) * slot_floats_);
  return absl::OkStatus();
}

EmbeddingTableStats EmbeddingTable::Stats() const {
  EmbeddingTableStats st;
  for (const auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    st.rows += static_cast<int64_t>(stripe->index.size());
    st.bytes += stripe->charged;
  }
  st.lookups = counters_.lookups;
  st.created = counters_.created;
  st.not_admitted = counters_.not_admitted;
  st.refused = counters_.refused;
  st.updates = counters_.updates;
  st.dropped_updates = counters_.dropped_updates;
  st.nonfinite = counters_.nonfinite;
  st.evicted_ttl = counters_.evicted_ttl;
  st.evicted_lru = counters_.evicted_lru;
  return st;
}

}  // namespace pstrain
