// ShardStore's insides, shared by the files that implement it
// (shard_store.cc: tables and calls; shard_store_init.cc: making tables,
// pipelined ones too; shard_store_push.cc: applying a push
// under the three consistency models; shard_store_waiters.cc: parked
// calls; shard_store_files.cc: checkpoint files and chunk export;
// shard_store_seats.cc: who holds a job's ranks). Not a public header: only
// this library includes it.
//
// Where the code is: the structs below are plain data, used by all of
// those files; every function in shard_internal (and ValidateTableConfig)
// is in shard_store_internal.cc.
#ifndef PSTRAIN_TABLE_SHARD_STORE_INTERNAL_H_
#define PSTRAIN_TABLE_SHARD_STORE_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "table/optimizer.h"
#include "table/shard_store.h"

namespace pstrain {

struct ShardStore::Chunk {
  std::string key;
  DataType dtype = DT_INVALID;
  std::vector<int64_t> shape;
  size_t numel = 0;

  // A std::mutex, where the store's other locks are absl::Mutex: a push
  // holds a set of chunk locks chosen at runtime (its keys), kept as a
  // vector of std::unique_lock taken in index order (ApplyPush).
  // absl::MutexLock cannot be moved into a vector, and the thread-safety
  // analysis cannot name a lock picked from a runtime set, so
  // ABSL_GUARDED_BY could not be checked on the fields below anyway.
  // It guards every field below (the atomics are also read without it).
  std::mutex mu;
  TensorBuffer value;  // replaced under mu (copy-on-write), never written in place
  // The previous value once no reader holds it: the next update is written
  // here and swapped in, so updates allocate nothing in the steady state.
  TensorBuffer spare;
  // Optimizer state buffers: state[k][slot], with k the worker under ASYNC
  // and SSP (see TableConfig.shared_async_state), else one set (k = 0). A
  // set is allocated on its worker's first push (its bytes were reserved
  // with the table); an empty set has not been used yet.
  std::vector<std::vector<TensorBuffer>> state;
  std::vector<int64_t> optimizer_step;  // updates applied through state[k]
  TensorBuffer accum;                   // SYNC: sum of this step's gradients
  std::vector<int64_t> last_step;       // per worker; -1 before its first push
  std::vector<bool> arrived;            // SYNC: worker pushed the current step
  uint32_t arrivals = 0;
  uint32_t batches = 0;                 // SYNC: batches the step's pushes sum
  // SYNC: the ranks inactive when the latest step completed (what the
  // workers read to cover their batches in the next one).
  std::vector<uint32_t> vacant_at_version;

  // A pipelined table's (TableConfig.pipeline_stages): the stages P and
  // this key's stage, which only ranks r with r % P == stage push. `stage`
  // is told by its stage's InitTables (under mu), `pending` until then:
  // such a chunk refuses pushes, pulls and saves (a restored one has its
  // value but no stage: it refuses pushes). Read without mu by checks.
  uint32_t stages = 1;
  std::atomic<uint32_t> stage{0};
  std::atomic<bool> stage_known{false};
  std::atomic<bool> pending{false};
  // Whether rank r pushes this chunk.
  bool PushedBy(size_t r) const { return stages <= 1 || r % stages == stage.load(std::memory_order_acquire); }

  // Published under mu, read by waiters without it.
  std::atomic<int64_t> version{0};
  std::atomic<int64_t> clock{-1};  // min over active ranks of last_step
  double pending_lr = 0;  // SYNC: the lr of the step in flight (0: the table's)

  // Replicated tables (shard_store_replication.cc). `seq` counts the
  // chunk's mutations (MarkChanged); set_seq[k]: the seq at which state
  // set k last changed (what a forward to a backup that has an earlier seq
  // must carry). Under mu.
  int64_t seq = 0;
  std::vector<int64_t> set_seq;
  uint64_t term = 0;  // a backup's: the routing generation of the last forward applied
  // Whether this shard leads the chunk (serves its pushes and pulls), and
  // whether callers then wait for its backups (acked_*: the newest seq and
  // version every live backup holds). Written under the table's replica
  // mutex, read without it.
  std::atomic<bool> led{true};
  std::atomic<bool> awaits_ack{false};
  std::atomic<int64_t> acked_seq{0};
  std::atomic<int64_t> acked_version{0};
};

struct ShardStore::Table {
  std::string job;
  uint64_t attempt = 0;  // see InitTableRequest.attempt
  TableConfig config;
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::unordered_map<std::string, size_t> index;

  // Returned to the store's budget when the last reference goes.
  ByteBudget* budget = nullptr;
  uint64_t reserved = 0;
  ~Table() {
    if (budget != nullptr) budget->Release(reserved);
  }

  std::atomic<uint64_t> pushes_applied{0};
  std::atomic<uint64_t> pushes_duplicate{0};
  std::atomic<uint64_t> grads_skipped{0};
  std::atomic<uint64_t> updates_nonfinite{0};
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> bytes_pushed{0};
  std::atomic<uint64_t> bytes_pulled{0};

