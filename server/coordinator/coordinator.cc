#include "server/coordinator/coordinator.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/file_util.h"
#include "common/member_role.h"
#include "common/quote.h"
#include "common/random_hex.h"
#include "rpc/grpc_remote_shard.h"
#include "server/coordinator/scheduler.h"
#include "spdlog/spdlog.h"

namespace pstrain {

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<JobStore> store)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      store_(std::move(store)),
      rendezvous_(RendezvousLimits{options.max_kv_keys, options.max_kv_value_bytes, options.max_kv_bytes}),
      telemetry_(options.telemetry),
      waits_(WaitLimitsOptions{options.max_waiting_calls, options.max_watches_per_user}),
      members_(options.max_members, options.forget_after_leases * lease(), options.max_members_per_principal) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                  std::unique_ptr<JobStore> store) {
  if (options.heartbeat_interval <= absl::ZeroDuration() || options.missed_heartbeats < 1) {
    return absl::InvalidArgumentError("heartbeat interval and missed heartbeats must be positive");
  }
  if (options.checkpoint_root.empty()) {
    auto root = CanonicalRoot("out");
    if (!root.ok()) return root.status();
    options.checkpoint_root = *root;
  }
  std::unique_ptr<Coordinator> c(new Coordinator(options, std::move(store)));
  // Drawn (and on disk) before anyone hears from this coordinator.
  auto incarnation = c->store_->NextIncarnation();
  if (!incarnation.ok()) return incarnation.status();
  c->incarnation_ = *incarnation;
  auto stored = c->store_->List();
  if (!stored.ok()) return stored.status();
  // A commit of a checkpoint that died halfway (this coordinator's
  // predecessor was killed) is tidied before anything reads the job's
  // checkpoints (checkpoint/layout.h).
  for (const StoredJob& s : *stored) {
    if (!IsTerminal(s.status.state())) RecoverCheckpoints(JobDir(s.output_dir, s.id));
  }
  {
    absl::MutexLock lock(&c->mu_);
    for (StoredJob& s : *stored) {
      Job job;
      auto spec = ParseJobSpec(s.spec_yaml, s.id);
      if (!spec.ok()) return spec.status();
      job.spec = *spec;
      job.stored = std::move(s);
      job.durable_attempt = job.stored.status.attempt();  // read from the store
      // Members of running jobs get time to notice the restart, reconnect
      // and register again: two leases, and never less than 10 s.
      job.attach_deadline = c->Now() + std::max(2 * c->lease(), absl::Seconds(10));
      if (!IsTerminal(job.stored.status.state())) {
        c->rendezvous_.Open(job.stored.id, job.stored.status.attempt());
      }
      if (job.stored.status.state() == RUNNING || job.stored.status.state() == CHECKPOINTING) {
        // The attempt goes on: its run gains a file from this process.
        c->telemetry_.StartAttempt(job.stored.id, job.stored.status.attempt(),
                                   JobDir(job.stored.output_dir, job.stored.id), job.stored.spec_yaml);
      }
      Job& j = c->jobs_.emplace(job.stored.id, std::move(job)).first->second;
      const JobStatus& st = j.stored.status;
      if (IsTerminal(st.state())) {
        // Ended when its last transition was recorded.
        const int64_t ended_ms = st.conditions_size() > 0 ? st.conditions(st.conditions_size() - 1).time_unix_ms()
                                                          : st.created_unix_ms();
        c->ended_.emplace(absl::FromUnixMillis(ended_ms), j.stored.seq, j.stored.id);
        j.stored.spec_yaml = std::string();  // the store keeps it; nothing here reads it again
      } else {
        c->active_.insert(j.stored.id);
      }
      if (j.stored.status.state() == CHECKPOINTING) {
        // Killed during a checkpoint: what it had (the pause, the paused
        // workers, the claim) lived in memory only, and its directory was
        // never committed. The checkpoint is abandoned; the job runs on
        // (its workers, told no pause by this coordinator's heartbeats,
        // resume) and can be checkpointed again.
        c->Transition(j, RUNNING, "CheckpointAbandoned",
                      "the coordinator restarted during a checkpoint; it was not committed");
      }
      c->RestoreSeats(j);
    }
    // The same retention as before the restart (or a new one, if the flags
    // changed): what is past it goes now.
    c->PruneEndedJobs();
  }
  c->persister_ = std::thread([raw = c.get()] { raw->PersistLoop(); });
  if (options.background_tick) c->ticker_ = std::thread([raw = c.get()] { raw->TickLoop(); });
  return c;
}

