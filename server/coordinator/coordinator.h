// Coordinator: the control plane, transport-neutral (the gRPC services in
// grpc_coordinator_service.h only translate). A facade over modules, each
// testable alone:
//
// - jobs (job_status.h): submitted specs are validated and stored
//   (JobStore, SQLite) as PENDING; every transition is a capped condition
//   (time, reason, message); worker events (proto/events.proto) update the
//   status; when every worker is done the job SUCCEEDED.
// - membership (membership.h): shards and workers register and heartbeat;
//   one that misses `missed_heartbeats` beats is lost (a pause of the
//   coordinator itself extends every lease by its length). A RUNNING job
//   that loses a member is requeued to resume from its last checkpoint
//   (MemberLost), at most max_restarts times, else FAILED. Dead members are
//   forgotten after forget_after_leases leases.
// - scheduling (scheduler.h, a pure function): strict FIFO, all or nothing.
// - rendezvous (rendezvous.h): a bounded key-value store per job attempt.
// - checkpoints (checkpoint_driver.h, coordinator_checkpoint.cc): pause the
//   workers at one step, have the shards (or worker 0) write, commit the
//   directory; restore onto new shards; drain a leaving member; periodic
//   checkpoints.
// - Restart: jobs come back from the store. A RUNNING job keeps running if
//   its members re-register (they say which job, rank and attempt they are
//   on) within two leases (10 s at least); otherwise it is requeued as above.
// - Attempts: every scheduling of a job is a new attempt (JobStatus.attempt,
//   persisted, and on disk before any member or shard is told of it: a
//   restart never hands the same number out twice). Assignments carry it, and every request a member makes for
//   the job (shard calls, KV, events, heartbeats) carries it back; requests
//   of another attempt are refused (ABORTED) or ignored, so a member of an
//   earlier run, cut off by a partition that heals, cannot touch the new one.
// - Quotas (issue 31): per user (by the caller's user name), jobs queued
//   (refused at submission past the limit) and running (the scheduler passes
//   over a user at the limit), and open watches; and all callers together,
//   the calls that wait (wait_limits.h). Past a limit: RESOURCE_EXHAUSTED
//   naming it and its flag.
// - Retention: ended jobs past job_retention (count) or job_retention_age
//   are deleted from memory and the store (by the tick thread, and at
//   start, so a restart prunes the same way); an ended job keeps its status
//   in memory but not its spec (the store has it until it goes). Loops
//   that run on every tick walk the jobs not ended only.
// - Files: a job's checkpoints and weights live in <output_dir>/<job_id>/,
//   and output_dir must lie under the checkpoint root (the shared volume),
//   whose relative names the shards are given.
//
// Thread-safe: one mutex guards jobs and members (the rendezvous store has
// its own); waits (assignments, job changes) never hold it while blocked.
// Leases and conditions read the injected clock; waits on a caller's
// deadline are real time. A tick thread expires leases, schedules and
// starts periodic checkpoints; a persister thread writes changed job
// statuses to the store (never under the mutex); background work
// (checkpoints, restores, drains, table drops) runs on threads the
// coordinator owns and joins.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/caller.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "proto/control.pb.h"
#include "server/coordinator/checkpoint_driver.h"
#include "server/coordinator/job_status.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/job_telemetry.h"
#include "server/coordinator/membership.h"
#include "server/coordinator/rendezvous.h"
#include "server/coordinator/wait_limits.h"

