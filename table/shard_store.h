// ShardStore: one parameter shard, in process. For each job it keeps a table
// of chunks (value, optimizer state, version) and applies the job's optimizer
// to pushed gradients under the job's consistency model.
//
// Threading: every method may be called from many threads at once. Each chunk
// has its own mutex; a push locks the chunks it touches in index order (so
// it applies all of them or none), pushes to disjoint chunks proceed in
// parallel; the table map and the waiter list have one mutex each, a
// table's seats one (seats_mu). Lock order: chunk mutexes (ascending index),
// then seats_mu, then mu_, then waiters_mu_. No
// callback (`done`, a waiter's `ready`) ever runs under any lock: a callback
// may call straight back into the store.
//
// Waiting (Pull with min_version, PushPull under SYNC or SSP) never blocks a
// thread: the call is parked as a waiter (at most max_waiters) and completed
// by the push that satisfies it, by the reaper thread at its deadline, or by
// Shutdown().
//
// Hostile input: every request is validated in full before anything is
// applied, so a bad request changes nothing. Requests of another attempt
// than the table's are refused (ABORTED for an earlier one). Files are read
// and written only under checkpoint_root. Memory for values and optimizer
// state is reserved against max_bytes before anything is allocated, and an
// allocation failure is RESOURCE_EXHAUSTED, never a throw.
//
// Where the code is: the class spreads over nine files, and its methods
// below are grouped under "---" headers naming the file of each group. The
// chunk, table and waiter structs, and the optimizer and chunk helpers, are
// in shard_store_internal.h (map at its top).
#ifndef PSTRAIN_TABLE_SHARD_STORE_H_
#define PSTRAIN_TABLE_SHARD_STORE_H_

#include <atomic>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/byte_budget.h"
#include "table/parameter_store.h"

namespace pstrain {

struct ShardStoreOptions {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  // Upper bound on any wait, whatever deadline the caller gave.
  absl::Duration max_wait = absl::Minutes(30);
  // Absolute, symlink-free directory (CanonicalRoot) that SaveTable and
  // LoadTable names are relative to; empty: checkpoints are refused.
  std::string checkpoint_root;
  // Bytes of values, optimizer state and SYNC accumulators all tables may
  // reserve (each table reserves its worst case when created); 0: 80% of
  // the machine's physical memory.
  uint64_t max_bytes = 0;
  // The budget max_bytes sets, when the shard shares it with its embedding
  // tables (not owned; must outlive the store; its max() is then the cap);
  // null: the store keeps its own.
  ByteBudget* budget = nullptr;
  size_t max_tables = 1024;
  size_t max_waiters = 65536;
  // Fault injection for tests: runs at the start of every PushAsync and PushPullAsync,
  // before anything is looked up (a push held here is one delayed on the
  // network). Must not call back into the store.
  std::function<void(const std::string& job, uint64_t attempt, uint32_t worker, int64_t step)> before_push;
  // Fault injection for tests: runs in every PushAsync and PushPullAsync after the
  // push's checks (the pusher's seat among them) and validation, just before
  // it locks its chunks, with no lock held: it may call back into the store
  // (a SetWorkersAsync that replaces the pusher in the window).
  std::function<void(const std::string& job, uint32_t worker, uint32_t generation)> before_push_locks;
  // Replicated tables (docs/replication.md): sends a primary's forward to
  // the backup shard at `target` (Routing.targets) and runs `done` once;
  // `request`, `tensors` and `response` live until then. The job's secret
  // is the forwarder's business (server/ps looks it up). Unset: replicated
  // tables are refused (FAILED_PRECONDITION).
  std::function<void(const std::string& target, const ReplicateRequest& request,
                     const std::vector<TensorBuffer>& tensors, ReplicateResponse* response, StatusCallback done)>
      forward;
  // Tensor bytes one forward carries at most (at least one chunk).
  uint64_t max_forward_bytes = uint64_t{32} << 20;
};

// What a shard may hold when --max_memory_mb is 0: 80% of the machine's
// physical memory.
uint64_t DefaultShardMaxBytes();

// Limits on what one request may ask for (docs/errors.md says them).
inline constexpr uint32_t kMaxTableWorkers = 4096;
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxJobBytes = 256;
inline constexpr int64_t kMaxStep = int64_t{1} << 40;
// A worker's push may be at most this many steps ahead of the chunk's version.
inline constexpr int64_t kMaxStepAhead = int64_t{1} << 20;
inline constexpr int kMaxCheckpointFiles = 4096;

class ShardStore : public ParameterStore {
 public:
  // --- Lifecycle: constructor, destructor (shard_store.cc); Shutdown
  // (shard_store_waiters.cc, as it fails the parked calls).
  explicit ShardStore(ShardStoreOptions options);
  ~ShardStore() override;