void Coordinator::TickLoop() {
  absl::MutexLock lock(&mu_);
  const absl::Duration period = options_.heartbeat_interval / 2;
  absl::Time last_tick = Now();
  while (!shutdown_) {
    cv_.WaitWithTimeout(&mu_, period);
    if (shutdown_) break;
    // A pause of the coordinator itself (a stalled machine, swapping, a
    // debugger) is not its members' fault: heartbeats could not be heard
    // meanwhile, so the time beyond the tick period does not count against
    // any lease.
    const absl::Time now = Now();
    const absl::Duration late = now - last_tick - period;
    last_tick = now;
    if (late > period) {
      members_.ExtendLeases(late);
      spdlog::warn("coordinator: paused for {}; leases extended by as much", absl::FormatDuration(late));
    }
    StartDeferred();
    ExpireLeases();
    ExpireAwaitedRanks();
    Schedule();
    StartPeriodicCheckpoints();
    PruneEndedJobs();
  }
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  std::vector<BackgroundThread> background;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    cv_.SignalAll();
    background.swap(background_);
  }
  rendezvous_.Shutdown();
  if (ticker_.joinable()) ticker_.join();
  for (auto& t : background) t.thread.join();
  {
    absl::MutexLock lock(&mu_);
    persist_stop_ = true;
    persist_cv_.SignalAll();
  }
  if (persister_.joinable()) persister_.join();  // writes what is still dirty first
}

void Coordinator::Background(std::function<void()> fn) {
  if (shutdown_) return;
  // Join the threads that have finished (their work is done; join returns
  // at once), so a long-running coordinator holds only live ones.
  for (auto it = background_.begin(); it != background_.end();) {
    if (it->finished->load()) {
      it->thread.join();
      it = background_.erase(it);
    } else {
      ++it;
    }
  }
  auto finished = std::make_shared<std::atomic<bool>>(false);
  // std::thread throws when the process is out of threads (or memory):
  // here that would cross the tick thread or a request under mu_ and end
  // the coordinator. The work waits for the next tick instead.
  try {
    if (options_.before_thread_start) options_.before_thread_start();
    std::thread thread([fn, finished] {
      fn();
      finished->store(true);
    });
    background_.push_back(BackgroundThread{std::move(thread), finished});
  } catch (const std::system_error& e) {
    spdlog::error("coordinator: cannot start a background thread ({}); {} task(s) will be tried again on the next tick",
                  e.what(), deferred_.size() + 1);
    deferred_.push_back(std::move(fn));
  }
}

void Coordinator::StartDeferred() {
  std::vector<std::function<void()>> deferred;
  deferred.swap(deferred_);
  // Those that fail again go back to deferred_, in order.
  for (auto& fn : deferred) Background(std::move(fn));
}

std::vector<Coordinator::Job*> Coordinator::ActiveJobs() {
  std::vector<Job*> out;
  out.reserve(active_.size());
  for (const std::string& id : active_) out.push_back(&jobs_.at(id));
  return out;
}

