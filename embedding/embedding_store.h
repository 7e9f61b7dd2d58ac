// EmbeddingStore: a shard's embedding tables, per job, with the job's
// consistency (docs/embeddings.md). The transport-free half of the shard's
// EmbeddingService: requests in, responses out, every field checked.
//
// Consistency, per shard and job:
// - ASYNC: an update is applied on arrival, scaled 1/num_workers (so one
//   round of every worker's updates moves the rows as one SYNC step does,
//   as for dense tables).
// - SYNC: updates of step s are summed per row until every rank has sent
//   its own, then applied once (their mean); a lookup for step s waits until
//   steps 0..s-1 are applied.
// - SSP: applied on arrival as ASYNC; a lookup for step s waits until every
//   other active rank has pushed steps 0..s-staleness-1 (SetWorkers says
//   which are active; all of them until it does).
// A rank's update for a step it already sent is ignored (a retry is safe).
//
// Replicated tables (InitEmbeddingsRequest.replicas, docs/replication.md):
// the rows of slot h (shard h's virtual shards) live on shards h..h+R; the
// first the routing does not mark lost leads, applies the updates and
// forwards the rows they changed to the slot's live backups before any
// caller sees them (an update's answer; under SYNC, the next step's
// lookups). A shard keeps one Job per slot it holds.
//
// Threading: any method from any thread. One mutex per job orders its
// steps; the tables below it lock their own stripes, so ASYNC lookups and
// updates of one job run in parallel. Waits block the calling thread (at
// most max_waiters at once per store, RESOURCE_EXHAUSTED beyond) until the
// step, the deadline, DropJob or Shutdown.
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_STORE_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_STORE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/byte_budget.h"
#include "embedding/embedding_files.h"
#include "proto/embedding.pb.h"

namespace pstrain {

struct EmbeddingStoreOptions {
  // The shard's memory budget (shared with its dense tables); null: none.
  ByteBudget* budget = nullptr;
  absl::Duration max_wait = absl::Minutes(30);
  size_t max_jobs = 1024;
  size_t max_waiters = 4096;
  int stripes = 64;
  // The most bytes one lookup may answer (its rows); past it the lookup is
  // refused before anything is allocated. pstrain-ps sets its gRPC message
  // limit.
  uint64_t max_response_bytes = uint64_t{256} << 20;
  // Replicated tables: sends a leader's forward to the shard at `target`
  // (ReplicateEmbeddings there), blocking, with a deadline of its own.
  // Unset: replicated tables are refused.
  std::function<absl::Status(const std::string& target, const ReplicateEmbeddingsRequest& request,
                             ReplicateEmbeddingsResponse* response)>
      forward;
};

class EmbeddingStore {
 public:
  explicit EmbeddingStore(EmbeddingStoreOptions options);
  ~EmbeddingStore();
  EmbeddingStore(const EmbeddingStore&) = delete;
  EmbeddingStore& operator=(const EmbeddingStore&) = delete;

  // Creates the job's tables, or keeps identical ones (created = false). A
  // request of a later attempt replaces the job's tables; of an earlier one,
  // ABORTED. Different tables under the same attempt: ALREADY_EXISTS.
  absl::Status Init(const InitEmbeddingsRequest& request, InitEmbeddingsResponse* response);
  absl::Status Lookup(const EmbeddingLookupRequest& request, absl::Time deadline, EmbeddingLookupResponse* response);
  absl::Status Update(const EmbeddingUpdateRequest& request);
  absl::Status Drop(const DropEmbeddingsRequest& request);
  absl::Status Stats(const EmbeddingStatsRequest& request, EmbeddingStatsResponse* response);
  // The coordinator's view of which ranks take part (the shard's dense
  // SetWorkers, passed on): SSP lookups wait for the active ranks only, so
  // a lost worker's rank does not hold the others. A request of another
  // attempt or rank count, or for a job without embeddings, changes
  // nothing. Its routing, of a higher generation than the last, says which
  // shards are lost: a slot's first live copy leads it from then on.
  // FAILED_PRECONDITION when the shard holds no slot of the job's attempt
  // (a hybrid job's shard holds nothing else: its SetWorkers is this one's).
  absl::Status SetWorkers(const SetWorkersRequest& request);
  // A slot leader's forwards, on one of the slot's backups: applied in seq
  // order, once each. ABORTED when the sender does not lead the slot under
  // this shard's routing (fenced), UNAVAILABLE when the sender's routing is
  // newer than this shard's (try again). A request whose first new forward
  // is not the next this shard needs applies none: OK, and response->seq
  // says what it holds. With copy_init or copy_rows: a spare's full copy
  // (embedding_store_copy.cc).
  absl::Status Replicate(const ReplicateEmbeddingsRequest& request, ReplicateEmbeddingsResponse* response);