  // Who holds each rank (SetWorkersAsync). A push reads it (the pusher's seat
  // and the active ranks) under its chunk locks, and SetWorkersAsync changes it
  // before it locks any chunk, so a step is completed by whichever of them
  // comes last, and a holder replaced before a push took its locks is
  // refused. Lock order: chunk mutexes, then seats_mu.
  struct Seat {
    bool active = true;
    uint32_t generation = 0;
  };
  mutable absl::Mutex seats_mu;
  std::vector<Seat> seats ABSL_GUARDED_BY(seats_mu);
  // Which ranks are active now.
  std::vector<bool> Active() const {
    absl::MutexLock lock(&seats_mu);
    std::vector<bool> out;
    for (const Seat& seat : seats) out.push_back(seat.active);
    return out;
  }

  // Replicated tables (shard_store_replication.cc): what this shard knows
  // of the other copies. Lock order: replica->mu, then chunk mutexes (a
  // push never takes it: it reads the chunks' atomics).
  struct Peer {  // a backup of chunks led here
    bool in_flight = false;
    int failures = 0;  // forwards failed in a row
    absl::Time next_try = absl::InfinitePast();
    std::vector<int64_t> acked_seq;      // per chunk; -1: unknown (a full copy next)
    std::vector<int64_t> acked_version;  // per chunk, at acked_seq
  };
  struct Replica {
    uint32_t self = 0;
    std::vector<std::vector<uint32_t>> copies;  // per chunk: primary, then backups
    absl::Mutex mu;
    Routing routing ABSL_GUARDED_BY(mu);
    std::vector<std::vector<uint32_t>> backups ABSL_GUARDED_BY(mu);  // per chunk led here, its live backups
    std::map<uint32_t, Peer> peers ABSL_GUARDED_BY(mu);
    std::string fenced ABSL_GUARDED_BY(mu);  // why this shard may no longer lead; empty: it may
    // Chunks a backup refused this shard as the primary of (it holds a
    // newer routing), and why; until a routing says this shard leads them.
    std::map<size_t, std::string> fenced_chunks ABSL_GUARDED_BY(mu);
    std::atomic<uint64_t> forwards{0};
    std::atomic<uint64_t> forward_bytes{0};
    std::atomic<uint64_t> forward_failures{0};
    std::atomic<uint64_t> chunks_applied{0};  // as a backup
  };
  std::unique_ptr<Replica> replica;  // null: not replicated
};

struct ShardStore::Waiter {
  std::shared_ptr<Table> table;
  std::vector<size_t> chunks;
  bool by_clock = false;
  int64_t threshold = 0;
  // Replicated tables: per chunk, the seq its backups must hold (the
  // caller's own push); empty: none. A version threshold of a chunk whose
  // backups are awaited counts the version they hold.
  std::vector<int64_t> ack_seqs;
  absl::Time deadline;
  StatusCallback ready;

  bool Satisfied() const {
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& chunk = *table->chunks[chunks[i]];
      const bool ack = chunk.awaits_ack.load(std::memory_order_acquire);
      int64_t v = by_clock ? chunk.clock.load(std::memory_order_acquire)
                           : (ack ? chunk.acked_version : chunk.version).load(std::memory_order_acquire);
      if (v < threshold) return false;
      if (ack && i < ack_seqs.size() && chunk.acked_seq.load(std::memory_order_acquire) < ack_seqs[i]) return false;
    }
    return true;
  }

  // A chunk whose update this caller waits to see acknowledged, and which
  // this shard stopped leading before its backups had it (a routing handed
  // it to another copy meanwhile): nothing here will acknowledge it any
  // more; the caller sends the update to the new leader (a duplicate there
  // if it already arrived). Empty: none.
  std::string Moved() const {
    for (size_t i = 0; i < chunks.size() && i < ack_seqs.size(); ++i) {
      const Chunk& chunk = *table->chunks[chunks[i]];
      if (!chunk.led.load(std::memory_order_acquire) &&
          chunk.acked_seq.load(std::memory_order_acquire) < ack_seqs[i]) {
        return absl::StrCat("key ", Quote(chunk.key), " is led by another shard since a newer routing, and its "
                            "backups had not confirmed this update: send it to the key's leader");
      }
    }
    return "";
  }

  // Names the first chunk that is behind, for a message a person can act on.
  std::string Lagging() const {
    for (size_t c : chunks) {
      const Chunk& chunk = *table->chunks[c];
      int64_t v = by_clock ? chunk.clock.load() : chunk.version.load();
      if (v < threshold) {
        return absl::StrCat("key ", Quote(chunk.key), " is at ", by_clock ? "worker step " : "version ", v,
                            ", waited for ", threshold);
      }
    }
    return "its backup shards have not confirmed the update (a backup is slow or lost)";
  }
};

