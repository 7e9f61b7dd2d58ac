// One shard's part of a sparse embedding table: the rows whose ids hash to
// this shard's virtual shards, each row its value, its optimizer slots, the
// step it was last touched and how often (docs/embeddings.md).
//
// Rows live in stripes (the id's high hash bits pick one), each with its own
// lock, hash index, row blocks and least-recently-used list, so lookups and
// updates on many threads contend only when they hit the same stripe. A row
// is read and written only under its stripe's lock: a checkpoint copies a
// row's value and slots from one state, never torn between two updates.
//
// Memory: every byte a stripe allocates (row blocks, index, admission
// sketch) is charged to the shard's ByteBudget before it is allocated. With
// eviction.max_memory_mb the table also keeps itself under its own cap by
// dropping its least recently used rows; without it, a table that meets the
// shard's budget is refused new rows (RESOURCE_EXHAUSTED naming it).
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_TABLE_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/byte_budget.h"
#include "proto/embedding.pb.h"

namespace pstrain {

// Bounds on one request (hostile input: a request names at most this many
// ids; INVALID_ARGUMENT beyond).
inline constexpr size_t kMaxEmbeddingIdsPerRequest = 1 << 20;

struct EmbeddingTableStats {
  int64_t rows = 0;             // held now
  uint64_t bytes = 0;           // charged to the budget now
  int64_t lookups = 0;          // ids looked up
  int64_t created = 0;          // rows created (admitted ids)
  int64_t not_admitted = 0;     // lookups answered with zeros: not (yet) admitted
  int64_t refused = 0;          // lookups refused a row: no memory and no eviction
  int64_t updates = 0;          // row updates applied
  int64_t dropped_updates = 0;  // gradients for ids without a row (evicted, unadmitted)
  int64_t nonfinite = 0;        // row updates skipped: NaN/Inf gradient or result
  int64_t evicted_ttl = 0;
  int64_t evicted_lru = 0;
};

// A row as a checkpoint sees it (pointers valid during the visit only).
struct EmbeddingRowView {
  int64_t id = 0;
  // dim floats; null (slots too): a row ForEachRow found unchanged since the
  // epoch it was given, visited by its id alone.
  const float* value = nullptr;
  const float* slots = nullptr;  // SlotFloats(kind, dim) floats
  int64_t last_step = 0;
  uint32_t count = 0;
};

class EmbeddingTable {
 public:
  // `config` is normalized here (defaults filled, ranges checked:
  // INVALID_ARGUMENT). `budget` is the shard's and must outlive the table;
  // null: no shard-wide cap.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(EmbeddingTableConfig config, ByteBudget* budget,
                                                                int stripes = 64);
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const EmbeddingTableConfig& config() const { return config_; }
  int dim() const { return static_cast<int>(config_.dim()); }
  int slot_floats() const { return slot_floats_; }

  // Writes row ids[i] to out[i * dim, (i + 1) * dim) for every i; an id that
  // is not admitted (yet) reads as zeros. Counts as a touch at `step`: the
  // sighting counts toward admission, creates an admitted id's row, and
  // moves the row to the front of the LRU order. RESOURCE_EXHAUSTED when a
  // new row finds no memory and the table may not evict: rows created before
  // it stay (a row's first value is a function of its id, so a retry reads
  // the same values).
  absl::Status Lookup(absl::Span<const int64_t> ids, int64_t step, float* out);

  // Writes the held rows of ids to `out` as Lookup does, zeros for an id
  // without a row, and changes nothing: no admission count, no new row, no
  // LRU move (evaluation reads the table as a checkpoint or an export of it
  // would).
  absl::Status Read(absl::Span<const int64_t> ids, float* out) const;

  // Applies grads[i * dim, (i + 1) * dim) times `grad_scale` to row ids[i]
  // with the table's optimizer at `step` (>= 1). Duplicate ids are summed
  // first. Ids without a row get nothing (dropped_updates). A NaN/Inf
  // gradient: with NONFINITE_REJECT the whole call fails with
  // INVALID_ARGUMENT and nothing is applied; with NONFINITE_SKIP that row
  // keeps its value (nonfinite), as does a row whose result would not be
  // finite.
  //
  // `create_missing` (a replicated slot's new leader): an id without a row
  // gets the row its lookup at step - 1 made on the leader that is gone
  // (its first value, count 1; by admission.probability's draw for that
  // step; not under admission.min_count, whose counts are not replicated),
  // and then the update.
  absl::Status Update(absl::Span<const int64_t> ids, const float* grads, int64_t step, double grad_scale,
                      bool create_missing = false);

