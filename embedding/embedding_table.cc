#include "embedding/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
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

using Index = absl::flat_hash_map<int64_t, uint32_t>;
// What one index slot costs: its key-value pair and its control byte.
constexpr uint64_t kIndexSlotBytes = sizeof(Index::slot_type) + 1;

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
struct EmbeddingTable::Stripe {
  absl::Mutex mu;
  Index index ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<RowMeta[]>> meta_blocks ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<float[]>> data_blocks ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> free_rows ABSL_GUARDED_BY(mu);
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
    index.erase(Meta(r).id);
    Unlink(r);
    free_rows.push_back(r);  // never reallocates: reserved for every row
  }

  // Makes room for one more row: a free row, and index capacity for it.
  // Takes the bytes from the budget before allocating; where they are not
  // there, or the stripe holds max_rows, and the table evicts (`evict`),
  // drops the least recently used row instead. False: no room.
  bool MakeRoom(ByteBudget* budget, int row_floats, uint64_t max_rows, bool evict, std::atomic<int64_t>& evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (evict && index.size() >= max_rows && tail != kNil) {
      Evict(tail);
      ++evicted;
    }
    for (;;) {
      const bool need_block = free_rows.empty();
      // absl's table grows when it is 7/8 full, to twice its capacity.
      const size_t cap = index.capacity();
      const bool need_index = index.size() + 1 > cap - cap / 8;
      const uint64_t bytes =
          (need_block ? kBlockRows * (sizeof(RowMeta) + sizeof(float) * static_cast<uint64_t>(row_floats)) +
                            kBlockRows * sizeof(uint32_t) + 2 * sizeof(void*)
                      : 0) +
          (need_index ? (cap + 1) * kIndexSlotBytes : 0);
      if (bytes == 0) return true;
      if (budget == nullptr || budget->TryReserve(bytes)) {
        charged += bytes;
        if (need_block) AddBlock(row_floats);
        if (need_index) index.reserve(index.size() + 1);
        Reconcile(budget, row_floats);
        return true;
      }
      if (!evict || tail == kNil) return false;
      Evict(tail);
      ++evicted;
    }
  }
  void AddBlock(int row_floats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint32_t first = static_cast<uint32_t>(meta_blocks.size()) * kBlockRows;
    meta_blocks.push_back(std::make_unique<RowMeta[]>(kBlockRows));
    data_blocks.push_back(std::make_unique<float[]>(kBlockRows * static_cast<size_t>(row_floats)));
    free_rows.reserve(first + kBlockRows);
    for (uint32_t r = first + kBlockRows; r > first; --r) free_rows.push_back(r - 1);
  }
  // Charges (or gives back) the difference between what was estimated and
  // what the containers really allocated, so the budget stays the truth.
  void Reconcile(ByteBudget* budget, int row_floats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t now = Bytes(row_floats);
    if (budget != nullptr) {
      if (now > charged) budget->Charge(now - charged);
      if (now < charged) budget->Release(charged - now);
    }
    charged = now;
  }

  // What the stripe has allocated, by the same arithmetic that charged it.
  uint64_t Bytes(int row_floats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t block = kBlockRows * (sizeof(RowMeta) + sizeof(float) * static_cast<uint64_t>(row_floats));
    return meta_blocks.size() * block + index.capacity() * kIndexSlotBytes + free_rows.capacity() * sizeof(uint32_t) +
           sketch.capacity() * sizeof(uint16_t) + (meta_blocks.capacity() + data_blocks.capacity()) * sizeof(void*);
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
  for (int i = 0; i < stripes; ++i) stripes_.push_back(std::make_unique<Stripe>());
  if (const uint64_t cap = config_.eviction().max_memory_mb() << 20; cap > 0) {
    // A row's share of the worst case: its block entry, its free-list slot,
    // and the index just after it doubled (7/16 full).
    const uint64_t per_row = sizeof(RowMeta) + sizeof(float) * static_cast<uint64_t>(config_.dim() + slot_floats_) +
                             sizeof(uint32_t) + kIndexSlotBytes * 16 / 7;
    evicts_ = true;
    max_rows_per_stripe_ = std::max<uint64_t>(1, cap / stripes / per_row);
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
      auto it = stripe.index.find(id);
      uint32_t r;
      if (it != stripe.index.end()) {
        r = it->second;
      } else if (!Admit(stripe, id, step)) {
        std::fill(dst, dst + dim, 0.0f);
        ++counters_.not_admitted;
        continue;
      } else if (!stripe.MakeRoom(budget_, row_floats, max_rows_per_stripe_, evicts_, counters_.evicted_lru)) {
        std::fill(dst, dst + dim, 0.0f);
        ++counters_.refused;
        refused = true;
        continue;
      } else {
        r = stripe.free_rows.back();
        stripe.free_rows.pop_back();
        stripe.Meta(r) = RowMeta{id, step, 0, kNil, kNil};
        float* row = stripe.Data(r, row_floats);
        InitRow(config_, salt_, id, row, row + dim);
        stripe.index.emplace(id, r);
        stripe.PushFront(r);
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
      auto it = stripe.index.find(unique[u]);
      if (it == stripe.index.end()) {
        ++counters_.dropped_updates;
        continue;
      }
      float* row = stripe.Data(it->second, row_floats);
      if (!finite[u] ||
          !ApplyRowUpdate(config_, step, summed.data() + static_cast<size_t>(u) * dim, grad_scale, row, row + dim)) {
        ++counters_.nonfinite;
        continue;
      }
      ++counters_.updates;
      stripe.Touch(it->second, step);
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
      for (const auto& [id, r] : stripe->index) {
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
  auto it = stripe.index.find(row.id);
  uint32_t r;
  if (it != stripe.index.end()) {
    r = it->second;
    stripe.Unlink(r);
  } else {
    if (!stripe.MakeRoom(budget_, row_floats, max_rows_per_stripe_, evicts_, counters_.evicted_lru)) {
      return ResourceExhausted();
    }
    r = stripe.free_rows.back();
    stripe.free_rows.pop_back();
    stripe.index.emplace(row.id, r);
  }
  stripe.Meta(r) = RowMeta{row.id, row.last_step, row.count, kNil, kNil};
  float* dst = stripe.Data(r, row_floats);
  std::memcpy(dst, row.value, sizeof(float) * dim);
  std::memcpy(dst + dim, row.slots, sizeof(float) * slot_floats_);
  stripe.PushFront(r);
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