  // Fails waiting calls and every later call with UNAVAILABLE. Idempotent.
  void Shutdown();

  // --- Tables and calls (shard_store.cc; InitTableAsync in
  // shard_store_init.cc); a push itself is applied in shard_store_push.cc,
  // a parked Pull or PushPull completed in shard_store_waiters.cc.
  void InitTableAsync(const InitTableRequest& request, std::vector<TensorBuffer> values,
                      InitTableResponse* response, const CallOptions& options,
                      StatusCallback done) override;
  void PullAsync(const PullRequest& request, PullResponse* response, std::vector<TensorBuffer>* values,
                 const CallOptions& options, StatusCallback done) override;
  void PushAsync(const PushRequest& request, std::vector<TensorBuffer> grads, PushResponse* response,
                 const CallOptions& options, StatusCallback done) override;
  void PushPullAsync(const PushPullRequest& request, std::vector<TensorBuffer> grads,
                     PushPullResponse* response, std::vector<TensorBuffer>* values,
                     const CallOptions& options, StatusCallback done) override;
  void StatsAsync(const StatsRequest& request, StatsResponse* response, const CallOptions& options,
                  StatusCallback done) override;
  void DropTableAsync(const DropTableRequest& request, DropTableResponse* response,
                      const CallOptions& options, StatusCallback done) override;

  // --- Checkpoint files (shard_store_files.cc).
  // Run on the calling thread (file I/O): `done` has run when they return.
  // They keep the interface's Async names, which a remote store's calls
  // need. Callers are the gRPC service (one call per checkpoint) and tests.
  void SaveTableAsync(const SaveTableRequest& request, SaveTableResponse* response,
                      const CallOptions& options, StatusCallback done) override;
  void LoadTableAsync(const LoadTableRequest& request, LoadTableResponse* response,
                      const CallOptions& options, StatusCallback done) override;

  // --- Seats (shard_store_seats.cc).
  // Applies the coordinator's view of the job's ranks (see WorkerSeat); a
  // seat's generation never goes back (a late, older view of a rank is
  // ignored for that rank).
  // Whether the shard holds a table of `job` (any attempt).
  bool HoldsTable(const std::string& job);
  void SetWorkersAsync(const SetWorkersRequest& request, SetWorkersResponse* response,
                       const CallOptions& options, StatusCallback done) override;

  // --- Replicated tables (shard_store_replication.cc).
  // A backup applies its primary's updated chunks (ReplicateRequest): in
  // order and at most once each (ReplicatedChunk.seq), only from the
  // chunk's primary under the current routing (ABORTED otherwise: a
  // replaced primary is fenced).
  void ReplicateAsync(const ReplicateRequest& request, std::vector<TensorBuffer> tensors,
                      ReplicateResponse* response, const CallOptions& options, StatusCallback done) override;

  // Bytes reserved by the tables now (values, state, accumulators).
  uint64_t reserved_bytes() const { return budget_->used(); }

  // --- Chunk export and import (shard_store_files.cc); blocking.
  // A caller's buffer of one chunk's elements: typed by construction (a
  // table keeps float32 or float64), so the store can check dtype and count
  // against the chunk before it copies a byte. Not owned: the caller keeps
  // it alive for the call.
  class ElementSpan {
   public:
    ElementSpan() = default;
    ElementSpan(float* data, size_t numel) : dtype_(DT_FLOAT32), data_(data), numel_(numel) {}
    ElementSpan(double* data, size_t numel) : dtype_(DT_FLOAT64), data_(data), numel_(numel) {}
    DataType dtype() const { return dtype_; }
    void* data() const { return data_; }
    size_t numel() const { return numel_; }

