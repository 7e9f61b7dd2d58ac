// ShardStore's insides, shared by the files that implement it
// (shard_store.cc: tables and calls; shard_store_push.cc: applying a push
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

  // Published under mu, read by waiters without it.
  std::atomic<int64_t> version{0};
  std::atomic<int64_t> clock{-1};  // min over active ranks of last_step
  double pending_lr = 0;  // SYNC: the lr of the step in flight (0: the table's)
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
};

struct ShardStore::Waiter {
  std::shared_ptr<Table> table;
  std::vector<size_t> chunks;
  bool by_clock = false;
  int64_t threshold = 0;
  absl::Time deadline;
  StatusCallback ready;

  bool Satisfied() const {
    for (size_t c : chunks) {
      const Chunk& chunk = *table->chunks[c];
      int64_t v = by_clock ? chunk.clock.load(std::memory_order_acquire)
                           : chunk.version.load(std::memory_order_acquire);
      if (v < threshold) return false;
    }
    return true;
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
    return "";
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
// Back to the state of a fresh table (zeros; Adagrad's initial accumulator).
void ResetStateSet(const OptimizerConfig& optimizer, std::vector<TensorBuffer>& set);
// SYNC: whether the chunk's step is complete once `worker` (-1: nobody
// more) has arrived: every active rank has pushed it.
bool StepComplete(const ShardStore::Chunk& c, const std::vector<bool>& active, int worker = -1);
// ASYNC/SSP: the slowest active rank's last step (every rank's when none is
// active: nobody is left to wait for).
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