namespace pstrain {

class TableGrantSigner;

// One probe of a shard's data path: a Stats call for `job` at `address`,
// with the job's secret, due by `deadline`.
struct ShardProbe {
  std::string job;
  std::string address;
  std::string job_secret;
  absl::Time deadline;
};

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int missed_heartbeats = 5;
  // Run the tick thread (tests may call Tick() themselves instead).
  bool background_tick = true;
  // Where leases, attach windows and conditions take the time from (not
  // owned; null: the real clock). Tests move a ManualClock and Tick().
  Clock* clock = nullptr;
  // Absolute, symlink-free directory (CanonicalRoot) that jobs' output_dir
  // and resume_from must lie under; shards get names relative to it.
  // Empty: the working directory's out/.
  std::string checkpoint_root;
  // Bounds on what clients can make the coordinator hold.
  size_t max_members = 10000;
  // Members one principal (a token's role and user) may register: a
  // compromised worker cannot fill the table, nor most of a pool.
  size_t max_members_per_principal = 1024;
  // Signs the table grants (rpc/table_grant.h) this coordinator gives
  // workers and sends shards; null: none (shards that check grants refuse
  // the job's tables).
  std::shared_ptr<const TableGrantSigner> table_grant_signer;
  size_t max_conditions = 100;       // per job: the first and the newest
  size_t max_kv_keys = 10000;        // per job
  size_t max_kv_value_bytes = 1 << 20;
  size_t max_kv_bytes = 64 << 20;    // per job, keys and values
  // Per-user quotas, by the caller's user name (admins count like anyone;
  // without authentication every caller is the one user ""). 0: no bound.
  size_t max_queued_jobs_per_user = 100;  // PENDING: refused at submission
  int max_running_jobs_per_user = 32;     // scheduled: the scheduler passes over
  size_t max_watches_per_user = 16;
  // Calls that hold a server thread while they wait (WatchJob, KvGet and
  // GetAssignment with a wait), every caller together: keep it below the
  // gRPC server's thread bound (--grpc_max_threads). 0: no bound.
  size_t max_waiting_calls = 512;
  // Ended jobs kept, in memory and in the store: the job_retention that
  // ended last (0: none), and none that ended longer than
  // job_retention_age ago (zero or less: no age limit).
  size_t job_retention = 1000;
  absl::Duration job_retention_age = absl::Hours(24 * 30);
  // A member without a heartbeat for this many leases is forgotten.
  int forget_after_leases = 20;
  // A checkpoint's waits (coordinator_checkpoint.cc, checkpoint_driver.h):
  // for a job still starting to report its model (else UNAVAILABLE, try
  // again later); for every worker to pause at the agreed step (else the
  // checkpoint fails, DEADLINE_EXCEEDED, and training goes on); for the
  // shards, or all-reduce worker 0, to write their tables; for each shard
  // to load one on a restore; and for a draining member's job to be
  // checkpointed, one in progress and retries included, before it is
  // requeued without one.
  absl::Duration checkpoint_start_timeout = absl::Seconds(60);
  absl::Duration checkpoint_pause_timeout = absl::Seconds(120);
  absl::Duration checkpoint_save_timeout = absl::Minutes(10);
  absl::Duration checkpoint_load_timeout = absl::Minutes(10);
  absl::Duration drain_checkpoint_timeout = absl::Seconds(90);
  // Fault-injection points for tests (called without the coordinator's
  // mutex): a checkpoint of `job` was claimed; a job's status is about to
  // be written to the store.
  std::function<void(const std::string& job)> on_checkpoint_claimed;
  std::function<void(const std::string& job)> before_persist;
  // A submitted job is about to be inserted into the store.
  std::function<void()> before_create;
  // A restore's shard calls for `attempt` returned (Restore, before it
  // takes the lock again to act on the result).
  std::function<void(const std::string& job, uint64_t attempt)> on_restore_loaded;
  // A checkpoint's files were written (or failed), before RunCheckpoint
  // takes the lock again to end it.
  std::function<void(const std::string& job)> on_checkpoint_written;
  // A background thread is about to be created; may throw
  // std::system_error as std::thread's constructor does when the process
  // is out of threads.
  std::function<void()> before_thread_start;
  // TensorBoard event files and the dashboard's curves (job_telemetry.h).
  TelemetryOptions telemetry;
  // The shards of running ps and hybrid jobs are probed on their data path
  // every heartbeat (coordinator_probes.cc): one that answers none for this
  // long while it heartbeats (hung, its data port cut off) is lost as if
  // its lease had run out, and quarantined. At least 2 heartbeats; 0: off.
  absl::Duration shard_probe_timeout = absl::Seconds(10);
  // How a probe is made (tests); null: a Stats call over gRPC. `done` gets
  // the call's status: DEADLINE_EXCEEDED and UNAVAILABLE are no answer,
  // any other code is one (the service ran the call).
  std::function<void(const ShardProbe& probe, std::function<void(absl::Status)> done)> shard_probe;
};

