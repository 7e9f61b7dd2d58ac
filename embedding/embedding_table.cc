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
#include "embedding/embedding_table_stripe.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

using embedding_internal::IdKey;
using embedding_internal::kBlockRows;
using embedding_internal::kIndexSlotBytes;
using embedding_internal::kNil;
using embedding_internal::kSketchCounters;
using embedding_internal::kSketchDepth;
using embedding_internal::RowMeta;

bool Finite(const float* x, int n) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) acc += x[j] * 0.0f;
  return acc == 0.0f;
}

float Unit(uint64_t bits) { return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f); }

}  // namespace

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
                                                evicts_ ? cap / stripes : std::numeric_limits<uint64_t>::max(),
                                                &epoch_));
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
  return AdmittedByChance(id, step);
}

bool EmbeddingTable::AdmittedByChance(int64_t id, int64_t step) const {
  const double p = config_.admission().probability();
  if (p > 0 && p < 1) {
    const uint64_t h = MixId(salt_ ^ MixId(static_cast<uint64_t>(id)) ^ MixId(static_cast<uint64_t>(step) + 1));
    if (Unit(h) >= p) return false;
  }
  return true;
}

template <typename Visit>
void EmbeddingTable::ForEachIdByStripe(absl::Span<const int64_t> ids, Visit visit) const {
  std::vector<uint32_t> order, begin;
  GroupByStripe(ids, &order, &begin);
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (begin[s] == begin[s + 1]) continue;
    Stripe& stripe = *stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (uint32_t k = begin[s]; k < begin[s + 1]; ++k) visit(stripe, order[k]);
  }
}

absl::Status EmbeddingTable::Lookup(absl::Span<const int64_t> ids, int64_t step, float* out) {
  if (ids.size() > kMaxEmbeddingIdsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("a lookup of ", ids.size(), " ids in embedding table '",
                                                   config_.name(), "'; at most ", kMaxEmbeddingIdsPerRequest));
  }
  const int dim = this->dim(), row_floats = dim + slot_floats_;
  counters_.lookups += static_cast<int64_t>(ids.size());
  bool refused = false;
  ForEachIdByStripe(ids, [&](Stripe& stripe, uint32_t i) {
    const int64_t id = ids[i];
    float* dst = out + static_cast<size_t>(i) * dim;
    auto it = stripe.index.find(IdKey{id});
    uint32_t r;
    if (it != stripe.index.end()) {
      r = *it;
    } else if (!Admit(stripe, id, step)) {
      std::fill(dst, dst + dim, 0.0f);
      ++counters_.not_admitted;
      return;
    } else if (!stripe.MakeRoom(evicts_, counters_.evicted_lru)) {
      std::fill(dst, dst + dim, 0.0f);
      ++counters_.refused;
      refused = true;
      return;
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
  });
  return refused ? ResourceExhausted() : absl::OkStatus();
}

absl::Status EmbeddingTable::Read(absl::Span<const int64_t> ids, float* out) const {
  if (ids.size() > kMaxEmbeddingIdsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("a read of ", ids.size(), " ids in embedding table '",
                                                   config_.name(), "'; at most ", kMaxEmbeddingIdsPerRequest));
  }
  const int dim = this->dim(), row_floats = dim + slot_floats_;
  ForEachIdByStripe(ids, [&](Stripe& stripe, uint32_t i) {
    float* dst = out + static_cast<size_t>(i) * dim;
    auto it = stripe.index.find(IdKey{ids[i]});
    if (it == stripe.index.end()) {
      std::fill(dst, dst + dim, 0.0f);
    } else {
      std::memcpy(dst, stripe.Data(*it, row_floats), sizeof(float) * dim);
    }
  });
  return absl::OkStatus();
}