   private:
    DataType dtype_ = DT_INVALID;
    void* data_ = nullptr;
    size_t numel_ = 0;
  };
  // For an in-process owner that applies the optimizer itself (an all-reduce
  // worker whose model is on a GPU) and keeps this store as its checkpoint
  // format: the values and optimizer state (set 0) of chunks copied out, or
  // in. `slots`: one buffer per optimizer state slot. A buffer of another
  // dtype or element count than its chunk is INVALID_ARGUMENT. Import
  // replaces values and state as one update of `optimizer_step` updates in
  // all, the last at `step`.
  struct ChunkState {
    std::string key;
    ElementSpan value;
    std::vector<ElementSpan> slots;
    int64_t optimizer_step = 0;  // updates applied to the state so far
  };
  absl::Status ExportChunks(const std::string& job, std::vector<ChunkState>* chunks);
  absl::Status ImportChunks(const std::string& job, const std::vector<ChunkState>& chunks, int64_t step);

  // Opaque here: defined in shard_store_internal.h, which only this
  // library's files include.
  struct Chunk;
  struct Table;
  struct Waiter;

 private:
  // --- The table map and request checks (shard_store.cc).
  absl::Status ShutdownStatus();
  // What InitTableAsync and LoadTableAsync check first: not shutting down, a job name
  // and keys within bounds, a config within range (defaults filled in).
  absl::Status ValidateTableRequest(const std::string& job,
                                    const google::protobuf::RepeatedPtrField<std::string>& keys,
                                    TableConfig* config);
  absl::Status CheckAttempt(const Table& table, uint64_t attempt) const;
  absl::StatusOr<std::shared_ptr<Table>> FindTable(const std::string& job, uint64_t attempt);
  // A new empty table with `bytes` reserved against max_bytes.
  absl::StatusOr<std::shared_ptr<Table>> NewTable(const std::string& job, uint64_t attempt,
                                                  const TableConfig& config, uint64_t bytes);
  // Puts `table` in the map: replaces a table of an earlier attempt (whose
  // waiters fail with ABORTED); with an equal attempt keeps an identical
  // existing one (keep_identical, *created = false) or fails.
  absl::StatusOr<std::shared_ptr<Table>> Install(std::shared_ptr<Table> table, bool keep_identical,
                                                 bool* created);
  absl::StatusOr<std::vector<size_t>> ResolveKeys(
      const Table& table, const google::protobuf::RepeatedPtrField<std::string>& keys);
  // --- Making tables (shard_store_init.cc).
  // A chunk holding a copy of `value` (`pending`: zeros of its layout, a
  // pipelined table's key whose stage has not given its value yet); its
  // optimizer state sets are allocated on first use.
  static absl::StatusOr<std::unique_ptr<Chunk>> NewChunk(const std::string& key, const TensorBuffer& value,
                                                         const TableConfig& config, bool pending = false);

  // A pipelined InitTable's values, one per key: its own stage's as given,
  // the other keys' as layouts without data (`pending`; dtype and shape
  // checked, nbytes set).
  static absl::StatusOr<std::vector<TensorBuffer>> PipelinedInitValues(const InitTableRequest& request,
                                                                       std::vector<TensorBuffer> values,
                                                                       std::vector<bool>* pending);
  // Into a pipelined table with the request's layout: the stage of the
  // request's own keys (a restored table learns them here; a key of
  // another stage is ALREADY_EXISTS) and their values where still pending.
  // All or nothing.
  static absl::Status FillStage(Table& table, const InitTableRequest& request, const std::vector<TensorBuffer>& values);

  // --- Restoring from checkpoint files (shard_store_files.cc).
  // A chunk restored from its checkpoint snapshot (read from a table of
  // config `old`) into a table of `config`.
  static absl::StatusOr<std::unique_ptr<Chunk>> RestoreChunk(const std::string& key, const ChunkSnapshot& c,
                                                             const TableConfig& old, const TableConfig& config);
  // LoadTableAsync's checks before any file is read; the files' resolved paths.
  absl::StatusOr<std::vector<std::string>> CheckLoadRequest(const LoadTableRequest& request, TableConfig* config);