  // Drops rows last touched before `step` - ttl_steps; returns how many.
  int64_t EvictExpired(int64_t step);

  // Calls `visit` for every row, one stripe at a time: the stripe's rows are
  // copied under its lock (each row from one state), then visited without
  // it, so memory beyond the table is one stripe's rows. Stops at the first
  // error `visit` returns. A row whose last change is older than
  // `changed_since` (an epoch) is visited by its id alone (value null).
  absl::Status ForEachRow(const std::function<absl::Status(const EmbeddingRowView&)>& visit,
                          uint32_t changed_since = 0) const;

  // Change tracking for incremental checkpoints (docs/embeddings.md): every
  // row carries the table's epoch of its last change (created, looked up,
  // updated or put back). NextEpoch starts a new epoch and returns it; a
  // save that calls it before copying the stripes knows that a row whose
  // epoch is below the returned one is as that save found it (a change
  // made under the old epoch is in the copy, a later one is tagged anew).
  uint32_t NextEpoch() { return epoch_.fetch_add(1) + 1; }
  // Restoring a chain of checkpoints: MarkRow gives a held row the current
  // epoch without changing it (false: there is no row of that id), and
  // DropRowsBefore drops the rows whose epoch is below `epoch` (neither put
  // back nor marked since), returning how many.
  bool MarkRow(int64_t id);
  int64_t DropRowsBefore(uint32_t epoch);

  // The held rows among `ids`, each copied under its stripe's lock (one
  // state): appended to `rows` as EmbeddingRowsProto packs them (ids,
  // values, slots, last steps, counts); ids without a row are left out.
  // What a replicated slot's leader forwards after an update.
  void CopyRows(absl::Span<const int64_t> ids, EmbeddingRowsProto* rows) const;

  // Puts a row back as a checkpoint saved it (restore): replaces a row of
  // the same id. RESOURCE_EXHAUSTED as for Lookup.
  absl::Status InsertRow(const EmbeddingRowView& row);

  EmbeddingTableStats Stats() const;

 private:
  struct Stripe;
  struct Counters {
    std::atomic<int64_t> lookups{0}, created{0}, not_admitted{0}, refused{0}, updates{0}, dropped_updates{0},
        nonfinite{0}, evicted_ttl{0}, evicted_lru{0};
  };

  EmbeddingTable(EmbeddingTableConfig config, ByteBudget* budget, int stripes);
  int StripeOf(int64_t id) const;
  // Groups [0, n) by stripe: order holds the indices stripe by stripe, and
  // stripe s's are order[begin[s], begin[s + 1]).
  void GroupByStripe(absl::Span<const int64_t> ids, std::vector<uint32_t>* order, std::vector<uint32_t>* begin) const;
  // visit(stripe, i) for every index i of ids, a stripe's ids together under
  // its lock (defined and used in embedding_table.cc only).
  template <typename Visit>
  void ForEachIdByStripe(absl::Span<const int64_t> ids, Visit visit) const;
  bool Admit(Stripe& stripe, int64_t id, int64_t step);
  // admission.probability's draw for `id` at `step` (true without one).
  bool AdmittedByChance(int64_t id, int64_t step) const;
  absl::Status ResourceExhausted() const;

  EmbeddingTableConfig config_;
  ByteBudget* budget_;
  const uint64_t salt_;
  const int slot_floats_;
  const int stripe_shift_;
  // With eviction.max_memory_mb the table evicts its least recently used
  // rows (each stripe within its share of the cap).
  bool evicts_ = false;
  std::atomic<uint32_t> epoch_{1};
  std::vector<std::unique_ptr<Stripe>> stripes_;
  mutable Counters counters_;
};

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_TABLE_H_
