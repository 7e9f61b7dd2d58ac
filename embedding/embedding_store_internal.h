// What embedding_store.cc and embedding_store_files.cc share: a job's state
// on the shard (EmbeddingStore::Job) and the request bounds. Not for other
// files.
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_STORE_INTERNAL_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_STORE_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/quote.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"

namespace pstrain {

namespace embedding_internal {

inline constexpr size_t kMaxJobBytes = 256;
inline constexpr uint32_t kMaxWorkers = 4096;
inline constexpr int kMaxTables = 64;
inline constexpr int64_t kMaxStep = int64_t{1} << 40;
inline constexpr uint32_t kMaxReplicas = 15;
inline constexpr size_t kMaxTargetBytes = 256;

// Whether all n floats are finite (a NaN or Inf makes the sum NaN).
inline bool Finite(const float* x, size_t n) {
  float acc = 0.0f;
  for (size_t j = 0; j < n; ++j) acc += x[j] * 0.0f;
  return acc == 0.0f;
}

inline absl::Status Invalid(absl::string_view job, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("embeddings of job '", Quote(job), "': ", what));
}

// What a SYNC step has received so far, per table: one summed gradient per
// id, and the ranks that sent theirs.
struct Pending {
  absl::flat_hash_map<int64_t, uint32_t> index;
  std::vector<int64_t> ids;
  std::vector<float> sums;
};

// Routing sets and rows as replication reads them (the store's files only).
inline bool In(const google::protobuf::RepeatedField<uint32_t>& set, uint32_t shard) {
  return std::find(set.begin(), set.end(), shard) != set.end();
}
inline bool Lost(const Routing& r, uint32_t shard) { return In(r.lost_shards(), shard); }
// A slot's leader: its first copy neither lost nor a spare still catching up.
inline int64_t LeaderOf(const std::vector<uint32_t>& copies, const Routing& r) {
  for (uint32_t s : copies) {
    if (!Lost(r, s) && !In(r.catching_up(), s)) return s;
  }
  return -1;
}
template <typename T>
const T* Packed(const std::string& bytes) {
  return reinterpret_cast<const T*>(bytes.data());
}
// The rows of one table in a forward or a copy, checked whole before any is
// applied: sizes that match the table, ids of the slot, steps in range.
absl::Status CheckRows(const InitEmbeddingsRequest& init, const EmbeddingTable& table, const EmbeddingRowsProto& rows);

// A replicated slot's copy on this shard (embedding_store_replication.cc):
// the rows of one shard's virtual shards, led by the first of `copies` the
// routing does not mark lost, backed up by the others.
struct SlotReplica {
  std::vector<uint32_t> copies;  // the slot's shards, the slot's own first
  Routing routing;               // the latest the shard was told
  int64_t leader = -1;           // under `routing`
  std::string fenced;            // why this shard may not lead the slot again
  // The fence came from a backup's refusal of a forward (it had heard of a
  // newer routing first), not from this shard being declared lost: the next
  // routing that makes this copy a backup lifts it.
  bool fenced_by_refusal = false;
  // It stopped leading holding changes some backup never got (a forward
  // refused or dropped at a hand-back): were it to lead again, every live
  // backup gets the whole slot first.
  bool unforwarded = false;
  // Leading: forwards made and held by every live backup; backing up:
  // forwards applied (acked unused).
  int64_t seq = 0;
  int64_t acked = 0;
  std::vector<EmbeddingForward> queue;  // made, not yet sent
  bool sending = false;                 // a caller's thread is sending a round
  // The last forward applied or sent: a backup one behind gets it first.
  std::shared_ptr<const EmbeddingForward> last;
  // Leading: spares in a lost copy's place that get a full copy of the slot
  // before their first forward (the routing says they are catching up).
  std::vector<uint32_t> needs_copy;
  // Leading: full copies begun (each is numbered). A copy's receiver: the
  // number of the copy it was made from, so that a late request of an
  // earlier copy (its sender gave up on it and began another) is refused.
  uint64_t copies_made = 0;
  uint64_t made_from_copy = 0;
  uint64_t made_from_generation = 0;
  int64_t made_from_sender = -1;
};
// Whether this shard leads the slot (job.mu held): unreplicated, or the
// routing's leader and not fenced.
inline bool Leads(int64_t self, const SlotReplica* rep) {
  return rep == nullptr || (rep->leader == self && rep->fenced.empty());
}

}  // namespace embedding_internal

struct EmbeddingStore::Job {
  std::string name;
  // This shard's index among the job's shards; init.shard_index() is the
  // slot's (the same without replicas).
  uint32_t self = 0;
  InitEmbeddingsRequest init;  // tables normalized
  // Fixed once the job is created: lookups read them without `mu`.
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  std::map<std::string, int> table_index;

  // Replicated ASYNC/SSP slots: an update's apply and its forward's seq
  // are taken in one order (a later forward holds the later rows).
  absl::Mutex apply_mu ABSL_ACQUIRED_BEFORE(mu);
  absl::Mutex mu;
  absl::CondVar changed;
  bool gone ABSL_GUARDED_BY(mu) = false;  // dropped, replaced or shut down
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  // ASYNC/SSP: per rank, steps claimed (an update in flight) and applied.
  std::vector<int64_t> claimed ABSL_GUARDED_BY(mu);
  std::vector<int64_t> applied ABSL_GUARDED_BY(mu);
  std::vector<char> active ABSL_GUARDED_BY(mu);  // SetWorkers: ranks taking part
  // SYNC: steps applied on this shard, and the next one's gradients.
  int64_t steps ABSL_GUARDED_BY(mu) = 0;
  // SYNC: the steps lookups may see: applied, and held by every live backup.
  int64_t released ABSL_GUARDED_BY(mu) = 0;
  std::vector<embedding_internal::Pending> pending ABSL_GUARDED_BY(mu);
  std::vector<char> pending_ranks ABSL_GUARDED_BY(mu);
  uint32_t pending_batches ABSL_GUARDED_BY(mu) = 0;  // the arrivals' batches
  uint64_t pending_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t max_step ABSL_GUARDED_BY(mu) = 0;  // for TTL eviction
  // Checkpoints of this slot's rows that this shard wrote (leading it) or
  // loaded, newest last, each with its tables' epochs (NextEpoch) at that
  // moment: what a later incremental save may name as its base.
  struct Saved {
    uint64_t checkpoint_id = 0;
    std::vector<uint32_t> epochs;
  };
  std::vector<Saved> saved ABSL_GUARDED_BY(mu);
  // Starts a new epoch of every table and records it as checkpoint_id's
  // (the newest few are kept). Called before the rows are copied.
  void RecordSaved(uint64_t checkpoint_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Saved s{checkpoint_id, {}};
    for (const auto& t : tables) s.epochs.push_back(t->NextEpoch());
    if (checkpoint_id == 0) return;
    saved.erase(std::remove_if(saved.begin(), saved.end(),
                               [checkpoint_id](const Saved& x) { return x.checkpoint_id == checkpoint_id; }),
                saved.end());
    saved.push_back(std::move(s));
    if (saved.size() > 8) saved.erase(saved.begin());
  }
  const Saved* FindSaved(uint64_t checkpoint_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const Saved& s : saved) {
      if (checkpoint_id != 0 && s.checkpoint_id == checkpoint_id) return &s;
    }
    return nullptr;
  }
  std::atomic<int64_t> nonfinite_dropped{0};
  // Null: not replicated. Fixed at creation; its fields under `mu`.
  std::unique_ptr<embedding_internal::SlotReplica> replica;
};

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_STORE_INTERNAL_H_