inline constexpr size_t kMaxEventBytes = 1 << 20;

// One class over five files, one side of it each; the groups of methods
// below name theirs. coordinator.cc: recovery from the store, the threads,
// job states, leases. coordinator_jobs.cc: JobService, scheduling.
// coordinator_cluster.cc: ClusterService. coordinator_elastic.cc: ranks
// changing hands, ScaleJob. coordinator_checkpoint.cc: checkpoints,
// restores, drains.
class Coordinator {
 public:
  // coordinator.cc.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             std::unique_ptr<JobStore> store);
  ~Coordinator();

  // JobService (coordinator_jobs.cc; ScaleJob: coordinator_elastic.cc;
  // Checkpoint: coordinator_checkpoint.cc).
  // `owner`: the submitting user (empty with authentication off). A resume
  // from another user's checkpoint is refused unless `caller` is an admin.
  absl::StatusOr<std::string> SubmitJob(const SubmitJobRequest& request, const Caller& caller = Caller{});
  // OK when `caller` may see and change the job: its owner or an admin
  // (PERMISSION_DENIED otherwise; NOT_FOUND for no such job).
  absl::Status Authorize(const std::string& job_id, const Caller& caller);
  absl::StatusOr<JobStatus> GetJob(const std::string& job_id);
  std::vector<JobStatus> ListJobs();
  absl::StatusOr<JobState> CancelJob(const std::string& job_id);
  // Parameter-server mode: ranks >= `workers` drain, those below are
  // filled (see control.proto ScaleJob). FAILED_PRECONDITION unless the job
  // runs in ps mode; INVALID_ARGUMENT outside min_workers..workers.
  absl::StatusOr<JobStatus> ScaleJob(const std::string& job_id, int workers);
  // Pauses the job's workers at a step boundary, has every shard save its
  // table into <output_dir>/<job_id>/ckpt-<step>.tmp/, writes the manifest,
  // renames the directory to ckpt-<step>/ and resumes the workers. Blocks
  // until done. UNAVAILABLE when another checkpoint of the job is running.
  absl::StatusOr<CheckpointResponse> Checkpoint(const std::string& job_id);
  // A place for one WatchJob stream of `caller`, held while it streams:
  // RESOURCE_EXHAUSTED past max_watches_per_user or max_waiting_calls.
  absl::StatusOr<WaitLimits::Slot> OpenWatch(const Caller& caller);
  // Returns the job's status once its version is above *version (or at the
  // deadline, whatever it is), and updates *version.
  absl::StatusOr<JobStatus> WaitJob(const std::string& job_id, uint64_t* version,
                                    absl::Time deadline);

