// GrpcEmbeddingClient: a worker's calls to the job's shards for its embedding
// tables. It routes each id to the shard its hash maps to (embedding/
// row_math.h), sends one request per shard carrying every table, in
// parallel, and puts the answers back in the caller's order.
//
// Ids given to Lookup and Update are the batch's unique ids per table (the
// worker deduplicates: one row pulled and one summed gradient pushed per
// id). Update goes to every shard every step, with no ids where it has none:
// a SYNC shard applies a step once every rank has sent it.
//
// Replicated tables (replicas > 0, docs/replication.md): the ids of shard
// h's virtual shards (slot h) go to the slot's leader, the first of shards
// h..h+R the coordinator's routing does not mark lost. A call that fails on
// a lost leader (UNAVAILABLE, or FAILED_PRECONDITION / ABORTED from a shard
// that no longer leads) waits for the next routing and goes to the slot's
// new leader, after the last update this worker sent the slot (which the
// old leader may have taken and not forwarded; where it did, the new leader
// ignores it as a retry). A call a lost shard does not answer (a stopped
// process) is cancelled once a routing says it is lost.
#ifndef PSTRAIN_RPC_GRPC_EMBEDDING_CLIENT_H_
#define PSTRAIN_RPC_GRPC_EMBEDDING_CLIENT_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/embedding.grpc.pb.h"

namespace pstrain {

struct EmbeddingClientOptions {
  std::string job;
  uint64_t attempt = 0;
  uint32_t rank = 0;
  std::string job_secret;                     // sent with every call (the shards check it)
  std::string table_grant;                    // sent with InitEmbeddings
  absl::Duration timeout = absl::Minutes(2);  // per call, its retries on new leaders included
  // Replicated tables: the copies per slot beyond the first, every shard's
  // address (in shard order, for Init's routing), and where the
  // coordinator's routings come from (as PsClientOptions::next_routing).
  uint32_t replicas = 0;
  std::vector<std::string> targets;
  std::function<absl::StatusOr<Routing>(uint64_t generation, absl::Duration wait)> next_routing;
  // When set and true, a call waiting for a new leader gives up (CANCELLED)
  // within a second: the job is stopping, its tables dropped, and no
  // routing will come.
  const std::atomic<bool>* stop = nullptr;
};

// What a lookup does to the rows it reads: a training step's touch (counts
// toward admission, creates admitted rows, moves them in the LRU order), or
// evaluation's read of the rows held, zeros for any other id, changing
// nothing (EmbeddingLookupRequest.read_only).
enum class EmbeddingLookupKind { kTrain, kReadOnly };

class GrpcEmbeddingClient {
 public:
  // `shards`: one channel per shard of the job, in shard order.
  GrpcEmbeddingClient(std::vector<std::shared_ptr<grpc::Channel>> shards, EmbeddingClientOptions options);

  // Creates the tables on every shard. `request` names the job's tables and
  // consistency; job, attempt and the shard fields are filled in here.
  absl::Status Init(InitEmbeddingsRequest request);

  // rows[t] = the rows of ids[t] (table t of Init's list), ids[t].size() x
  // dim floats, for step `step`.
  absl::Status Lookup(int64_t step, const std::vector<std::vector<int64_t>>& ids,
                      std::vector<std::vector<float>>* rows,
                      EmbeddingLookupKind kind = EmbeddingLookupKind::kTrain);
  // grads[t]: one gradient row (dim floats) per id of ids[t].
  // `extra_batches` and `empty`: SYNC, covering vacant ranks
  // (EmbeddingUpdateRequest's fields).
  absl::Status Update(int64_t step, const std::vector<std::vector<int64_t>>& ids,
                      const std::vector<const float*>& grads, uint32_t extra_batches = 0, bool empty = false);

  size_t num_shards() const { return stubs_.size(); }
  int dim(size_t table) const { return static_cast<int>(tables_[table].dim()); }
  // The routing generation the client follows (0 until a shard was lost).
  uint64_t routing_generation() const;