namespace shard_internal {

absl::Status Unavailable();
bool IsFinite(const TensorBuffer& t);
// PullRequest.value_dtype: as stored, float32, or a narrow wire dtype.
absl::Status CheckValueDtype(DataType dtype);
// Gradients that came narrow (the job's wire_dtype) become float32 before
// anything else looks at them: the table keeps float32 values and state.
absl::Status WidenNarrowGradients(std::vector<TensorBuffer>& grads);

// dst (numel elements of T) += src, which may be in pieces.
template <typename T>
void AddInto(uint8_t* dst, const TensorBuffer& src) {
  ForEachRun(src, sizeof(T), [dst](size_t first, const uint8_t* p, size_t n) {
    T* d = reinterpret_cast<T*>(dst) + first;
    for (size_t i = 0; i < n; ++i) {
      T s;  // p may be unaligned
      std::memcpy(&s, p + i * sizeof(T), sizeof(T));
      d[i] += s;
    }
  });
}

absl::StatusOr<TensorBuffer> Zeros(DataType dtype, const std::vector<int64_t>& shape);
absl::StatusOr<TensorBuffer> CopyBuffer(const TensorBuffer& from);
// A fresh optimizer state set for a chunk of this dtype and shape.
absl::StatusOr<std::vector<TensorBuffer>> NewStateSet(const OptimizerConfig& optimizer, DataType dtype,
                                                      const std::vector<int64_t>& shape);
// One update of a chunk: the new value into `out` (a buffer no reader
// holds), the optimizer state in place. Returns whether the new value and
// state are finite (checked in the same pass); if not, `out` must not be
// installed and the state must be reset (ResetStateSet).
// `grad` may be in pieces.
bool ComputeUpdate(const OptimizerConfig& config, int64_t step, const TensorBuffer& value, const TensorBuffer& grad,
                   const std::vector<TensorBuffer>& state, double scale, TensorBuffer* out);
// Records a mutation of the chunk (and of its state set `set`, if >= 0)
// for its backups (see Chunk::seq). Under the chunk's lock.
void MarkChanged(ShardStore::Chunk& c, int set = -1);
// A routing's bounds, for a table whose routing names `targets` shards.
// (shard_store_replication.cc)
absl::Status ValidateRouting(const Routing& routing, int targets);
// A replicated chunk's leader under `r`: its first copy that is neither
// lost nor catching up (a shard that came back empty); -1 if none is left.
int64_t LeaderOf(const std::vector<uint32_t>& copies, const Routing& r);
// Back to the state of a fresh table (zeros; Adagrad's initial accumulator).
void ResetStateSet(const OptimizerConfig& optimizer, std::vector<TensorBuffer>& set);
// A pipelined table's chunk: FAILED_PRECONDITION while it waits for its
// stage's value (a pusher, `worker` >= 0: or, restored, for its stage),
// INVALID_ARGUMENT when the pusher is not of its stage. OK otherwise (a
// puller: worker -1).
absl::Status CheckStagePusher(const ShardStore::Chunk& c, int64_t worker);
// The stages of a pipelined table (at least 1).
uint32_t PipelineStages(const TableConfig& config);
// Optimizer state sets a chunk may hold: one per replica of a stage under
// ASYNC/SSP (unless shared), else one; and the set rank `worker` uses.
uint32_t StateSets(const TableConfig& config);
size_t StateSetOf(const TableConfig& config, uint32_t worker);
// SYNC: whether the chunk's step is complete once `worker` (-1: nobody
// more) has arrived: every active rank that pushes it has.
bool StepComplete(const ShardStore::Chunk& c, const std::vector<bool>& active, int worker = -1);
// ASYNC/SSP: the slowest active rank's last step among those that push the
// chunk (every rank's when none is active: nobody is left to wait for).
int64_t ActiveClock(const ShardStore::Chunk& c, const std::vector<bool>& active);
// A buffer for the chunk's next value: its spare if no reader holds it.
absl::StatusOr<TensorBuffer> TakeSpare(ShardStore::Chunk& c);
// The chunk's optimizer state set k, allocated on first use.
absl::Status EnsureStateSet(ShardStore::Chunk& c, size_t k, const OptimizerConfig& optimizer);
// SYNC: applies the mean of the step's arrivals (their sum over the
// batches they carry) through `value` (the chunk's spare, from TakeSpare)
// and opens the next step, recording which ranks were inactive (`active`,
// the view the step completed under); a non-finite result is dropped and
// the state restarts. Under the chunk's lock.
void CompleteSyncStep(ShardStore::Table& table, ShardStore::Chunk& c, TensorBuffer& value,
                      const std::vector<bool>& active);

// Bytes a table of these chunk sizes may come to hold: values and their
// spare buffers (updates are written beside the value, then swapped in),
// optimizer state for every set it may allocate, SYNC accumulators.
uint64_t WorstCaseBytes(const TableConfig& config, uint64_t value_bytes);

}  // namespace shard_internal
}  // namespace pstrain

#endif  // PSTRAIN_TABLE_SHARD_STORE_INTERNAL_H_