void Coordinator::PruneEndedJobs() {
  const absl::Time cutoff =
      options_.job_retention_age > absl::ZeroDuration() ? Now() - options_.job_retention_age : absl::InfinitePast();
  size_t pruned = 0;
  while (!ended_.empty() &&
         (ended_.size() > options_.job_retention || std::get<0>(*ended_.begin()) < cutoff)) {
    const std::string id = std::get<2>(*ended_.begin());
    ended_.erase(ended_.begin());
    jobs_.erase(id);
    dirty_.erase(id);  // a write still waiting would only fail
    doomed_.push_back(id);
    ++pruned;
  }
  if (pruned == 0) return;
  spdlog::info("coordinator: {} ended job(s) past the retention ({} kept, none older than {}) deleted", pruned,
               options_.job_retention, absl::FormatDuration(options_.job_retention_age));
  persist_cv_.SignalAll();
}

void Coordinator::PersistLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (!persist_stop_ && dirty_.empty() && doomed_.empty()) persist_cv_.Wait(&mu_);
    if (dirty_.empty() && doomed_.empty() && persist_stop_) return;
    std::map<std::string, JobStatus> batch;
    batch.swap(dirty_);
    std::vector<std::string> doomed;
    doomed.swap(doomed_);
    mu_.Unlock();
    // SQLite's fsync happens here, with the coordinator's mutex free.
    std::map<std::string, uint64_t> written;
    for (const auto& [id, status] : batch) {
      if (options_.before_persist) options_.before_persist(id);
      absl::Status s = store_->Update(status);
      if (s.ok()) {
        written[id] = status.attempt();
      } else {
        spdlog::error("coordinator: persisting {}: {}", id, s.ToString());
      }
    }
    // After the writes: a pruned job's last status may be among them.
    // Not deleted (a failing disk): the next start prunes it again.
    if (absl::Status s = store_->Delete(doomed); !s.ok()) {
      spdlog::error("coordinator: deleting {} ended job(s): {}", doomed.size(), s.ToString());
    }
    mu_.Lock();
    for (const auto& [id, attempt] : written) {
      Job* job = FindJob(id);
      if (job == nullptr || attempt <= job->durable_attempt) continue;
      // Its assignments, heartbeats and shard calls may now carry it.
      job->durable_attempt = attempt;
      cv_.SignalAll();
    }
    for (const auto& [id, status] : batch) {
      Job* job = FindJob(id);
      if (written.count(id) > 0 || job == nullptr || dirty_.count(id) > 0 || AttemptDurable(*job) ||
          persist_stop_) {
        continue;
      }
      // A new attempt that could not be written is not handed out until it
      // is: the write is tried again (the disk may come back).
      dirty_[id] = job->stored.status;
      persist_cv_.WaitWithTimeout(&mu_, absl::Seconds(1));
    }
  }
}

bool Coordinator::AwaitDurableAttempt(const std::string& job_id, uint64_t attempt) {
  while (true) {
    Job* job = FindJob(job_id);
    if (job == nullptr || job->stored.status.attempt() != attempt || IsTerminal(job->stored.status.state()) ||
        shutdown_) {
      return false;
    }
    if (job->durable_attempt >= attempt) return true;
    cv_.Wait(&mu_);
  }
}

Coordinator::Job* Coordinator::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void Coordinator::Changed(Job& job) {
  ++job.version;
  dirty_[job.stored.id] = job.stored.status;
  persist_cv_.SignalAll();
  cv_.SignalAll();
}

void Coordinator::RefreshMembers(Job& job) {
  for (MemberStatus& m : *job.stored.status.mutable_members()) members_.Refresh(m, job.stored.id);
}

void Coordinator::Transition(Job& job, JobState state, const std::string& reason, const std::string& message) {
  JobStatus& st = job.stored.status;
  AddCondition(st, state, reason, message, Now(), options_.max_conditions);
  spdlog::info("coordinator: {} -> {} ({}: {})", st.job_id(), JobStateName(state), reason, message);
  if (IsTerminal(state)) {
    // The shards free the job's table; workers still waiting on it (a SYNC
    // step) are released at once.
    DropTables(st);
    RefreshMembers(job);
    members_.FreeAll(st.job_id());
    telemetry_.EndAttempt(st.job_id());
    rendezvous_.Close(st.job_id());
    if (active_.erase(st.job_id()) > 0) {
      ended_.emplace(Now(), job.stored.seq, st.job_id());
      // Up to 1 MiB the ended job no longer needs (the store keeps it).
      job.stored.spec_yaml = std::string();
    }
  } else {
    active_.insert(st.job_id());
  }
  Changed(job);
}