 private:
  // For each slot, table by table, the positions of ids[t] that go there.
  std::vector<std::vector<std::vector<uint32_t>>> Route(const std::vector<std::vector<int64_t>>& ids) const;
  std::unique_ptr<grpc::ClientContext> Context() const;
  bool replicated() const { return options_.replicas > 0; }
  // Sends requests[h] for each slot h of `slots` to the slot's leader, with
  // `call` (an async stub method), and on to new leaders (replicated) until
  // every slot answered, an error no routing mends, or the timeout.
  template <typename Request, typename Response, typename Call>
  absl::Status CallSlots(const std::vector<size_t>& slots, std::vector<Request>* requests,
                         std::vector<Response>* responses, Call call);
  // The last update sent to each slot whose leader changed, to its new one.
  absl::Status Resend(const std::vector<size_t>& slots, const std::vector<int64_t>& leader);
  // Waits (until `deadline`, at most a second) for a routing after `seen`.
  void AwaitRouting(uint64_t seen, absl::Time deadline);
  // Follows `next` if it is newer: each slot's leader, and which slots'
  // last update goes to a new leader first.
  void AdoptRouting(const Routing& next);

  const EmbeddingClientOptions options_;
  // One per shard (the vector's size is fixed); a spare at a new address
  // gets a new one (AdoptRouting, under mu_): callers take copies.
  std::vector<std::shared_ptr<EmbeddingService::Stub>> stubs_;
  std::vector<EmbeddingTableConfig> tables_;  // normalized, from Init
  mutable absl::Mutex mu_;
  Routing routing_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> leader_ ABSL_GUARDED_BY(mu_);  // per slot
  // Replicated: each slot's last update, and whether its leader changed since.
  std::vector<EmbeddingUpdateRequest> retained_ ABSL_GUARDED_BY(mu_);
  std::vector<char> resend_ ABSL_GUARDED_BY(mu_);
};

// The coordinator's call when a job's attempt ends: the shard behind
// `shard` frees the job's embedding tables (OK when it holds none). Sends
// `job_secret` as the shard's JobSecrets expect.
absl::Status DropEmbeddings(const std::shared_ptr<grpc::Channel>& shard, const std::string& job, uint64_t attempt,
                            const std::string& job_secret, absl::Duration timeout);

// The coordinator's checkpoint calls on the shard behind `shard`, with
// `job_secret` and a deadline. SaveEmbeddingsAsync returns at once; `done`
// runs once, on a gRPC thread, after *response (the caller's, kept until
// then) is filled. The call's context comes back, for TryCancel while the
// call is in flight (a no-op after).
std::shared_ptr<grpc::ClientContext> SaveEmbeddingsAsync(const std::shared_ptr<grpc::Channel>& shard,
                                                         const SaveEmbeddingsRequest& request,
                                                         const std::string& job_secret, absl::Time deadline,
                                                         SaveEmbeddingsResponse* response,
                                                         std::function<void(absl::Status)> done);
absl::Status LoadEmbeddings(const std::shared_ptr<grpc::Channel>& shard, const LoadEmbeddingsRequest& request,
                            const std::string& job_secret, absl::Time deadline);

// The Stats of the job's embedding tables on the shard behind `shard` (the
// coordinator's check that a spare caught up).
absl::StatusOr<EmbeddingStatsResponse> FetchEmbeddingStats(const std::shared_ptr<grpc::Channel>& shard,
                                                           const std::string& job, const std::string& job_secret,
                                                           absl::Time deadline);

// A slot leader's forward to the backup shard behind `shard` (replicated
// embedding tables; pstrain-ps's EmbeddingStoreOptions::forward).
absl::Status ReplicateEmbeddings(const std::shared_ptr<grpc::Channel>& shard, const ReplicateEmbeddingsRequest& request,
                                 const std::string& job_secret, absl::Time deadline,
                                 ReplicateEmbeddingsResponse* response);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_EMBEDDING_CLIENT_H_
