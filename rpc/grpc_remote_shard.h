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

#include <memory>
#include <string>

#include "rpc/grpc_server.h"
#include "table/parameter_store.h"
#include "rpc/retry_timer.h"

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

  void InitTable(const InitTableRequest& request, std::vector<TensorBuffer> values,
                 InitTableResponse* response, const CallOptions& options,
                 StatusCallback done) override;
  void Pull(const PullRequest& request, PullResponse* response, std::vector<TensorBuffer>* values,
            const CallOptions& options, StatusCallback done) override;
  void Push(const PushRequest& request, std::vector<TensorBuffer> grads, PushResponse* response,
            const CallOptions& options, StatusCallback done) override;
  void PushPull(const PushPullRequest& request, std::vector<TensorBuffer> grads,
                PushPullResponse* response, std::vector<TensorBuffer>* values,
                const CallOptions& options, StatusCallback done) override;
  void Stats(const StatsRequest& request, StatsResponse* response, const CallOptions& options,
             StatusCallback done) override;
  void SaveTable(const SaveTableRequest& request, SaveTableResponse* response,
                 const CallOptions& options, StatusCallback done) override;
  void LoadTable(const LoadTableRequest& request, LoadTableResponse* response,
                 const CallOptions& options, StatusCallback done) override;
  void DropTable(const DropTableRequest& request, DropTableResponse* response,
                 const CallOptions& options, StatusCallback done) override;
  void SetWorkers(const SetWorkersRequest& request, SetWorkersResponse* response, const CallOptions& options,
                  StatusCallback done) override;

 private:
  struct Call;
  void Start(const std::string& method, const google::protobuf::MessageLite& header,
             const std::vector<TensorBuffer>& tensors, google::protobuf::MessageLite* response,
             std::vector<TensorBuffer>* response_tensors, const CallOptions& options,
             StatusCallback done);
  void Attempt(std::shared_ptr<Call> call);

  const RemoteShardOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<RetryTimer> retry_timer_;
};

// The client for `options` that this process shares, created on first use
// and never destroyed (nor torn down at exit). Destroying a client while
// gRPC's callback threads were still finishing its last calls crashed
// processes ("assertion failed: prior > 0" in gRPC's ref_counted.h, seen in
// a worker whose job was stopped with calls in flight; the cause, gRPC's
// shared callback queue shut down with its last channel, is now held off for
// the process's life in grpc_channel.cc); long-lived processes that talk to
// changing shards still use this rather than a client per job. Keyed by
// target, default timeout and attempts.
GrpcRemoteShard* SharedRemoteShard(const RemoteShardOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_REMOTE_SHARD_H_