absl::Status EmbeddingTable::Update(absl::Span<const int64_t> ids, const float* grads, int64_t step,
                                    double grad_scale, bool create_missing) {
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
  // A row made by the lookup of step - 1 on a leader that is gone: made
  // again as that lookup made it (admission by count aside: its counts are
  // not replicated).
  const bool remake = create_missing && config_.admission().min_count() <= 1;
  ForEachIdByStripe(unique, [&](Stripe& stripe, uint32_t u) {
    auto it = stripe.index.find(IdKey{unique[u]});
    uint32_t r;
    if (it != stripe.index.end()) {
      r = *it;
    } else if (!remake || !AdmittedByChance(unique[u], step - 1) ||
               !stripe.MakeRoom(evicts_, counters_.evicted_lru)) {
      ++counters_.dropped_updates;
      return;
    } else {
      r = stripe.Take(unique[u], step - 1, 1);
      float* fresh = stripe.Data(r, row_floats);
      InitRow(config_, salt_, unique[u], fresh, fresh + dim);
      ++counters_.created;
    }
    float* row = stripe.Data(r, row_floats);
    if (!finite[u] ||
        !ApplyRowUpdate(config_, step, summed.data() + static_cast<size_t>(u) * dim, grad_scale, row, row + dim)) {
      ++counters_.nonfinite;
      return;
    }
    ++counters_.updates;
    stripe.Touch(r, step);
  });
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

absl::Status EmbeddingTable::ForEachRow(const std::function<absl::Status(const EmbeddingRowView&)>& visit,
                                        uint32_t changed_since) const {
  const int row_floats = dim() + slot_floats_;
  std::vector<RowMeta> meta;
  std::vector<float> data;
  for (const auto& stripe : stripes_) {
    meta.clear();
    data.clear();
    {
      absl::MutexLock lock(&stripe->mu);
      meta.reserve(stripe->index.size());
      for (uint32_t r : stripe->index) {
        meta.push_back(stripe->Meta(r));
        if (meta.back().epoch < changed_since) continue;  // its id alone
        const float* row = stripe->Data(r, row_floats);
        data.insert(data.end(), row, row + row_floats);
      }
    }
    size_t k_data = 0;
    for (const RowMeta& m : meta) {
      EmbeddingRowView v{m.id, nullptr, nullptr, m.last_step, m.count};
      if (m.epoch >= changed_since) {
        v.value = data.data() + k_data++ * row_floats;
        v.slots = v.value + dim();
      }
      absl::Status s = visit(v);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

bool EmbeddingTable::MarkRow(int64_t id) {
  Stripe& stripe = *stripes_[StripeOf(id)];
  absl::MutexLock lock(&stripe.mu);
  auto it = stripe.index.find(IdKey{id});
  if (it == stripe.index.end()) return false;
  stripe.Meta(*it).epoch = stripe.Epoch();
  return true;
}

int64_t EmbeddingTable::DropRowsBefore(uint32_t epoch) {
  int64_t dropped = 0;
  std::vector<uint32_t> stale;
  for (auto& stripe : stripes_) {
    absl::MutexLock lock(&stripe->mu);
    stale.clear();
    for (uint32_t r : stripe->index) {
      if (stripe->Meta(r).epoch < epoch) stale.push_back(r);
    }
    for (uint32_t r : stale) stripe->Evict(r);
    dropped += static_cast<int64_t>(stale.size());
  }
  return dropped;
}

void EmbeddingTable::CopyRows(absl::Span<const int64_t> ids, EmbeddingRowsProto* rows) const {
  const int dim = this->dim(), row_floats = dim + slot_floats_;
  std::string &out_ids = *rows->mutable_ids(), &values = *rows->mutable_values(), &slots = *rows->mutable_slots(),
              &last = *rows->mutable_last_steps(), &counts = *rows->mutable_counts();
  auto put = [](std::string& to, const void* p, size_t n) { to.append(static_cast<const char*>(p), n); };
  ForEachIdByStripe(ids, [&](Stripe& stripe, uint32_t i) {
    auto it = stripe.index.find(IdKey{ids[i]});
    if (it == stripe.index.end()) return;
    const RowMeta& m = stripe.Meta(*it);
    const float* row = stripe.Data(*it, row_floats);
    put(out_ids, &m.id, sizeof(m.id));
    put(values, row, sizeof(float) * dim);
    put(slots, row + dim, sizeof(float) * slot_floats_);
    put(last, &m.last_step, sizeof(m.last_step));
    put(counts, &m.count, sizeof(m.count));
  });
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
    m.epoch = stripe.Epoch();
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