  // ClusterService (coordinator_cluster.cc).
  // `caller`: who sent it (a shard token registers shards only, a worker
  // token workers only).
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request, const Caller& caller = Caller());
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  // A call that would wait counts against max_waiting_calls; refused a
  // place, it still returns an assignment that is ready, else
  // RESOURCE_EXHAUSTED (as KvGet).
  absl::StatusOr<Assignment> GetAssignment(const std::string& member_id, absl::Time deadline);
  absl::StatusOr<ReportProgressResponse> ReportProgress(const ReportProgressRequest& request);
  // The job's rendezvous store, for the members assigned to the job
  // (`member_id`; PERMISSION_DENIED for others); `attempt` must be the job's
  // current one (ABORTED otherwise).
  absl::Status KvSet(const std::string& member_id, const std::string& job_id, uint64_t attempt,
                     const std::string& key, const std::string& value);
  // NOT_FOUND when the key is still missing at the deadline.
  absl::StatusOr<std::string> KvGet(const std::string& member_id, const std::string& job_id, uint64_t attempt,
                                    const std::string& key, absl::Time deadline);
  // OUT_OF_RANGE when the sum would overflow.
  absl::StatusOr<int64_t> KvAdd(const std::string& member_id, const std::string& job_id, uint64_t attempt,
                                const std::string& key, int64_t delta);

  // The rest: coordinator.cc (and the telemetry, job_telemetry.h).
  std::vector<MemberStatus> Members();
  // The job's curves for the dashboard (empty for an unknown job).
  JobCurves Curves(const std::string& job_id) const { return telemetry_.Curves(job_id); }
  std::optional<JobTelemetry::Pace> RecentPace(const std::string& job_id) const {
    return telemetry_.RecentPace(job_id);
  }
  // Events the TensorBoard writers dropped (a full queue or a failing disk).
  uint64_t TelemetryDropped() const { return telemetry_.dropped(); }
  // Expires leases and schedules pending jobs.
  void Tick();
  // Starts a probe of each attached shard of a running job that has none in
  // flight (coordinator_probes.cc); answers are recorded as they come. The
  // prober thread calls it every heartbeat (tests without background_tick
  // call it, then Tick() to act on the answers).
  void ProbeShards() ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown();

 private:
  struct Job {
    StoredJob stored;
    JobSpec spec;
    std::set<int> done_ranks;
    uint64_t version = 1;
    // Members may (re)attach until then without the job failing.
    absl::Time attach_deadline;
    CheckpointState checkpoint;
    // Parameter-server mode, ranks changing hands (coordinator_elastic.cc).
    // A rank handed to a replacement: its assignment is held until the
    // shards know the new holder, then says where the rank continues.
    struct Rejoin {
      bool admitted = false;
      int64_t step = -1;
    };
    std::map<int, Rejoin> joining;
    // Vacant ranks the job waits for (below min_workers, or rank 0): the
    // shards keep them active until a replacement comes or the deadline
    // passes, then the job restarts.
    std::map<int, absl::Time> awaited;
    // One SetWorkers round at a time per job; a change meanwhile is sent
    // after it (the shards must see the views in order).
    bool seats_in_flight = false;
    bool seats_dirty = false;
    // The newest attempt the store is known to hold (the persister wrote a
    // status with it). Start() hands out a new attempt in memory; nobody
    // outside (assignments, heartbeats, shard calls) learns it before it is
    // durable, so a coordinator killed in between cannot hand the same
    // number to another run after its restart.
    uint64_t durable_attempt = 0;
    // Replicated shards: the routing generations the workers were told
    // (the job's KV store) up to this one.
    uint64_t routing_published = 0;
    // The attempt's shard probes by member id: last answered (or first
    // probed), and whether one is in flight.
    struct Probe {
      absl::Time answered;
      bool in_flight = false;
    };
    std::map<std::string, Probe> probes;
    uint64_t probes_attempt = 0;
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store);

  absl::Duration lease() const { return options_.heartbeat_interval * options_.missed_heartbeats; }
  absl::Time Now() const { return clock_->Now(); }

  // Jobs and their states (coordinator.cc).
  Job* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs not ended, in id (submission) order: a snapshot, so that the
  // caller may end some of them as it goes.
  std::vector<Job*> ActiveJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the ended jobs past the retention (from the store: by the
  // persister).
  void PruneEndedJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back to PENDING, to resume from the job's last checkpoint on whichever
  // members are free then; its current members are told to stop.
  void Requeue(Job& job, const std::string& reason, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanRestart(const Job& job) const;
  // Requeued when it can restart, else FAILED; then schedules.
  void RestartOrFail(Job& job, const std::string& reason, const std::string& message, bool retryable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where a requeued job resumes: its newest checkpoint, else the one it
  // was started from.
  static std::string ResumePoint(const Job& job);
  // Frees the ending attempt's tables on its shards (in the background):
  // the dense table, and with `embeddings` (a dlrm job) its embedding tables.
  void DropTables(const JobStatus& st, bool embeddings) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a transition, frees the members of a job that ended, persists.
  void Transition(Job& job, JobState state, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshMembers(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why shard `m` is lost though it heartbeats (no probe answered); or "".
  std::string Unanswered(const Job& job, const MemberStatus& m, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProbeLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void CancelProbes() ABSL_LOCKS_EXCLUDED(mu_);  // Shutdown: those in flight end now
  // Replicated shards (coordinator_elastic.cc): a lost shard's chunks are
  // led by their backups from a new routing generation, and the job goes on;
  // false (the caller restarts the job) when `lost` is not a shard of a
  // replicated job or a chunk could be left with no copy.
  bool LoseShard(Job& job, const MemberStatus& lost, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free shard takes a lost shard's place in a replicated job: it backs
  // up the chunks that shard held, catching up (full copies from their
  // primaries) before it may lead; CatchUpLoop watches the primaries and
  // ends the catching up.
  void FillLostShards() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CatchUpLoop(const std::string& job_id, uint64_t attempt, int shard) ABSL_LOCKS_EXCLUDED(mu_);
  // The routing of a replicated job's tables as the coordinator sees it,
  // and its publication to the workers (the job's KV store, routing/<g>).
  static Routing RoutingOf(const JobStatus& st);
  void PublishRouting(Job& job, uint64_t attempt, const Routing& routing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The coordinator's threads (coordinator.cc): the tick, the persister and
  // background work.
  void TickLoop();
  void PersistLoop();
  void Background(std::function<void()> fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Background work whose thread could not be created: tried again.
  void StartDeferred() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AttemptDurable(const Job& job) const { return job.durable_attempt >= job.stored.status.attempt(); }
  // Blocks until `attempt` of the job is durable; false when the job moved
  // to another attempt (or ended, or the coordinator shuts down) first.
  bool AwaitDurableAttempt(const std::string& job_id, uint64_t attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Submission and placement (coordinator_jobs.cc).
  absl::Status MayResume(const std::string& checkpoint_job, const Caller& caller) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies the scheduler's plan: the jobs it places start a new attempt.
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Start(Job& job, const Placement& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Members' calls (coordinator_cluster.cc).
  absl::StatusOr<Assignment> WaitAssignment(const std::string& member_id, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK when `member_id` is registered and assigned to `job_id`.
  absl::Status CheckJobMember(const std::string& member_id, const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // OK when `member_id` may write `key` of its job's KV store: not the
  // coordinator's (routings, a checkpoint's paths), and a checkpoint's
  // answers from worker 0 alone.
  absl::Status CheckKvWrite(const std::string& member_id, const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The seat (rank) a registration may take back in a job that survived a
  // coordinator restart (on either side): the job's attempt it was running,
  // the same name and role, and the member id the job's stored status gives
  // that seat (a shard that names no job: any running job's seat with its
  // member id). Null otherwise; else `job_id` is the seat's job.
  const MemberStatus* SeatToReattach(const RegisterRequest& request, std::string* job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One event from `member` (its rank in the job) about `job`.
  absl::Status ApplyEvent(Job& job, Member& member, const WorkerEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Worker ranks changing hands while a parameter-server job runs
  // (coordinator_elastic.cc).
  // The worker `lost` is gone: its rank is left vacant, and true, if the
  // job can go on (or wait for a replacement); false: restart the job.
  bool VacateRank(Job& job, const MemberStatus& lost, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank of `holder` becomes vacant: its worker is freed and told to
  // stop, its progress no longer counts.
  void DropRank(Job& job, const MemberStatus& holder) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free pool workers take over vacant ranks of running jobs.
  void FillVacancies() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandOver(Job& job, int rank, Member& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ranks awaited past the job's replacement_timeout_s: restart.
  void ExpireAwaitedRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a restart: the ranks of a running job that must be awaited
  // (awaited lives in memory) are again, and the shards are sent the job's
  // seats once more if they changed during the attempt -- a SetWorkers the
  // previous coordinator had in flight when it died never arrived.
  void RestoreSeats(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the job's seats to its shards (in the background, in order).
  void PushSeats(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushSeatsLoop(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The worker count the job runs with now (ScaleJob, else the spec's).
  static int TargetWorkers(const Job& job);
  // Every rank done, or vacant and not awaited.
  bool AllRanksSettled(const Job& job) const;

  // Checkpoints (coordinator_checkpoint.cc). Each runs for the attempt that
  // claimed it: the lock is dropped while the workers pause and the shards
  // write, and a result that comes back after the job moved to another
  // attempt (requeued, restarted) is not applied to that one.
  // Claims a checkpoint of the job for the caller; UNAVAILABLE if one runs.
  // Returns the attempt it is for.
  absl::StatusOr<uint64_t> ClaimCheckpoint(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The body of Checkpoint(), for a caller that has claimed it.
  absl::StatusOr<CheckpointResponse> RunCheckpoint(const std::string& job_id, uint64_t attempt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Pauses the workers and decides what the checkpoint writes.
  absl::StatusOr<CheckpointWrite> PauseForCheckpoint(const std::string& job_id, uint64_t attempt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // CheckpointWrite::abandon for the attempt's checkpoint under routing
  // `generation` (called without mu_ held).
  std::function<std::string()> AbandonCheck(const std::string& job_id, uint64_t attempt, uint64_t generation);
  // A pause id no pause of any job has had, in this coordinator's life or
  // an earlier one's (workers skip a pause whose id they already served).
  int64_t NextPauseId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndCheckpoint(Job& job, const std::string& reason, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the periodic checkpoints that are due.
  void StartPeriodicCheckpoints() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads the job's checkpoint into its shards (on a background thread).
  void Restore(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A worker is shutting down (SIGTERM): checkpoint the job, then requeue it.
  void Drain(const std::string& job_id, const std::string& who) ABSL_LOCKS_EXCLUDED(mu_);

  const CoordinatorOptions options_;
  Clock* const clock_;
  std::unique_ptr<JobStore> store_;
  Rendezvous rendezvous_;
  JobTelemetry telemetry_;  // thread-safe; only enqueues
  WaitLimits waits_;        // thread-safe

  absl::Mutex mu_;
  absl::CondVar cv_;  // any change: assignment, job status
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // The ids of the jobs not ended; the ended ones by when they ended (then
  // submission order), oldest first.
  std::set<std::string> active_ ABSL_GUARDED_BY(mu_);
  std::set<std::tuple<absl::Time, int64_t, std::string>> ended_ ABSL_GUARDED_BY(mu_);
  // Submissions between the quota check and the insert, by user.
  std::map<std::string, size_t> submitting_ ABSL_GUARDED_BY(mu_);
  Membership members_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // This coordinator's life over its store (JobStore::NextIncarnation):
  // the high half of its pause ids; pauses_ counts them in this life.
  int64_t incarnation_ = 0;
  int64_t pauses_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread ticker_;
  std::thread prober_;
  int probes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // Shutdown cancels and waits for them
  std::map<std::string, int> probing_ ABSL_GUARDED_BY(mu_);  // their addresses
  // Background work: finished threads are joined by the next Background()
  // call, the rest by Shutdown().
  struct BackgroundThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<BackgroundThread> background_ ABSL_GUARDED_BY(mu_);
  // Work whose thread could not be created (the process is out of
  // threads): started again on the next tick rather than lost, and never
  // an exception out of Background() -- it runs under mu_ on the tick
  // thread and request threads.
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
  // Statuses changed since they were last written (the newest of each job).
  std::map<std::string, JobStatus> dirty_ ABSL_GUARDED_BY(mu_);
  // Pruned jobs the persister deletes from the store (after any write of
  // theirs it has in flight).
  std::vector<std::string> doomed_ ABSL_GUARDED_BY(mu_);
  absl::CondVar persist_cv_;
  bool persist_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread persister_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_H_