  // Checkpoints (embedding_store_files.cc; paths absolute, confined by the
  // caller). Save writes this shard's rows of the job, each row from one
  // state, as checkpoint `checkpoint_id`; a SYNC job should be paused at a
  // step boundary. With `base_id`, a checkpoint whose rows this shard wrote
  // or loaded, the file is incremental: only the rows changed since are
  // written whole (a slot it has no record of the base for is written
  // whole). Load creates the job's tables (a new attempt: `request` as for
  // Init) from a chain of checkpoints' files (ReadEmbeddingChain) written
  // by any number of shards, keeping the rows this shard holds, and
  // continues at `start_step`; nothing is installed unless every file reads
  // whole (DATA_LOSS names the file that does not).
  absl::StatusOr<EmbeddingFileInfo> Save(const std::string& job, uint64_t attempt, const std::string& path,
                                         uint64_t checkpoint_id = 0, uint64_t base_id = 0);
  absl::Status Load(const InitEmbeddingsRequest& request, const std::vector<std::vector<std::string>>& chain,
                    int64_t start_step);

  // Fails waiting calls and every later call with UNAVAILABLE.
  void Shutdown();

 private:
  struct Job;
  // A lookup's or an update's job and its tables' ids, checked.
  struct Call {
    std::shared_ptr<Job> job;
    std::vector<int> tables;
    std::vector<std::vector<int64_t>> ids;
  };
  // Jobs by name and slot.
  using Key = std::pair<std::string, uint32_t>;
  template <typename Request>
  absl::StatusOr<Call> OpenCall(const Request& request);
  // The job's slot `*slot`, or this shard's own slot when null.
  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job, uint64_t attempt, const uint32_t* slot);
  // The job's slots on this shard, each continuing at `start_step` (0, or a
  // restored checkpoint's step): one, or with replicas every slot this
  // shard holds a copy of (embedding_store_replication.cc).
  absl::StatusOr<std::vector<std::shared_ptr<Job>>> MakeJobs(const InitEmbeddingsRequest& request,
                                                             int64_t start_step);
  // Slot `slot`'s tables and rank state from the job's Init request.
  absl::StatusOr<std::shared_ptr<Job>> MakeJob(const InitEmbeddingsRequest& request, uint32_t slot,
                                               int64_t start_step);
  // Puts a job's slots in place of an earlier attempt's, all or none;
  // identical ones of the same attempt are kept when `keep_identical`
  // (created = false).
  absl::Status Install(std::vector<std::shared_ptr<Job>> jobs, bool keep_identical, bool* created);
  // Replicated slots (embedding_store_replication.cc). FAILED_PRECONDITION
  // unless this shard leads the job's slot.
  static absl::Status CheckLeads(Job& job);
  // That FAILED_PRECONDITION, naming the slot's leader (job.mu held).
  static absl::Status NotLeading(const Job& job);
  // Queues a forward of `tables`' rows `ids` (held ones), made after an
  // update, and returns its seq; the job's mu held.
  static int64_t QueueForward(Job& job, const std::vector<int>& tables, const std::vector<std::vector<int64_t>>& ids,
                              EmbeddingForward forward);
  // Until every live backup holds forward `seq`: sends the queued forwards
  // (one caller at a time, for all) or waits for the caller who does.
  absl::Status AwaitForwarded(Job& job, int64_t seq);
  // One round: `batch` to each live backup in copy order (a spare first
  // gets a full copy of the slot).
  absl::Status SendRound(Job& job, const std::vector<EmbeddingForward>& batch);
  // The slot's state up to forward `base` and every row, to the spare
  // `backup` at `target`, in requests of at most a few MiB.
  absl::Status FullCopy(Job& job, uint32_t backup, const std::string& target, int64_t base);
  // A spare's side of FullCopy: (re)makes the slot from the copy's first
  // request, or inserts its rows.
  absl::Status ReceiveCopy(const ReplicateEmbeddingsRequest& request, ReplicateEmbeddingsResponse* response);
  // ReceiveCopy's rows after the first request, into the slot it made.
  absl::Status ReceiveCopyRows(const ReplicateEmbeddingsRequest& request, ReplicateEmbeddingsResponse* response);
  // A routing of a higher generation, for one slot (mu held).
  static void ApplyRouting(Job& job, const Routing& routing);
  static absl::Status ParseTables(const Job& job, const google::protobuf::RepeatedPtrField<EmbeddingIds>& in,
                                  std::vector<int>* tables, std::vector<std::vector<int64_t>>* ids);
  // SYNC (embedding_store_sync.cc): adds one rank's arrival (its gradients,
  // summing 1 + extra_batches batches, or none: empty) to the step's sums,
  // then CompleteSync. Replicated: *forwarded = the seq of the step's
  // forward (the completing arrival's).
  absl::Status AddSync(Job& job, const EmbeddingUpdateRequest& request, const std::vector<int>& tables,
                       const std::vector<std::vector<int64_t>>& ids, int64_t* forwarded);
  // Once every active rank has arrived (one at least), applies the step's
  // sums over the arrivals' batches and releases the step (job.mu held):
  // also when SetWorkers makes a rank that had not arrived vacant. The
  // error is an update's; OK when the step is not complete yet.
  absl::Status CompleteSync(Job& job, int64_t* forwarded);

  const EmbeddingStoreOptions options_;
  std::atomic<size_t> waiters_{0};
  absl::Mutex mu_;
  std::map<Key, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // The newest routing and seats SetWorkers brought, per job with slots
  // here: a slot a copy makes after SetWorkers took the slots it tells
  // gets them too.
  struct Told {
    uint64_t attempt = 0;
    Routing routing;
    std::vector<char> active;  // empty: none told
  };
  std::map<std::string, Told> routings_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_STORE_H_
