// ShardStore: one parameter shard, in process. For each job it keeps a table
// of chunks (value, optimizer state, version) and applies the job's optimizer
// to pushed gradients under the job's consistency model.
//
// Threading: every method may be called from many threads at once. Each chunk
// has its own mutex, so pushes to different chunks proceed in parallel; the
// table map and the waiter list have one mutex each. Lock order: mu_ before
// waiters_mu_; a chunk's mu before waiters_mu_; never two chunks at once.
// No callback runs under any lock.
//
// Waiting (Pull with min_version, PushPull under SYNC or SSP) never blocks a
// thread: the call is parked as a waiter and completed by the push that
// satisfies it, by the reaper thread at its deadline, or by Shutdown().
//
// Every request is validated in full before anything is applied, so a bad
// request changes nothing.
#ifndef PSTRAIN_SERVER_PS_SHARD_STORE_H_
#define PSTRAIN_SERVER_PS_SHARD_STORE_H_

#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "rpc/parameter_store.h"

namespace pstrain {

struct ShardStoreOptions {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  // Upper bound on any wait, whatever deadline the caller gave.
  absl::Duration max_wait = absl::Minutes(30);
};

class ShardStore : public ParameterStore {
 public:
  explicit ShardStore(ShardStoreOptions options);
  ~ShardStore() override;

  // Fails waiting calls and every later call with UNAVAILABLE. Idempotent.
  void Shutdown();

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
  // Runs on the calling thread (file I/O): callers are the gRPC service
  // (one call per checkpoint) and tests.
  void SaveTable(const SaveTableRequest& request, SaveTableResponse* response,
                 const CallOptions& options, StatusCallback done) override;
  void LoadTable(const LoadTableRequest& request, LoadTableResponse* response,
                 const CallOptions& options, StatusCallback done) override;
  void DropTable(const DropTableRequest& request, DropTableResponse* response,
                 const CallOptions& options, StatusCallback done) override;

 private:
  struct Chunk;
  struct Table;
  struct Waiter;
  struct PushInput {
    std::string job;
    uint32_t worker = 0;
    int64_t step = 0;
    double lr = 0;  // 0: the table's
    const google::protobuf::RepeatedPtrField<std::string>* keys = nullptr;
    const std::vector<TensorBuffer>* grads = nullptr;
  };

  static std::unique_ptr<Chunk> NewChunk(const std::string& key, const TensorBuffer& value,
                                         const TableConfig& config);
  absl::StatusOr<std::shared_ptr<Table>> FindTable(const std::string& job);
  absl::StatusOr<std::vector<size_t>> ResolveKeys(
      const Table& table, const google::protobuf::RepeatedPtrField<std::string>& keys);
  absl::Status ApplyPush(Table& table, const PushInput& in, std::vector<size_t>* chunks,
                         PushResponse* response);
  void Snapshot(Table& table, const std::vector<size_t>& chunks,
                google::protobuf::RepeatedField<int64_t>* versions,
                std::vector<TensorBuffer>* values);
  // Runs `ready(OkStatus())` once every chunk's version (or, with by_clock,
  // its slowest worker's last step) is >= threshold; ready(error) at the
  // deadline or on shutdown.
  void WhenReady(std::shared_ptr<Table> table, std::vector<size_t> chunks, bool by_clock,
                 int64_t threshold, absl::Time deadline, StatusCallback ready);
  void NotifyWaiters();
  void ReaperLoop();

  const ShardStoreOptions options_;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);

  std::mutex waiters_mu_;
  std::condition_variable waiters_cv_;
  std::list<std::shared_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(waiters_mu_);
  bool shutdown_ ABSL_GUARDED_BY(waiters_mu_) = false;
  std::thread reaper_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_SHARD_STORE_H_