void Coordinator::DropTables(const JobStatus& st) {
  std::vector<std::string> shard_addresses = ShardAddresses(st);
  if (shard_addresses.empty()) return;
  // The attempt that ends: a table the shards already hold for a later one
  // (this drop delayed) is kept.
  Background([shard_addresses, id = st.job_id(), attempt = st.attempt(), secret = st.job_secret()] {
    for (const std::string& a : shard_addresses) {
      RemoteShardOptions ro;
      ro.target = a;
      ro.default_timeout = absl::Seconds(10);
      ro.max_attempts = 2;
      std::shared_ptr<GrpcRemoteShard> client = SharedRemoteShard(ro);
      DropTableRequest req;
      req.set_job(id);
      req.set_attempt(attempt);
      DropTableResponse resp;
      CallOptions opts;
      opts.job_secret = secret;
      absl::Status s = WaitFor([&](StatusCallback done) { client->DropTableAsync(req, &resp, opts, done); });
      if (!s.ok()) spdlog::warn("coordinator: dropping {} on {}: {}", id, a, s.ToString());
    }
  });
}

std::string Coordinator::ResumePoint(const Job& job) {
  const JobStatus& st = job.stored.status;
  return st.last_checkpoint().empty() ? st.resumed_from() : st.last_checkpoint();
}

bool Coordinator::CanRestart(const Job& job) const {
  return !ResumePoint(job).empty() && job.stored.status.restarts() < job.spec.max_restarts;
}

void Coordinator::Requeue(Job& job, const std::string& reason, const std::string& message) {
  JobStatus& st = job.stored.status;
  DropTables(st);
  telemetry_.EndAttempt(st.job_id());
  members_.Release(st.job_id());
  rendezvous_.Close(st.job_id());
  st.clear_members();
  st.clear_workers();
  st.set_samples_per_s(0);  // the sum over the workers: none trains now
  st.set_resumed_from(ResumePoint(job));
  job.done_ranks.clear();
  job.joining.clear();
  job.awaited.clear();
  st.clear_vacant_ranks();
  job.checkpoint.Reset();
  st.set_restarts(st.restarts() + 1);
  Transition(job, PENDING, reason,
             absl::StrCat(message, "; restart ", st.restarts(), " of at most ", job.spec.max_restarts,
                          " will resume from ", st.resumed_from()));
}

void Coordinator::RestartOrFail(Job& job, const std::string& reason, const std::string& message, bool retryable) {
  if (retryable && CanRestart(job)) {
    Requeue(job, reason, message);
  } else {
    Transition(job, FAILED, reason,
               !retryable            ? message
               : ResumePoint(job).empty() ? absl::StrCat(message, " (no checkpoint to restart from)")
                                          : absl::StrCat(message, " (no restarts left)"));
  }
}

