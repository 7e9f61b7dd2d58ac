// The coordinator's core: it comes back from its store, runs its threads
// (tick, persister, background work), moves jobs between states and expires
// the leases of members that stopped beating.
#include "server/coordinator/coordinator.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/file_util.h"
#include "common/member_role.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_remote_shard.h"
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
  if (options.shard_probe_timeout > absl::ZeroDuration() &&
      options.shard_probe_timeout < 2 * options.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shard probe timeout (", absl::FormatDuration(options.shard_probe_timeout),
        ") must be at least two heartbeat intervals (", absl::FormatDuration(2 * options.heartbeat_interval),
        "), or zero for no probes"));
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
  if (options.background_tick && options.shard_probe_timeout > absl::ZeroDuration()) {
    c->prober_ = std::thread([raw = c.get()] { raw->ProbeLoop(); });
  }
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
      for (Job* job : ActiveJobs()) {
        for (auto& [id, probe] : job->probes) probe.answered = std::min(probe.answered + late, now);
      }
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
  if (prober_.joinable()) prober_.join();
  {
    // A probe of a hung shard would end only at its deadline: cancelled.
    CancelProbes();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &probes_in_flight_));
  }
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
    DropTables(st, !job.spec.embeddings.empty());
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

void Coordinator::DropTables(const JobStatus& st, bool embeddings) {
  std::vector<std::string> shard_addresses = ShardAddresses(st);
  if (shard_addresses.empty()) return;
  // The attempt that ends: a table the shards already hold for a later one
  // (this drop delayed) is kept.
  Background([shard_addresses, id = st.job_id(), attempt = st.attempt(), secret = st.job_secret(), embeddings] {
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
      if (!embeddings) continue;
      s = DropEmbeddings(CreateChannel(a), id, attempt, secret, absl::Seconds(10));
      if (!s.ok()) spdlog::warn("coordinator: dropping {}'s embeddings on {}: {}", id, a, s.ToString());
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
  DropTables(st, !job.spec.embeddings.empty());
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
      if (ShardLost(st, jm)) continue;
      std::string what;
      if (!members_.Attached(jm.name(), id)) {
        what = absl::StrCat(RoleName(jm.role()), " ", jm.name(), " (rank ", jm.rank(), ") was lost: missed ",
                            options_.missed_heartbeats, " heartbeats");
      } else if (what = Unanswered(job, jm, now); !what.empty()) {
        spdlog::error("coordinator: {}: {}", id, what);
        members_.Quarantine(jm.name(), id, what);
      } else {
        continue;
      }
      if (VacateRank(job, jm, what)) continue;  // a parameter-server job goes on without it
      if (LoseShard(job, jm, what)) continue;   // its chunks' backups lead them now
      RestartOrFail(job, "MemberLost", what, /*retryable=*/true);
      break;
    }
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