  // --- Applying a push (shard_store_push.cc).
  class PushTransaction;
  struct PushInput {
    std::string job;
    uint32_t worker = 0;
    uint32_t generation = 0;  // the pusher's hold on its rank
    int64_t step = 0;
    double lr = 0;  // 0: the table's
    const google::protobuf::RepeatedPtrField<std::string>* keys = nullptr;
    const std::vector<TensorBuffer>* grads = nullptr;
    uint32_t extra_batches = 0;  // see PushRequest
    bool empty = false;
  };
  // `seqs` (may be null): each chunk's seq after the push, what a caller
  // of a replicated table waits for its backups to hold.
  absl::Status ApplyPush(Table& table, const PushInput& in, std::vector<size_t>* chunks,
                         PushResponse* response, std::vector<int64_t>* seqs = nullptr);

  // --- Replicated tables (shard_store_replication.cc).
  // InitTable's (or LoadTable's) copies and routing, checked and kept with
  // the table.
  template <typename Request>
  absl::Status SetUpReplica(Table& table, const Request& request);
  // A newer routing (SetWorkers): who leads and backs up each chunk; a
  // chunk newly led here is copied in full to its backups.
  void ApplyRouting(const std::shared_ptr<Table>& table, const Routing& routing);
  // Stats of a replicated table: routing, leading, forwarding.
  void FillReplicationStats(const Table& table, ReplicationStats* stats) const;
  // Pushes and pulls of a replicated table go to each chunk's primary only.
  absl::Status CheckLeads(const Table& table, const std::vector<size_t>& chunks) const;
  void KickReplication();
  void ReplicationLoop();
  // One forward to backup `peer` of the chunks it lacks; false if none.
  bool StartForward(const std::shared_ptr<Table>& table, uint32_t peer);
  // A forward checked whole (shard_store_backup.cc), under the table's
  // replica mutex: the index of each of its chunks.
  absl::StatusOr<std::vector<size_t>> CheckForward(const Table& table, const ReplicateRequest& request,
                                                   const std::vector<TensorBuffer>& tensors) const;
  // ReplicateAsync's work, under the table's replica mutex.
  absl::Status ApplyForward(const ReplicateRequest& request, const std::vector<TensorBuffer>& tensors,
                            ReplicateResponse* response);

  // --- Parked calls and handing out values (shard_store_waiters.cc).
  void AbortWaiters(const std::shared_ptr<Table>& table, const std::string& why);
  // `value_dtype`: as PullRequest.value_dtype. `vacant`: the first chunk's
  // view (PullResponse.vacant_ranks).
  void Snapshot(Table& table, const std::vector<size_t>& chunks, DataType value_dtype,
                google::protobuf::RepeatedField<int64_t>* versions, std::vector<TensorBuffer>* values,
                google::protobuf::RepeatedField<uint32_t>* vacant);
  // Runs `ready(OkStatus())` once every chunk's version (or, with by_clock,
  // its slowest worker's last step) is >= threshold; ready(error) at the
  // deadline, on shutdown, or at once when max_waiters are parked.
  void WhenReadyAsync(std::shared_ptr<Table> table, std::vector<size_t> chunks, bool by_clock,
                      int64_t threshold, absl::Time deadline, StatusCallback ready,
                      std::vector<int64_t> ack_seqs = {});
  void NotifyWaiters();
  void ReaperLoop();

  const ShardStoreOptions options_;
  std::unique_ptr<ByteBudget> own_budget_;
  ByteBudget* budget_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);

  absl::Mutex waiters_mu_;
  absl::CondVar waiters_cv_;
  std::list<std::shared_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(waiters_mu_);
  bool shutdown_ ABSL_GUARDED_BY(waiters_mu_) = false;
  std::thread reaper_;

  absl::Mutex repl_mu_;
  bool repl_kicked_ ABSL_GUARDED_BY(repl_mu_) = false;
  bool repl_stop_ ABSL_GUARDED_BY(repl_mu_) = false;
  std::thread replicator_;
};

// Checks a table config against the ranges that make sense (docs/errors.md), filling
// in defaults. INVALID_ARGUMENT naming the field otherwise.
// (shard_store_internal.cc, beside the optimizer math it guards.)
absl::Status ValidateTableConfig(TableConfig* config);

}  // namespace pstrain

#endif  // PSTRAIN_TABLE_SHARD_STORE_H_