absl::StatusOr<std::string> Coordinator::SubmitJob(const SubmitJobRequest& request, const Caller& caller) {
  if (request.spec_yaml().size() > (1 << 20)) return absl::InvalidArgumentError("the job spec is larger than 1 MiB");
  std::string spec_yaml = request.spec_yaml();
  std::string resume_dir;
  CheckpointManifest manifest;
  if (!request.resume_from().empty()) {
    auto dir = PathUnderRoot(options_.checkpoint_root, request.resume_from(), "resume_from");
    if (!dir.ok()) return dir.status();
    resume_dir = *dir;
    auto m = ReadManifest(resume_dir);
    if (!m.ok()) return m.status();
    manifest = std::move(*m);
    absl::Status allowed = MayResume(manifest.job, caller);
    if (!allowed.ok()) return allowed;
    if (spec_yaml.empty()) spec_yaml = manifest.spec_yaml;
  }
  auto spec = ParseJobSpec(spec_yaml, "job spec");
  if (!spec.ok()) return spec.status();
  absl::Status names = CheckDataFileNames(*spec, "job spec");
  if (!names.ok()) return names;
  if (!resume_dir.empty() && spec->chunk_bytes != manifest.chunk_bytes) {
    // A spec that leaves chunk_bytes to the default takes the checkpoint's
    // (checkpoints from before the default became 1 MiB are 4 MiB).
    bool added = false;
    auto adopted = WithDefaultField(spec_yaml, "chunk_bytes", manifest.chunk_bytes, &added);
    if (!adopted.ok()) return adopted.status();
    if (!added) {
      return absl::InvalidArgumentError(absl::StrCat("chunk_bytes is ", spec->chunk_bytes,
                                                     " but the checkpoint was cut in chunks of ",
                                                     manifest.chunk_bytes, ": use the same chunk_bytes"));
    }
    spec_yaml = *std::move(adopted);
    spec = ParseJobSpec(spec_yaml, "job spec");
    if (!spec.ok()) return spec.status();
  }
  JobStatus status;
  status.set_name(spec->name);
  status.set_state(PENDING);
  status.set_created_unix_ms(absl::ToUnixMillis(Now()));
  status.set_final_accuracy(-1);
  status.set_num_shards(spec->shards);
  status.set_num_workers(spec->workers);
  status.set_resumed_from(resume_dir);
  status.set_owner(caller.user);
  status.set_job_secret(RandomHex(32));
  if (!resume_dir.empty()) {
    status.set_chunk_bytes(manifest.chunk_bytes);
    for (const ParameterSpec& p : manifest.params) {
      ParameterInfo* info = status.add_params();
      info->set_name(p.name);
      for (int64_t d : p.shape) info->add_shape(d);
      info->set_dtype(p.dtype);
    }
  }
  // Relative to the coordinator's working directory, the same path on every
  // member (in Kubernetes: the shared volume, mounted alike everywhere), and
  // under the checkpoint root.
  auto output_dir = PathUnderRoot(options_.checkpoint_root,
                                  request.output_dir().empty() ? spec->output_dir : request.output_dir(), "output_dir");
  if (!output_dir.ok()) return output_dir.status();
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
    // Submissions in flight count too: two at once cannot both take the
    // last place.
    size_t queued = submitting_[caller.user];
    for (const Job* j : ActiveJobs()) {
      if (j->stored.status.state() == PENDING && j->stored.status.owner() == caller.user) ++queued;
    }
    if (options_.max_queued_jobs_per_user > 0 && queued >= options_.max_queued_jobs_per_user) {
      if (submitting_[caller.user] == 0) submitting_.erase(caller.user);
      return absl::ResourceExhaustedError(
          absl::StrCat("user ", Quote(caller.user), " has ", queued, " jobs queued, the limit per user ",
                       "(--max_queued_jobs_per_user): wait for some to start, or cancel some"));
    }
    ++submitting_[caller.user];
  }
  // The insert (an fsync: synchronous=FULL) runs off the coordinator's lock,
  // so heartbeats and other calls never wait for the disk; the store has a
  // lock of its own and gives the job its id.
  if (options_.before_create) options_.before_create();
  auto stored = store_->Create(spec_yaml, *output_dir, status);
  absl::MutexLock lock(&mu_);
  if (--submitting_[caller.user] == 0) submitting_.erase(caller.user);
  if (!stored.ok()) return stored.status();
  Job job;
  job.spec = *spec;
  job.stored = std::move(*stored);
  const std::string id = job.stored.id;
  Job& j = jobs_.emplace(id, std::move(job)).first->second;
  rendezvous_.Open(id, 0);
  Transition(j, PENDING, "Submitted",
             absl::StrCat("waiting for ", spec->shards > 0 ? absl::StrCat(spec->shards, " shard(s) and ") : "",
                          spec->workers, " worker(s)",
                          resume_dir.empty() ? "" : absl::StrCat("; will resume from ", resume_dir)));
  Schedule();
  return id;
}

