// ParameterStore: the transport-neutral interface of one parameter shard.
// ShardStore (server/ps) is the in-process implementation, GrpcRemoteShard
// (rpc/) reaches one over gRPC, and GrpcParameterService (server/ps) exposes
// a ParameterStore over gRPC. Requests and responses are the protos of
// proto/parameter.proto with their tensor field left empty; tensors travel
// beside them as TensorBuffers, so no layer copies tensor bytes into protos.
//
// Tensor outputs (`values`): when the caller passes a non-empty vector, its
// buffers are the destinations -- one per requested key, of the key's dtype
// and size -- and the implementation writes the values into them (a worker
// passes views of its parameters, so pulled values land in place with one
// copy). An empty vector gets freshly allocated buffers.
//
// Every call is asynchronous, as its Async suffix says: `done` runs exactly
// once, on some thread of the implementation, after the response and tensor
// outputs are filled in (on error they may be partly filled). Callers keep
// the outputs alive until then; WaitFor below blocks on one call.
#ifndef PSTRAIN_TABLE_PARAMETER_STORE_H_
#define PSTRAIN_TABLE_PARAMETER_STORE_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/parameter.pb.h"
#include "table/tensor_buffer.h"

namespace pstrain {

using StatusCallback = std::function<void(absl::Status)>;

struct CallOptions {
  // A call still waiting at its deadline fails with DEADLINE_EXCEEDED.
  absl::Time deadline = absl::InfiniteFuture();
  // The job's secret (Assignment.job_secret): a remote store sends it with
  // the call, and a shard serves a job's table only to callers that have it.
  // In-process stores ignore it.
  std::string job_secret;
  // The coordinator's grant for making the job's table (InitTableAsync,
  // LoadTableAsync; rpc/table_grant.h): sent as metadata by a remote store.
  std::string table_grant;
};

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  virtual void InitTableAsync(const InitTableRequest& request, std::vector<TensorBuffer> values,
                              InitTableResponse* response, const CallOptions& options,
                              StatusCallback done) = 0;
  virtual void PullAsync(const PullRequest& request, PullResponse* response,
                         std::vector<TensorBuffer>* values, const CallOptions& options,
                         StatusCallback done) = 0;
  virtual void PushAsync(const PushRequest& request, std::vector<TensorBuffer> grads,
                         PushResponse* response, const CallOptions& options, StatusCallback done) = 0;
  virtual void PushPullAsync(const PushPullRequest& request, std::vector<TensorBuffer> grads,
                             PushPullResponse* response, std::vector<TensorBuffer>* values,
                             const CallOptions& options, StatusCallback done) = 0;
  virtual void StatsAsync(const StatsRequest& request, StatsResponse* response,
                          const CallOptions& options, StatusCallback done) = 0;
  virtual void SaveTableAsync(const SaveTableRequest& request, SaveTableResponse* response,
                              const CallOptions& options, StatusCallback done) = 0;
  virtual void LoadTableAsync(const LoadTableRequest& request, LoadTableResponse* response,
                              const CallOptions& options, StatusCallback done) = 0;
  virtual void DropTableAsync(const DropTableRequest& request, DropTableResponse* response,
                              const CallOptions& options, StatusCallback done) = 0;
  virtual void SetWorkersAsync(const SetWorkersRequest& request, SetWorkersResponse* response,
                               const CallOptions& options, StatusCallback done) = 0;
  // Replicated shards: a primary's updated chunks, to a backup
  // (ReplicateRequest). UNIMPLEMENTED unless a store replicates.
  virtual void ReplicateAsync(const ReplicateRequest& request, std::vector<TensorBuffer> tensors,
                              ReplicateResponse* response, const CallOptions& options, StatusCallback done);
  // Fails every call in flight, and each waiting to be retried, with
  // CANCELLED now: the shard was declared lost, so its callers should go to
  // the new primaries instead of waiting out their deadlines (a hung shard
  // answers nothing). Calls started later run as usual. In-process stores
  // have nothing to cancel.
  virtual void CancelCalls() {}
};

// Runs one asynchronous call and waits for its `done`. For tests, tools and
// callers that have nothing else to do meanwhile.
absl::Status WaitFor(const std::function<void(StatusCallback)>& call);

}  // namespace pstrain

#endif  // PSTRAIN_TABLE_PARAMETER_STORE_H_
