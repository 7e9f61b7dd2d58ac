// PsClient: a worker's view of a sharded parameter table. It cuts LibTorch
// parameters into the chunks of a PartitionPlan and talks to every shard in
// parallel: one request per shard per operation, all shards in flight at
// once. Outgoing chunk bytes are views of the parameters and gradients
// themselves (no copy); pulled values are copied once, into the parameters.
//
// Not thread-safe: one training loop drives one PsClient. The tensors passed
// in must stay alive and unmodified until the call returns.
#ifndef PSTRAIN_WORKER_PS_CLIENT_H_
#define PSTRAIN_WORKER_PS_CLIENT_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/partition_plan.h"
#include "table/parameter_store.h"

namespace pstrain {

class Activity;

struct PsClientOptions {
  std::string job;
  uint64_t attempt = 0;  // the job's attempt, carried by every request
  uint32_t worker = 0;
  uint32_t generation = 0;  // this worker's hold on its rank (Assignment.generation)
  std::string job_secret;   // Assignment.job_secret, sent with every call
  std::string table_grant;  // Assignment.table_grant, sent with InitTable
  // The job's wire_dtype: gradients go out and values come back in it
  // (DT_FLOAT32: as they are; DT_BFLOAT16/DT_FLOAT16: narrowed, the shards
  // keep float32). With error_feedback, what rounding loses from each
  // gradient is added to the next one (one gradient of memory).
  DataType wire_dtype = DT_FLOAT32;
  bool error_feedback = false;
  PartitionPlan plan;
  // A pipelined job's rank (docs/pipeline.md): `plan` holds its stage's
  // parameters only (RestrictPlan of whole_plan). InitTables names every
  // key whole_plan puts on a shard and gives the values of this stage's
  // (InitTableRequest.own_keys); other calls skip the shards that hold
  // none of this stage's chunks. whole_plan.num_shards 0: not pipelined.
  PartitionPlan whole_plan;
  uint32_t stage = 0;
  // Deadline of each operation (all shards together).
  absl::Duration timeout = absl::Seconds(120);
  // The job's stop flag (not owned; may be null): once it is true, a call
  // that failed on a lost shard fails CANCELLED instead of waiting for a
  // newer routing until `timeout` (a cancelled job stops within a second).
  const std::atomic<bool>* stop = nullptr;
  // PushPullAsync cuts a shard's part of a bucket into requests of at most
  // this many value bytes (whole chunks; at least one), so values of the
  // first come back while the later still go out.
  size_t max_request_bytes = 1 << 20;
  // PushPullAsync's requests in flight to one shard at a time (0: no
  // limit); the rest wait their turn, in order. On one HTTP/2 connection
  // concurrent requests share the link frame by frame and all finish
  // together; taking turns, the first part's values come back while the
  // next part goes out.
  int max_in_flight_per_shard = 0;
  // Told of every shard call's start and end (not owned; may be null).
  Activity* activity = nullptr;
  // Replicated shards (plan.replicas > 0; docs/replication.md): host:port
  // of each shard (the tables' routing), and where the coordinator's newer
  // routings come from: the first one after `generation`, waiting up to
  // `wait` (NOT_FOUND: none yet). A call that failed on a lost shard is then
  // tried again where the new routing says, until `timeout`. Unset: a
  // shard's failure fails the call.
  std::vector<std::string> shard_targets;
  std::function<absl::StatusOr<Routing>(uint64_t generation, absl::Duration wait)> next_routing;
  // A client for a shard that took a lost one's place at a new address
  // (the routing's targets); it must outlive the PsClient. Unset: a new
  // address is not followed.
  std::function<ParameterStore*(const std::string& target)> connect;
};

class PsClient {
 public:
  // `shards[i]` serves shard i of the plan; not owned, must outlive the client.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(PsClientOptions options, std::vector<ParameterStore*> shards);

  // Creates every shard's table from `params` (idempotent for identical
  // tables, so every worker may call it with the same seeded values).
  absl::Status InitTables(const std::vector<at::Tensor>& params, const TableConfig& config);
  // Copies the shards' values into `params`, waiting for min_version (or
  // min_worker_steps: see PullRequest).
  absl::Status Pull(const std::vector<at::Tensor>& params, int64_t min_version = 0, int64_t min_worker_steps = 0);
  // `lr` > 0 overrides the table's learning rate for this update (schedules).
  absl::Status Push(int64_t step, const std::vector<at::Tensor>& grads, double lr = 0);
  // Push, then the new values into `params`, in one round trip per shard.
  absl::Status PushPull(int64_t step, const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& params,
                        double lr = 0);

  // PushPull of some parameters (a bucket), asynchronous: pushes grads[k]
  // (the gradient of parameter params[k]) to the shards holding its chunks,
  // one request per shard, and writes the new values into intos[k] (same
  // shape; may be the parameter itself if nothing reads it meanwhile). `done`
  // runs once, on a gRPC thread, when every shard involved has answered. Lets
  // a worker push gradients as soon as autograd produces them. The tensors
  // must stay alive until `done`. Under a narrow wire dtype a float32
  // parameter's gradient and destination may be in the wire dtype already
  // (narrowed, and to be widened, by the caller -- on a GPU, say): they
  // travel as they are, with no error feedback of the client's.
  void PushPullAsync(int64_t step, const std::vector<size_t>& params, const std::vector<at::Tensor>& grads,
                     const std::vector<at::Tensor>& intos, double lr, StatusCallback done);