absl::Status Coordinator::Authorize(const std::string& job_id, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "' (see `pstrain list`)"));
  if (caller.MayActOn(job->stored.status.owner())) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("job ", job_id, " belongs to another user: only its owner or an admin may see or change it"));
}

absl::Status Coordinator::MayResume(const std::string& checkpoint_job, const Caller& caller) {
  if (caller.role == CallerRole::kAdmin) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(checkpoint_job);
  if (job != nullptr && caller.MayActOn(job->stored.status.owner())) return absl::OkStatus();
  return absl::PermissionDeniedError(
      job == nullptr ? "the checkpoint's job is not known here: only an admin may resume from it"
                     : "the checkpoint belongs to another user's job: only its owner or an admin may resume from it");
}

absl::StatusOr<JobStatus> Coordinator::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "' (see `pstrain list`)"));
  RefreshMembers(*job);
  return job->stored.status;
}

std::vector<JobStatus> Coordinator::ListJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<const Job*> order;
  for (auto& [id, job] : jobs_) order.push_back(&job);
  std::sort(order.begin(), order.end(), [](const Job* a, const Job* b) { return a->stored.seq < b->stored.seq; });
  std::vector<JobStatus> out;
  for (const Job* j : order) out.push_back(j->stored.status);
  return out;
}

absl::StatusOr<JobState> Coordinator::CancelJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
  const JobState state = job->stored.status.state();
  if (IsTerminal(state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (", JobStateName(state), ")"));
  }
  Transition(*job, CANCELLED, "CancelRequested", "cancelled by a user; its members are freed");
  Schedule();
  return CANCELLED;
}

absl::StatusOr<WaitLimits::Slot> Coordinator::OpenWatch(const Caller& caller) {
  return waits_.AcquireWatch(caller.user);
}

absl::StatusOr<JobStatus> Coordinator::WaitJob(const std::string& job_id, uint64_t* version, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    Job* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
    if (job->version > *version || absl::Now() >= deadline || shutdown_) {
      *version = job->version;
      RefreshMembers(*job);
      return job->stored.status;
    }
    cv_.WaitWithDeadline(&mu_, deadline);
  }
}

void Coordinator::MaybeSucceed(Job& job) {
  // A job being checkpointed finishes once the checkpoint is written.
  if (AllRanksSettled(job) && job.stored.status.state() == RUNNING) {
    const int done = static_cast<int>(job.done_ranks.size());
    Transition(job, SUCCEEDED, "Completed",
               done == job.spec.workers ? absl::StrCat("all ", done, " workers finished")
                                        : absl::StrCat(done, " of ", job.spec.workers,
                                                       " ranks finished (the others were lost, not replaced)"));
    Schedule();
  }
}

void Coordinator::ExpireLeases() {
  const absl::Time now = Now();
  members_.Expire(now, lease());
  // A running job needs every one of its members, alive and attached.
  for (Job* active : ActiveJobs()) {
    Job& job = *active;
    const std::string& id = job.stored.id;
    const JobStatus& st = job.stored.status;
    if ((st.state() != RUNNING && st.state() != CHECKPOINTING) || now < job.attach_deadline) continue;
    const std::vector<MemberStatus> present(st.members().begin(), st.members().end());
    for (const MemberStatus& jm : present) {
      // A vacated rank may have ended the job (the others were done).
      if (st.state() != RUNNING && st.state() != CHECKPOINTING) break;
      if (members_.Attached(jm.name(), id)) continue;
      const std::string what = absl::StrCat(RoleName(jm.role()), " ", jm.name(), " (rank ", jm.rank(),
                                            ") was lost: missed ", options_.missed_heartbeats, " heartbeats");
      if (VacateRank(job, jm, what)) continue;  // a parameter-server job goes on without it
      RestartOrFail(job, "MemberLost", what, /*retryable=*/true);
      break;
    }
  }
}

