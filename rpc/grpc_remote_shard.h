// GrpcRemoteShard: a ParameterStore that is a pstrain-ps server reached over
// gRPC. Requests go out with tensor bytes referenced in place (no copy), many
// calls may be in flight at once (to one shard or, with several instances, to
// all shards in parallel), every call carries a deadline, and calls that fail
// with UNAVAILABLE are retried with exponential backoff until the deadline:
// pushes are safe to retry because the shard applies a (job, worker, step) at
// most once. Thread-safe; completion callbacks run on gRPC's threads.
#ifndef PSTRAIN_RPC_GRPC_REMOTE_SHARD_H_
#define PSTRAIN_RPC_GRPC_REMOTE_SHARD_H_

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "rpc/grpc_server.h"
#include "rpc/retry_timer.h"
#include "table/parameter_store.h"

namespace pstrain {

struct RemoteShardOptions {
  std::string target;  // host:port
  int max_message_bytes = kDefaultMaxMessageBytes;
  // Deadline of a call whose CallOptions set none.
  absl::Duration default_timeout = absl::Seconds(120);
  int max_attempts = 6;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
};

class GrpcRemoteShard : public ParameterStore {
 public:
  explicit GrpcRemoteShard(RemoteShardOptions options);
  ~GrpcRemoteShard() override;

  const std::string& target() const { return options_.target; }
  // Calls started and whose done callback has not yet returned (retry
  // waits included). RemoteShardCache destroys only a client at zero.
  int in_flight() const { return in_flight_.load(); }

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
  void SaveTableAsync(const SaveTableRequest& request, SaveTableResponse* response,
                      const CallOptions& options, StatusCallback done) override;
  void LoadTableAsync(const LoadTableRequest& request, LoadTableResponse* response,
                      const CallOptions& options, StatusCallback done) override;
  void DropTableAsync(const DropTableRequest& request, DropTableResponse* response,
                      const CallOptions& options, StatusCallback done) override;
  void SetWorkersAsync(const SetWorkersRequest& request, SetWorkersResponse* response, const CallOptions& options,
                       StatusCallback done) override;
  void ReplicateAsync(const ReplicateRequest& request, std::vector<TensorBuffer> tensors, ReplicateResponse* response,
                      const CallOptions& options, StatusCallback done) override;
  void CancelCalls() override;

 private:
  struct Call;
  void StartAsync(const std::string& method, const google::protobuf::MessageLite& header,
                  const std::vector<TensorBuffer>& tensors, google::protobuf::MessageLite* response,
                  std::vector<TensorBuffer>* response_tensors, const CallOptions& options,
                  StatusCallback done);
  void AttemptAsync(std::shared_ptr<Call> call);
  // Runs the call's done callback, then (last touch of `this`) counts the
  // call out.
  void Finish(const std::shared_ptr<Call>& call, absl::Status status);

  const RemoteShardOptions options_;
  std::atomic<int> in_flight_{0};
  // CancelCalls: each call remembers the epoch it started in, and an
  // attempt of an older one is not made; attempts on the wire are live_.
  absl::Mutex live_mu_;
  uint64_t cancel_epoch_ ABSL_GUARDED_BY(live_mu_) = 0;
  std::set<Call*> live_ ABSL_GUARDED_BY(live_mu_);
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<RetryTimer> retry_timer_;
};

struct RemoteShardCacheOptions {
  // A client nobody holds, with no call in flight, unused for this long is
  // destroyed (at the next lookup: there is no sweeper thread).
  absl::Duration idle_timeout = absl::Minutes(10);
  // Past this many clients a lookup that adds one first destroys the least
  // recently used idle client. Clients in use are never destroyed, so the
  // map exceeds this only while more than this many are in use at once.
  size_t max_clients = 256;
  // The clock (tests inject one).
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// RemoteShardCache: clients shared by key (target, default timeout, attempts,
// message size), bounded so that a long-lived process talking to changing
// (or hostile: every fake shard address adds a channel and a certificate
// watcher) shards does not grow without end. The cache owns each client; a
// caller holds a shared_ptr while it uses one. A client is destroyed only
// when the cache holds the last reference AND it has no call in flight:
// destroying a client while gRPC's callback threads were still finishing
// its last calls crashed processes ("assertion failed: prior > 0" in
// gRPC's ref_counted.h, seen in a worker whose job was stopped with calls in
// flight; the root cause, gRPC's shared callback queue shut down with its
// last channel, is now held off for the process's life in grpc_channel.cc,
// but a client stays alive while its calls run regardless). Evicted clients
// are destroyed on the looking-up thread, outside the lock. Thread-safe.
class RemoteShardCache {
 public:
  explicit RemoteShardCache(RemoteShardCacheOptions options = {}) : options_(std::move(options)) {}

  std::shared_ptr<GrpcRemoteShard> Get(const RemoteShardOptions& options);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<GrpcRemoteShard> client;
    absl::Time last_used;
  };
  // True when nothing but the cache can reach `e.client` and it has no call
  // in flight. Under mu_: a new reference is only made under it.
  static bool Idle(const Entry& e) { return e.client.use_count() == 1 && e.client->in_flight() == 0; }

  const RemoteShardCacheOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> clients_ ABSL_GUARDED_BY(mu_);
};

// The client for `options` that this process shares (a process-wide
// RemoteShardCache with default limits, never destroyed nor torn down at
// exit). Long-lived processes that talk to changing shards use this rather
// than a client per job; hold the pointer while using the client.
std::shared_ptr<GrpcRemoteShard> SharedRemoteShard(const RemoteShardOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_REMOTE_SHARD_H_
