// Coordinator: the control plane's state machine, transport-neutral (the
// gRPC services in grpc_coordinator_service.h only translate).
//
// - Jobs: submitted specs are validated and stored (JobStore, SQLite) as
//   PENDING; every transition is recorded as a condition (time, reason,
//   message; the first and the newest max_conditions - 1 are kept). Worker
//   events (proto/events.proto) update the status; when every worker is
//   done the job SUCCEEDED.
// - Members: shards and workers register and heartbeat; one that misses
//   `missed_heartbeats` beats is lost (a pause of the coordinator itself
//   extends every lease by its length). A RUNNING job that loses a member
//   is requeued to resume from its last checkpoint (MemberLost), at most
//   max_restarts times, else FAILED. Dead members are forgotten after
//   forget_after_leases leases.
// - Scheduling: strict FIFO, all or nothing: the oldest PENDING job starts
//   only when all the shards and workers it asks for are free and alive, so
//   two half-started jobs can never hold each other's members.
// - Restart: jobs come back from the store. A RUNNING job keeps running if
//   its members re-register (they say which job, rank and attempt they are
//   on) within two leases (10 s at least); otherwise it is requeued as above.
// - A small key-value store per job for rendezvous (bounded).
// - Attempts: every scheduling of a job is a new attempt (JobStatus.attempt,
//   persisted). Assignments carry it, and every request a member makes for
//   the job (shard calls, KV, events, heartbeats) carries it back; requests
//   of another attempt are refused (ABORTED) or ignored, so a member of an
//   earlier run, cut off by a partition that heals, cannot touch the new one.
// - Files: a job's checkpoints and weights live in <output_dir>/<job_id>/,
//   and output_dir must lie under the checkpoint root (the shared volume),
//   whose relative names the shards are given.
//
// Thread-safe: one mutex guards all state; waits (assignments, KV keys, job
// changes) use one condition variable and never hold the lock while
// blocked. A tick thread expires leases and schedules; a persister thread
// writes changed job statuses to the store (never under the mutex);
// background work (checkpoints, restores, drains, table drops) runs on
// threads the coordinator owns and joins.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_

#include <atomic>
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
#include "checkpoint/manifest.h"
#include "common/job_spec.h"
#include "proto/control.pb.h"
#include "server/coordinator/job_store.h"

namespace pstrain {

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int missed_heartbeats = 5;
  // Run the tick thread (tests may call Tick() themselves instead).
  bool background_tick = true;
  // Absolute, symlink-free directory (CanonicalRoot) that jobs' output_dir
  // and resume_from must lie under; shards get names relative to it.
  // Empty: the working directory's out/.
  std::string checkpoint_root;
  // Bounds on what clients can make the coordinator hold.
  size_t max_members = 10000;
  size_t max_conditions = 100;       // per job: the first and the newest
  size_t max_kv_keys = 10000;        // per job
  size_t max_kv_value_bytes = 1 << 20;
  size_t max_kv_bytes = 64 << 20;    // per job, keys and values
  // A member without a heartbeat for this many leases is forgotten.
  int forget_after_leases = 20;
  // Fault-injection points for tests (called without the coordinator's
  // mutex): a checkpoint of `job` was claimed; a job's status is about to
  // be written to the store.
  std::function<void(const std::string& job)> on_checkpoint_claimed;
  std::function<void(const std::string& job)> before_persist;
};

// Limits on the strings a request may carry.
inline constexpr size_t kMaxNameBytes = 253;     // a DNS name, as Kubernetes pod names
inline constexpr size_t kMaxAddressBytes = 512;
inline constexpr size_t kMaxIdBytes = 300;       // job and member ids
inline constexpr size_t kMaxKvKeyBytes = 512;
inline constexpr size_t kMaxEventBytes = 1 << 20;

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
  // table into <output_dir>/<job_id>/ckpt-<step>.tmp/, writes the manifest,
  // renames the directory to ckpt-<step>/ and resumes the workers. Blocks
  // until done. UNAVAILABLE when another checkpoint of the job is running.
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
  // The job's rendezvous store; `attempt` must be the job's current one
  // (ABORTED otherwise).
  absl::Status KvSet(const std::string& job_id, uint64_t attempt, const std::string& key,
                     const std::string& value);
  // NOT_FOUND when the key is still missing at the deadline.
  absl::StatusOr<std::string> KvGet(const std::string& job_id, uint64_t attempt, const std::string& key,
                                    absl::Time deadline);
  // OUT_OF_RANGE when the sum would overflow.
  absl::StatusOr<int64_t> KvAdd(const std::string& job_id, uint64_t attempt, const std::string& key,
                                int64_t delta);

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
    // A checkpoint of the job is claimed (set atomically under mu_ by
    // whoever starts one, cleared by EndCheckpoint): at most one runs.
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
  absl::Status ApplyEvent(Job& job, Member& member, const WorkerEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndCheckpoint(Job& job, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The body of Checkpoint(), for a caller that has claimed it.
  absl::StatusOr<CheckpointResponse> RunCheckpoint(const std::string& job_id);
  absl::Status CheckKvAccess(const std::string& job_id, uint64_t attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `dir` (absolute, under the checkpoint root) as a name relative to it.
  std::string RelativeToRoot(const std::string& dir) const;
  // Absolute and normalized; INVALID_ARGUMENT unless under the root.
  absl::StatusOr<std::string> UnderRoot(const std::string& path, const char* what) const;
  void PersistLoop();
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
  // Background work: finished threads are joined by the next Background()
  // call, the rest by Shutdown().
  struct BackgroundThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<BackgroundThread> background_ ABSL_GUARDED_BY(mu_);
  // Statuses changed since they were last written (the newest of each job).
  std::map<std::string, JobStatus> dirty_ ABSL_GUARDED_BY(mu_);
  std::condition_variable persist_cv_;
  bool persist_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread persister_;
};

const char* JobStateName(JobState state);
bool IsTerminal(JobState state);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_