void Coordinator::Schedule() {
  // Running jobs first: a vacant rank is filled before new jobs start.
  FillVacancies();
  // Active jobs only: ended ones (up to job_retention of them) are not walked.
  std::vector<Job*> pending;
  ScheduleLimits limits;
  limits.max_running_per_owner = options_.max_running_jobs_per_user;
  for (Job* job : ActiveJobs()) {
    if (job->stored.status.state() == PENDING) {
      pending.push_back(job);
    } else {
      ++limits.running_by_owner[job->stored.status.owner()];
    }
  }
  if (pending.empty()) return;
  std::sort(pending.begin(), pending.end(), [](const Job* a, const Job* b) { return a->stored.seq < b->stored.seq; });
  std::vector<SchedulerJob> fifo;
  for (const Job* job : pending) {
    fifo.push_back({job->stored.id, job->spec.shards, job->spec.workers, members_.Stopping(job->stored.id),
                    job->stored.status.owner()});
  }
  const SchedulePlan plan = PlanSchedule(fifo, members_.FreeMembers(), limits);
  for (Job* job : pending) {
    auto reason = plan.pending_reasons.find(job->stored.id);
    if (reason != plan.pending_reasons.end() && job->stored.status.pending_reason() != reason->second) {
      spdlog::debug("coordinator: schedule: {} stays pending: {}", job->stored.id, reason->second);
      job->stored.status.set_pending_reason(reason->second);
      ++job->version;
      cv_.SignalAll();
    }
  }
  for (const Placement& p : plan.placements) Start(jobs_.at(p.job_id), p);
}

void Coordinator::Start(Job& job, const Placement& placement) {
  JobStatus& st = job.stored.status;
  st.clear_pending_reason();
  st.clear_members();
  std::vector<std::string> names;
  for (const auto* ids : {&placement.shard_ids, &placement.worker_ids}) {
    for (size_t rank = 0; rank < ids->size(); ++rank) {
      Member& m = *members_.Find((*ids)[rank]);
      m.status.set_job_id(st.job_id());
      m.status.set_rank(static_cast<int>(rank));
      *st.add_members() = m.status;
      names.push_back(m.status.name());
    }
  }
  job.attach_deadline = Now();
  job.done_ranks.clear();
  job.joining.clear();
  job.awaited.clear();
  st.clear_vacant_ranks();
  st.clear_rank_generations();
  for (int r = 0; r < job.spec.workers; ++r) st.add_rank_generations(0);
  st.set_active_workers(job.spec.workers);
  st.set_replacements(0);
  st.set_target_workers(0);
  // A new attempt: requests of the previous ones are refused from now on.
  // It is told to nobody until the store holds it (durable_attempt).
  st.set_attempt(st.attempt() + 1);
  rendezvous_.Open(st.job_id(), st.attempt());
  telemetry_.StartAttempt(st.job_id(), st.attempt(), JobDir(job.stored.output_dir, st.job_id()),
                          job.stored.spec_yaml);
  Transition(job, RUNNING, "Scheduled",
             absl::StrCat("attempt ", st.attempt(), " assigned to ", absl::StrJoin(names, ", ")));
  if (!st.resumed_from().empty()) {
    job.checkpoint.restoring = true;
    Background([this, id = st.job_id()] { Restore(id); });
  }
}

void Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  StartDeferred();
  ExpireLeases();
  ExpireAwaitedRanks();
  Schedule();
  PruneEndedJobs();
}

std::vector<MemberStatus> Coordinator::Members() {
  absl::MutexLock lock(&mu_);
  return members_.Statuses();
}

}  // namespace pstrain