  const PartitionPlan& plan() const { return options_.plan; }
  ~PsClient();

  // SYNC, covering vacant ranks: this step's pushes sum `extra_batches`
  // batches besides the worker's own, or carry none (`empty`: a
  // replacement whose batch of the step a survivor covered). See
  // PushRequest.extra_batches. Until changed.
  void SetStepBatches(uint32_t extra_batches, bool empty);
  // The ranks the shards had vacant when the step of the values last
  // pulled completed (shard 0's view chunk): whose batches to cover next.
  std::vector<uint32_t> vacant_ranks() const;

 private:
  PsClient(PsClientOptions options, std::vector<ParameterStore*> shards);

  // Whether `t` may stand for parameter `spec` in PushPullAsync: its dtype,
  // or the wire's for a float32 parameter under a narrow wire dtype.
  bool TravelsAs(const ParameterSpec& spec, const at::Tensor& t) const;
  absl::Status CheckTensors(const std::vector<at::Tensor>& tensors, const char* what) const;
  // One operation's options: its deadline, the job's secret.
  CallOptions NewCallOptions() const;
  // A shard's error says which shard; OK stays OK.
  static absl::Status ShardError(size_t shard, const absl::Status& status);
  // Where each chunk goes under one routing (ps_client_failover.cc): every
  // call uses one Route from start to end.
  struct Route {
    uint64_t generation = 0;
    std::vector<int> leader;                        // per chunk; -1: no copy left
    std::vector<bool> lost;                         // per shard
    std::vector<std::string> targets;               // per shard: its address (replicated tables)
    std::vector<ParameterStore*> shards;            // per shard: the client of that address
    Routing routing;                                // the coordinator's, with every target
    std::vector<std::vector<size_t>> shard_chunks;  // per shard, the chunks it leads (the view chunk first)
    std::vector<std::vector<std::vector<size_t>>> param_chunks;  // [p][s]: chunks of parameter p led by s
    size_t view_shard = 0;                                       // the shard leading view_chunk_
  };
  std::shared_ptr<const Route> route() const;
  // `previous` (null at first): whose clients are kept for the same targets.
  std::shared_ptr<const Route> MakeRoute(const Routing& routing, const Route* previous) const;
  bool replicated() const { return options_.plan.replicas > 0 && static_cast<bool>(options_.next_routing); }
  // Whether the job's stop flag is up; the CANCELLED a failed-over call
  // then ends with.
  bool Stopped() const;
  static absl::Status Cancelled(const absl::Status& failure);
  // Runs `op` (one whole operation) and, for a replicated table, again
  // under a newer routing while it fails on a lost shard, until `timeout`
  // or the job's stop.
  absl::Status WithFailover(const std::function<absl::Status(const Route&)>& op);
  // Waits (up to `deadline`, at most a second) for a routing newer than
  // `seen`, and uses it.
  void AwaitRouting(uint64_t seen, absl::Time deadline);
  // Follows the coordinator's routings from now on (a thread), so that a
  // spare shard gets its table even while no call fails.
  void WatchRoutings(const TableConfig& config);
  // InitTable of shard `shard` (its primaries and backups) from `params`.
  void InitTableOn(const Route& route, int shard, const std::vector<at::Tensor>& params, const TableConfig& config,
                   const Routing& routing, InitTableRequest* request, InitTableResponse* response,
                   const CallOptions& opts, StatusCallback done);
  // InitTableOn for a pipeline stage (PsClientOptions::whole_plan).
  void InitPipelinedTableOn(const Route& route, int shard, const std::vector<at::Tensor>& params,
                            const TableConfig& config, InitTableRequest* request, InitTableResponse* response,
                            const CallOptions& opts, StatusCallback done);
  // The table on each spare catching up under `route` that this client has
  // not made yet (zeros: its primaries copy it the values before it may
  // lead).
  void InitCatchingUp(const Route& route);
  // The chunks `ids` as views of `tensors`.
  absl::StatusOr<std::vector<TensorBuffer>> ChunkViews(const std::vector<at::Tensor>& tensors,
                                                       const std::vector<size_t>& ids) const;
  absl::Status CopyIntoParams(const std::vector<size_t>& ids, const std::vector<TensorBuffer>& values,
                              const std::vector<at::Tensor>& params) const;
  // Every chunk's gradient as it goes on the wire, narrowed once (error
  // feedback) and sent again as it is after a failover.
  absl::StatusOr<std::vector<TensorBuffer>> WireChunks(const std::vector<at::Tensor>& grads);
  // Gradient views of chunks `ids` as they go on the wire: narrowed (with
  // error feedback) when the wire dtype is narrow, else unchanged.
  absl::StatusOr<std::vector<TensorBuffer>> ForWire(std::vector<TensorBuffer> views, const std::vector<size_t>& ids);
  // The fields every request of this worker carries: job, attempt, keys.
  // (Defined and instantiated in ps_client.cc.)
  template <typename Request>
  Request& Addressed(Request& req, const std::vector<size_t>& chunks) const;
  // ... and a push's: worker, step, lr.
  template <typename Request>
  Request& AddressedPush(Request& req, const std::vector<size_t>& chunks, int64_t step, double lr) const;
  void RecordView(const google::protobuf::RepeatedField<uint32_t>& vacant);
  // A shard's chunks of a bucket, for one request.
  struct RequestPart {
    size_t shard = 0;
    std::vector<size_t> ids;
    bool has_view = false;  // holds the view chunk, first
  };
  std::vector<RequestPart> SplitRequests(const Route& route, const std::vector<size_t>& params) const;
  // Runs call(shard, done) for every shard that leads chunks under `route`
  // (or every shard) at once and waits for all.
  absl::Status ForEachShard(const Route& route, const std::function<void(int, StatusCallback)>& call,
                            bool every_shard = false);
  // PushPullAsync's bucket (ps_client_failover.cc retries its failed parts).
  struct AsyncPushPull {
    int64_t step = 0;
    double lr = 0;
    absl::Time deadline;
    uint64_t generation = 0;  // of the route the current round went out under
    StatusCallback done;
    std::vector<RequestPart> parts;
    std::vector<PushPullRequest> requests;
    std::vector<PushPullResponse> responses;
    std::vector<std::vector<TensorBuffer>> values;  // what the shard writes into
    std::vector<std::vector<TensorBuffer>> dest;    // per part: the destination views
    std::vector<std::vector<TensorBuffer>> wire;    // per part: the gradients as sent
    std::vector<int64_t> bytes;                     // per part: the gradients' wire bytes, and as many back
    std::vector<absl::Time> sent;                   // per part: when it went out (after its turn came)
    absl::Mutex mu;
    size_t outstanding ABSL_GUARDED_BY(mu) = 0;
    std::vector<absl::Status> status ABSL_GUARDED_BY(mu);  // per part

