// ClusterMember: a shard's or worker's link to the coordinator. It
// registers (retrying until the coordinator answers), heartbeats on a
// thread of its own, registers again when the coordinator has forgotten it
// (a coordinator restart) -- saying which job and rank it is running, so the
// job carries on -- and learns from the heartbeat replies when the job it is
// running was cancelled. Events (JSON lines) are sent in order by a
// background sender: progress may be dropped when the coordinator is slow or
// away, every other event is retried until delivered (proto/events.proto).
//
// Thread-safe.
#ifndef PSTRAIN_RPC_CLUSTER_MEMBER_H_
#define PSTRAIN_RPC_CLUSTER_MEMBER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/control.grpc.pb.h"

namespace pstrain {

struct ClusterMemberOptions {
  std::string coordinator;  // host:port
  MemberRole role = MEMBER_ROLE_UNSPECIFIED;
  std::string name;         // stable name (pod name)
  std::string address;      // shards: where their ParameterService listens
  absl::Duration rpc_timeout = absl::Seconds(10);
  // The coordinator stopped trusting this member (a shard whose data path
  // answered none of its probes; HeartbeatResponse.exit_reason says why):
  // called on the heartbeat thread, at each heartbeat that says so. A
  // shard exits so that its supervisor starts it afresh. Null: logged only.
  std::function<void(const std::string& why)> on_exit_request;
};

// This machine's host name (what other processes reach it by, unless told
// otherwise).
std::string HostName();
// `flag_name` if set, else <hostname>-<pid>: unique on a machine, stable for
// a pod (Kubernetes passes the pod name).
std::string MemberName(const std::string& flag_name);

class ClusterMember {
 public:
  explicit ClusterMember(ClusterMemberOptions options);
  ~ClusterMember();

  // Registers (retrying for up to `timeout`) and starts heartbeating.
  absl::Status Start(absl::Duration timeout);
  void Stop();

  // Long-polls the coordinator for this member's assignment; an empty job_id
  // means none yet.
  absl::StatusOr<Assignment> WaitForAssignment(absl::Duration wait);

  // The job this member is working on ("" when idle). A worker sets it; a
  // shard learns it from its heartbeat.
  // `attempt` is the assignment's: every request for the job carries it.
  void SetRunning(const std::string& job_id, int rank, uint64_t attempt);
  std::string job_id() {
    absl::MutexLock lock(&mu_);
    return job_id_;
  }
  // True once the coordinator no longer assigns the running job to us.
  const std::atomic<bool>& cancelled() const { return cancelled_; }
  // True while the coordinator asks this worker to pause (a checkpoint).
  bool pause_requested() const { return pause_; }
  int64_t pause_id() const { return pause_id_; }
  absl::Duration heartbeat_interval() {
    absl::MutexLock lock(&mu_);
    return interval_;
  }

  // The running job's rendezvous store on the coordinator.
  absl::StatusOr<int64_t> KvAdd(const std::string& key, int64_t delta);
  absl::Status KvSet(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> KvGet(const std::string& key, absl::Duration wait);

  // What the running job's loop is doing, sent with every heartbeat (null:
  // nothing). Called on the heartbeat thread.
  void SetActivitySource(std::function<WorkerActivity()> source);

  // Queues one event of the running job for the coordinator.
  void Report(const WorkerEvent& event);
  // Waits until the queue is empty (or the timeout).
  bool Flush(absl::Duration timeout);

 private:
  absl::Status RegisterOnce();
  void HeartbeatLoop();
  void SenderLoop();
  std::string member_id();
  // One unary call to the coordinator that may take `timeout`.
  template <typename Request, typename Response>
  absl::Status CallCoordinator(
      grpc::Status (ClusterService::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
      const Request& request, Response* response, absl::Duration timeout);
  // A KvAdd/KvSet/KvGet request for `key` in the running job, as this
  // member (job, attempt and member id as of now).
  template <typename Request>
  Request KvRequest(const std::string& key);

  const ClusterMemberOptions options_;
  std::unique_ptr<ClusterService::Stub> stub_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> pause_{false};
  std::atomic<int64_t> pause_id_{0};

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::string member_id_ ABSL_GUARDED_BY(mu_);
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<WorkerActivity()> activity_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  struct Event {
    std::string job;
    uint64_t attempt = 0;
    WorkerEvent event;
  };
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ = false;
  std::thread heartbeat_;
  std::thread sender_;
};

}  // namespace pstrain

#endif  // PSTRAIN_RPC_CLUSTER_MEMBER_H_
