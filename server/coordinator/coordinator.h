// Coordinator: the control plane's state machine, transport-neutral (the
// gRPC services in grpc_coordinator_service.h only translate).
//
// - Jobs: submitted specs are validated and stored (JobStore, SQLite) as
//   PENDING; every transition is recorded as a condition (time, reason,
//   message). Worker events (progress, evaluation, done, error) update the
//   status; when every worker is done the job SUCCEEDED.
// - Members: shards and workers register and heartbeat; one that misses
//   `missed_heartbeats` beats is lost, and a RUNNING job that loses a member
//   FAILED (reason MemberLost).
// - Scheduling: strict FIFO, all or nothing: the oldest PENDING job starts
//   only when all the shards and workers it asks for are free and alive, so
//   two half-started jobs can never hold each other's members.
// - Restart: jobs come back from the store. A RUNNING job keeps running if
//   its members re-register (they say which job and rank they are on) within
//   one lease; otherwise it fails with MemberLost.
// - A small key-value store per job for rendezvous.
//
// Thread-safe: one mutex guards all state; waits (assignments, KV keys, job
// changes) use one condition variable and never hold the lock while
// blocked. A tick thread expires leases and schedules.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "proto/control.pb.h"
#include "common/checkpoint_manifest.h"
#include "server/coordinator/job_store.h"

namespace pstrain {

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int missed_heartbeats = 5;
  // Run the tick thread (tests may call Tick() themselves instead).
  bool background_tick = true;
};

class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             std::unique_ptr<JobStore> store);
  ~Coordinator();

  // JobService.
  absl::StatusOr<std::string> SubmitJob(const SubmitJobRequest& request);
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id);
  std::vector<JobStatus> ListJobs();
  absl::StatusOr<JobState> CancelJob(const std::string& job_id);
  // Pauses the job's workers at a step boundary, has every shard save its
  // table into <output_dir>/ckpt-<step>.tmp/, writes the manifest, renames
  // the directory to ckpt-<step>/ and resumes the workers. Blocks until done.
  absl::StatusOr<CheckpointResponse> Checkpoint(const std::string& job_id);
  // Returns the job's status once its version is above *version (or at the
  // deadline, whatever it is), and updates *version.
  absl::StatusOr<JobStatus> WaitJob(const std::string& job_id, uint64_t* version,
                                    absl::Time deadline);

  // ClusterService.
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request);
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::StatusOr<Assignment> GetAssignment(const std::string& member_id, absl::Time deadline);
  absl::StatusOr<ReportProgressResponse> ReportProgress(const ReportProgressRequest& request);
  absl::Status KvSet(const std::string& job_id, const std::string& key, const std::string& value);
  absl::StatusOr<std::string> KvGet(const std::string& job_id, const std::string& key,
                                    absl::Time deadline);
  absl::StatusOr<int64_t> KvAdd(const std::string& job_id, const std::string& key, int64_t delta);

  std::vector<MemberStatus> Members();
  // Expires leases and schedules pending jobs.
  void Tick();
  void Shutdown();

 private:
  struct Member {
    MemberStatus status;
    absl::Time last_beat;
    // The member's job was requeued: it is told to stop, and becomes free
    // once its heartbeat says it no longer runs the job (or it is lost).
    bool releasing = false;
    // It is shutting down (SIGTERM): never given a job again.
    bool leaving = false;
  };
  struct Job {
    StoredJob stored;
    JobSpec spec;
    std::set<int> done_ranks;
    uint64_t version = 1;
    // Members may (re)attach until then without the job failing.
    absl::Time attach_deadline;
    // Checkpointing: workers are asked to pause and report where they are.
    bool checkpointing = false;
    bool pause_requested = false;
    int64_t pause_id = 0;
    std::map<int, CheckpointManifest::Worker> paused;
    int64_t last_checkpoint_step = 0;
    // Resuming: the shards load the checkpoint before workers get to start.
    bool restoring = false;
    std::vector<CheckpointManifest::Worker> start_positions;
    bool draining = false;  // a worker is leaving: checkpoint, then requeue
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
      : options_(options), store_(std::move(store)) {}

  absl::Duration lease() const { return options_.heartbeat_interval * options_.missed_heartbeats; }
  Job* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back to PENDING, to resume from the job's last checkpoint on whichever
  // members are free then; its current members are told to stop.
  void Requeue(Job& job, const std::string& reason, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanRestart(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where a requeued job resumes: its newest checkpoint, else the one it
  // was started from.
  static std::string ResumePoint(const Job& job);
  // A worker is shutting down (SIGTERM): checkpoint the job, then requeue it.
  void Drain(const std::string& job_id, const std::string& who);
  // The shards free the job's table (in the background).
  void DropTables(const JobStatus& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a transition, frees the members of a job that ended, persists.
  void Transition(Job& job, JobState state, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshMembers(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One event from `member` (its rank in the job) about `job`.
  void ApplyEvent(Job& job, Member& member, const std::string& event_json) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndCheckpoint(Job& job, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads the job's checkpoint into its shards (on a background thread).
  void Restore(const std::string& job_id);
  void Background(std::function<void()> fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  std::unique_ptr<JobStore> store_;

  std::mutex mu_;
  std::condition_variable cv_;  // any change: assignment, job status, KV
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);  // by member id
  std::map<std::string, std::map<std::string, std::string>> kv_ ABSL_GUARDED_BY(mu_);
  uint64_t next_member_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
  std::vector<std::thread> background_ ABSL_GUARDED_BY(mu_);
};

const char* JobStateName(JobState state);
bool IsTerminal(JobState state);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_