    // A new round of n parts.
    void Reset(size_t n) {
      requests.assign(n, PushPullRequest());
      responses.assign(n, PushPullResponse());
      values.assign(n, {});
      dest.assign(n, {});
      wire.assign(n, {});
      bytes.assign(n, 0);
      sent.assign(n, absl::InfinitePast());
      absl::MutexLock lock(&mu);
      outstanding = n;
      status.assign(n, absl::OkStatus());
    }
  };
  void IssueParts(const std::shared_ptr<AsyncPushPull>& state, const Route& route);
  void PartDone(const std::shared_ptr<AsyncPushPull>& state, size_t k, absl::Status status);
  // Runs `task` on the failover thread (started on first use).
  void OnFailoverThread(std::function<void()> task);
  // Starts `issue` (one PushPull to shard s) now, or when one of the
  // shard's requests in flight ends (max_in_flight_per_shard); Release
  // ends one.
  void Admit(size_t s, std::function<void()> issue);
  void Release(size_t s);

  const PsClientOptions options_;
  std::vector<ParameterStore*> shards_;
  // The chunk whose shard reports the ranks' view (PullResponse.vacant_ranks):
  // shard 0's first under the plan, wherever it is led from.
  size_t view_chunk_ = SIZE_MAX;
  mutable absl::Mutex route_mu_;
  std::shared_ptr<const Route> route_ ABSL_GUARDED_BY(route_mu_);
  // Failed async parts are tried again here, off the gRPC threads.
  absl::Mutex failover_mu_;
  std::deque<std::function<void()>> failover_tasks_ ABSL_GUARDED_BY(failover_mu_);
  bool failover_stop_ ABSL_GUARDED_BY(failover_mu_) = false;
  std::unique_ptr<std::thread> failover_thread_;
  // WatchRoutings: the table's config, the spares given their table
  // ("<address>@<routing generation>"), the thread.
  std::optional<TableConfig> config_;
  absl::Mutex catching_up_mu_;
  std::set<std::string> tables_made_ ABSL_GUARDED_BY(catching_up_mu_);
  std::unique_ptr<std::thread> watcher_;
  // Error feedback: per chunk, what rounding lost (a chunk is in one
  // request of a step, narrowed by the thread that sends it); empty until
  // the chunk's first narrowing.
  std::vector<std::vector<float>> residual_;
  struct ShardTurns {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    std::deque<std::function<void()>> waiting ABSL_GUARDED_BY(mu);
  };
  std::vector<std::unique_ptr<ShardTurns>> turns_;  // per shard
  uint32_t extra_batches_ = 0;
  bool empty_ = false;
  mutable absl::Mutex view_mu_;
  std::vector<uint32_t> vacant_ranks_ ABSL_GUARDED_BY(view_mu_);  // written on gRPC threads
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PS_CLIENT_H_
