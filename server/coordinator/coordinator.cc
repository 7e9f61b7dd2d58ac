#include "server/coordinator/coordinator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/file_util.h"
#include "common/partition_plan.h"
#include "common/quote.h"
#include "rpc/grpc_remote_shard.h"
#include "spdlog/spdlog.h"

namespace pstrain {

const char* JobStateName(JobState state) {
  switch (state) {
    case PENDING: return "Pending";
    case RUNNING: return "Running";
    case CHECKPOINTING: return "Checkpointing";
    case SUCCEEDED: return "Succeeded";
    case FAILED: return "Failed";
    case CANCELLED: return "Cancelled";
    default: return "Unknown";
  }
}

bool IsTerminal(JobState state) { return state == SUCCEEDED || state == FAILED || state == CANCELLED; }

namespace {
int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }
}  // namespace

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
  auto stored = c->store_->List();
  if (!stored.ok()) return stored.status();
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    for (StoredJob& s : *stored) {
      Job job;
      auto spec = ParseJobSpec(s.spec_yaml, s.id);
      if (!spec.ok()) return spec.status();
      job.spec = *spec;
      job.stored = std::move(s);
      // Members of running jobs get time to notice the restart, reconnect
      // and register again: two leases, and never less than 10 s.
      job.attach_deadline = absl::Now() + std::max(2 * c->lease(), absl::Seconds(10));
      c->jobs_.emplace(job.stored.id, std::move(job));
    }
  }
  c->persister_ = std::thread([raw = c.get()] { raw->PersistLoop(); });
  if (options.background_tick) {
    c->ticker_ = std::thread([raw = c.get()] {
      std::unique_lock<std::mutex> lock(raw->mu_);
      const absl::Duration period = raw->options_.heartbeat_interval / 2;
      absl::Time last_tick = absl::Now();
      while (!raw->shutdown_) {
        raw->cv_.wait_for(lock, absl::ToChronoMilliseconds(period));
        if (raw->shutdown_) break;
        // A pause of the coordinator itself (a stalled machine, swapping, a
        // debugger) is not its members' fault: heartbeats could not be
        // heard meanwhile, so the time beyond the tick period does not
        // count against any lease.
        const absl::Time now = absl::Now();
        const absl::Duration late = now - last_tick - period;
        last_tick = now;
        if (late > period) {
          for (auto& [id, m] : raw->members_) m.last_beat += late;
          spdlog::warn("coordinator: paused for {}; leases extended by as much", absl::FormatDuration(late));
        }
        raw->ExpireLeases();
        raw->Schedule();
        // Periodic checkpoints.
        for (auto& [id, job] : raw->jobs_) {
          const JobStatus& st = job.stored.status;
          if (st.state() != RUNNING || job.checkpointing || job.restoring || job.spec.checkpoint_every_steps <= 0 ||
              st.params_size() == 0 || st.workers_size() < job.spec.workers) {
            continue;
          }
          if (st.step() >= job.last_checkpoint_step + job.spec.checkpoint_every_steps && st.step() < st.steps()) {
            job.checkpointing = true;  // claimed; RunCheckpoint() takes it from here
            raw->Background([raw, id = id] {
              auto r = raw->RunCheckpoint(id);
              if (!r.ok()) spdlog::warn("coordinator: periodic checkpoint of {}: {}", id, r.status().ToString());
            });
          }
        }
      }
    });
  }
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  std::vector<BackgroundThread> background;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    cv_.notify_all();
    background.swap(background_);
  }
  if (ticker_.joinable()) ticker_.join();
  for (auto& t : background) t.thread.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    persist_stop_ = true;
    persist_cv_.notify_all();
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
  background_.push_back(BackgroundThread{std::thread([fn = std::move(fn), finished] {
                                           fn();
                                           finished->store(true);
                                         }),
                                         finished});
}

void Coordinator::PersistLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    persist_cv_.wait(lock, [&] { return persist_stop_ || !dirty_.empty(); });
    if (dirty_.empty() && persist_stop_) return;
    std::map<std::string, JobStatus> batch;
    batch.swap(dirty_);
    lock.unlock();
    // SQLite's fsync happens here, with the coordinator's mutex free.
    for (const auto& [id, status] : batch) {
      if (options_.before_persist) options_.before_persist(id);
      absl::Status s = store_->Update(status);
      if (!s.ok()) spdlog::error("coordinator: persisting {}: {}", id, s.ToString());
    }
    lock.lock();
  }
}

std::string Coordinator::RelativeToRoot(const std::string& dir) const {
  const std::string& root = options_.checkpoint_root;
  if (dir == root) return "";
  if (root == "/") return dir.substr(1);
  return dir.substr(root.size() + 1);
}

absl::StatusOr<std::string> Coordinator::UnderRoot(const std::string& path, const char* what) const {
  if (path.empty() || path.find('\0') != std::string::npos || path.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", Quote(path), "' is not a usable path"));
  }
  // Symbolic links in the part that exists are resolved: one planted in the
  // tree cannot lead out of the root.
  std::error_code ec;
  std::string abs = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec).string();
  while (abs.size() > 1 && abs.back() == '/') abs.pop_back();
  const std::string& root = options_.checkpoint_root;
  if (ec || (root != "/" && abs != root && abs.rfind(root + "/", 0) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", Quote(path), "' is outside the checkpoint root ",
                                                   root, " (pstrain-coordinator --checkpoint_root): shards and "
                                                   "workers read and write only there"));
  }
  return abs;
}

Coordinator::Job* Coordinator::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void Coordinator::Changed(Job& job) {
  ++job.version;
  dirty_[job.stored.id] = job.stored.status;
  persist_cv_.notify_all();
  cv_.notify_all();
}

void Coordinator::RefreshMembers(Job& job) {
  // The status lists the job's members with their current health.
  for (MemberStatus& m : *job.stored.status.mutable_members()) {
    bool found = false;
    for (auto& [id, member] : members_) {
      if (member.status.name() == m.name() && member.status.role() == m.role()) {
        m.set_alive(member.status.alive());
        m.set_last_heartbeat_unix_ms(member.status.last_heartbeat_unix_ms());
        m.set_member_id(id);
        m.set_address(member.status.address());
        found = true;
      }
    }
    if (!found) m.set_alive(false);
  }
}

void Coordinator::Transition(Job& job, JobState state, const std::string& reason,
                             const std::string& message) {
  JobStatus& st = job.stored.status;
  st.set_state(state);
  // The first condition (Submitted) and the newest ones are kept.
  if (options_.max_conditions >= 2 && static_cast<size_t>(st.conditions_size()) >= options_.max_conditions) {
    st.mutable_conditions()->DeleteSubrange(1, st.conditions_size() - static_cast<int>(options_.max_conditions) + 1);
  }
  JobCondition* c = st.add_conditions();
  c->set_state(state);
  c->set_time_unix_ms(NowMs());
  c->set_reason(reason);
  c->set_message(message);
  spdlog::info("coordinator: {} -> {} ({}: {})", st.job_id(), JobStateName(state), reason, message);
  if (IsTerminal(state)) {
    // The shards free the job's table; workers still waiting on it (a SYNC
    // step) are released at once.
    DropTables(st);
    RefreshMembers(job);
    for (auto& [id, member] : members_) {
      if (member.status.job_id() == st.job_id()) {
        member.status.set_job_id("");
        member.status.set_rank(-1);
      }
    }
    kv_.erase(st.job_id());
  }
  Changed(job);
}

void Coordinator::DropTables(const JobStatus& st) {
  std::vector<std::string> shard_addresses;
  for (const MemberStatus& m : st.members()) {
    if (m.role() == "shard") shard_addresses.push_back(m.address());
  }
  if (shard_addresses.empty()) return;
  // The attempt that ends: a table the shards already hold for a later one
  // (this drop delayed) is kept.
  Background([shard_addresses, id = st.job_id(), attempt = st.attempt()] {
    for (const std::string& a : shard_addresses) {
      RemoteShardOptions ro;
      ro.target = a;
      ro.default_timeout = absl::Seconds(10);
      ro.max_attempts = 2;
      GrpcRemoteShard& client = *SharedRemoteShard(ro);
      DropTableRequest req;
      req.set_job(id);
      req.set_attempt(attempt);
      DropTableResponse resp;
      absl::Status s = WaitFor([&](StatusCallback done) { client.DropTable(req, &resp, {}, done); });
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
  for (auto& [id, member] : members_) {
    if (member.status.job_id() != st.job_id()) continue;
    if (member.status.role() == "worker" && member.status.alive()) {
      member.releasing = true;  // free once it has stopped
    } else {
      member.status.set_job_id("");
      member.status.set_rank(-1);
    }
  }
  st.clear_members();
  st.clear_workers();
  st.set_resumed_from(ResumePoint(job));
  job.done_ranks.clear();
  job.paused.clear();
  job.pause_requested = false;
  job.checkpointing = false;
  job.draining = false;
  job.start_positions.clear();
  st.set_restarts(st.restarts() + 1);
  kv_.erase(st.job_id());
  Transition(job, PENDING, reason,
             absl::StrCat(message, "; restart ", st.restarts(), " of at most ", job.spec.max_restarts,
                          " will resume from ", st.resumed_from()));
}

void Coordinator::Drain(const std::string& job_id, const std::string& who) {
  // A checkpoint already in progress is waited for, then a fresh one taken
  // (the leaving worker keeps training until the job stops).
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  absl::Status saved = absl::DeadlineExceededError("no checkpoint within 90 s");
  while (absl::Now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Job* job = FindJob(job_id);
      if (job == nullptr || !job->draining || shutdown_) return;
      const JobState state = job->stored.status.state();
      if (state != RUNNING && state != CHECKPOINTING) return;
    }
    auto r = Checkpoint(job_id);
    saved = r.status();
    if (!absl::IsUnavailable(r.status())) break;
    absl::SleepFor(absl::Milliseconds(200));  // another checkpoint is in progress
  }
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr || !job->draining) return;
  const JobState state = job->stored.status.state();
  if (state != RUNNING && state != CHECKPOINTING) return;
  if (saved.ok() && CanRestart(*job)) {
    Requeue(*job, "MemberLeft", absl::StrCat(who, " shut down; the job was checkpointed"));
  } else {
    Transition(*job, FAILED, "MemberLeft",
               absl::StrCat(who, " shut down and the job cannot restart: ",
                            saved.ok() ? "no restarts left" : std::string(saved.message())));
  }
  Schedule();
}

absl::StatusOr<std::string> Coordinator::SubmitJob(const SubmitJobRequest& request) {
  std::string spec_yaml = request.spec_yaml();
  std::string resume_dir;
  CheckpointManifest manifest;
  if (request.spec_yaml().size() > (1 << 20)) {
    return absl::InvalidArgumentError("the job spec is larger than 1 MiB");
  }
  if (!request.resume_from().empty()) {
    auto dir = UnderRoot(request.resume_from(), "resume_from");
    if (!dir.ok()) return dir.status();
    resume_dir = *dir;
    auto m = ReadManifest(resume_dir);
    if (!m.ok()) return m.status();
    manifest = std::move(*m);
    if (spec_yaml.empty()) spec_yaml = manifest.spec_yaml;
  }
  auto spec = ParseJobSpec(spec_yaml, "job spec");
  if (!spec.ok()) return spec.status();
  if (!resume_dir.empty() && spec->chunk_bytes != manifest.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes is ", spec->chunk_bytes, " but the checkpoint was cut in chunks of ",
                                                   manifest.chunk_bytes, ": use the same chunk_bytes"));
  }
  JobStatus status;
  status.set_name(spec->name);
  status.set_state(PENDING);
  status.set_created_unix_ms(NowMs());
  status.set_final_accuracy(-1);
  status.set_num_shards(spec->shards);
  status.set_num_workers(spec->workers);
  status.set_resumed_from(resume_dir);
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
  auto output_dir_or = UnderRoot(request.output_dir().empty() ? spec->output_dir : request.output_dir(), "output_dir");
  if (!output_dir_or.ok()) return output_dir_or.status();
  const std::string output_dir = *output_dir_or;
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  auto stored = store_->Create(spec_yaml, output_dir, status);
  if (!stored.ok()) return stored.status();
  Job job;
  job.spec = *spec;
  job.stored = std::move(*stored);
  const std::string id = job.stored.id;
  Job& j = jobs_.emplace(id, std::move(job)).first->second;
  Transition(j, PENDING, "Submitted",
             absl::StrCat("waiting for ", spec->shards > 0 ? absl::StrCat(spec->shards, " shard(s) and ") : "",
                          spec->workers, " worker(s)",
                          resume_dir.empty() ? "" : absl::StrCat("; will resume from ", resume_dir)));
  Schedule();
  return id;
}

absl::StatusOr<JobStatus> Coordinator::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "' (see `pstrain list`)"));
  RefreshMembers(*job);
  return job->stored.status;
}

std::vector<JobStatus> Coordinator::ListJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Job*> order;
  for (auto& [id, job] : jobs_) order.push_back(&job);
  std::sort(order.begin(), order.end(),
            [](const Job* a, const Job* b) { return a->stored.seq < b->stored.seq; });
  std::vector<JobStatus> out;
  for (const Job* j : order) out.push_back(j->stored.status);
  return out;
}

absl::StatusOr<JobState> Coordinator::CancelJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
  const JobState state = job->stored.status.state();
  if (IsTerminal(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", JobStateName(state), ")"));
  }
  Transition(*job, CANCELLED, "CancelRequested", "cancelled by a user; its members are freed");
  Schedule();
  return CANCELLED;
}

absl::StatusOr<JobStatus> Coordinator::WaitJob(const std::string& job_id, uint64_t* version,
                                               absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    Job* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
    if (job->version > *version || absl::Now() >= deadline || shutdown_) {
      *version = job->version;
      RefreshMembers(*job);
      return job->stored.status;
    }
    cv_.wait_until(lock, absl::ToChronoTime(deadline));
  }
}

absl::StatusOr<RegisterResponse> Coordinator::Register(const RegisterRequest& request) {
  if (request.role() != "shard" && request.role() != "worker") {
    return absl::InvalidArgumentError("role must be shard or worker");
  }
  if (request.role() == "shard" && request.address().empty()) {
    return absl::InvalidArgumentError("a shard must give the address of its ParameterService");
  }
  if (request.name().size() > kMaxNameBytes || request.address().size() > kMaxAddressBytes ||
      request.job_id().size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name (", Quote(request.name()), ") longer than ", kMaxNameBytes,
                                                   " bytes, address longer than ", kMaxAddressBytes,
                                                   " or job id longer than ", kMaxIdBytes));
  }
  for (char ch : request.name()) {
    if (static_cast<unsigned char>(ch) < 0x21 || ch == 0x7f || ch == '#') {
      return absl::InvalidArgumentError(absl::StrCat("member name '", Quote(request.name()),
                                                     "' holds a space, a control character or '#'"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (members_.size() >= options_.max_members) {
    bool replaces = false;
    for (const auto& [id, m] : members_) replaces = replaces || m.status.name() == request.name();
    if (!replaces) {
      return absl::ResourceExhaustedError(absl::StrCat("the coordinator already has ", members_.size(),
                                                       " members, its limit; dead ones are forgotten after ",
                                                       options_.forget_after_leases, " leases"));
    }
  }
  std::string name = request.name().empty() ? absl::StrCat(request.role(), "-", next_member_) : request.name();
  // A member that registers again (after a restart on either side) replaces
  // its old registration.
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.status.name() == name) {
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
  Member m;
  const std::string id = absl::StrCat(name, "#", next_member_++);
  m.status.set_member_id(id);
  m.status.set_role(request.role());
  m.status.set_name(name);
  m.status.set_address(request.address());
  m.status.set_alive(true);
  m.status.set_last_heartbeat_unix_ms(NowMs());
  m.status.set_rank(-1);
  m.last_beat = absl::Now();
  // Re-attach to a running job it was part of.
  if (!request.job_id().empty()) {
    Job* job = FindJob(request.job_id());
    // Only into the attempt it was running: a member of an earlier attempt
    // (back from a partition) is not re-attached to the job's new run.
    if (job != nullptr && !IsTerminal(job->stored.status.state()) &&
        request.attempt() == job->stored.status.attempt()) {
      for (const MemberStatus& jm : job->stored.status.members()) {
        if (jm.name() == name && jm.role() == request.role()) {
          m.status.set_job_id(request.job_id());
          m.status.set_rank(jm.rank());
        }
      }
    }
  }
  spdlog::info("coordinator: {} {} registered{}", request.role(), Quote(name),
               m.status.job_id().empty() ? "" : absl::StrCat(" (on ", m.status.job_id(), ")"));
  members_[id] = std::move(m);
  cv_.notify_all();
  Schedule();
  RegisterResponse r;
  r.set_member_id(id);
  r.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return r;
}

absl::StatusOr<HeartbeatResponse> Coordinator::Heartbeat(const HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(request.member_id());
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("member ", Quote(request.member_id()),
                                            " is not registered (coordinator restarted?): register again"));
  }
  Member& m = it->second;
  m.last_beat = absl::Now();
  m.status.set_last_heartbeat_unix_ms(NowMs());
  if (!m.status.alive()) {
    m.status.set_alive(true);
    cv_.notify_all();
  }
  HeartbeatResponse r;
  if (m.releasing) {
    if (request.running_job_id().empty()) {
      m.releasing = false;
      m.status.set_job_id("");
      m.status.set_rank(-1);
      Schedule();
    }
    r.set_cancel_job(!request.running_job_id().empty());
    return r;
  }
  r.set_job_id(m.status.job_id());
  Job* job = m.status.job_id().empty() ? nullptr : FindJob(m.status.job_id());
  if (job != nullptr) r.set_attempt(job->stored.status.attempt());
  if (job != nullptr && m.status.role() == "worker") {
    r.set_pause(job->pause_requested);
    r.set_pause_id(job->pause_id);
  }
  // Stop a job that is no longer ours, or an earlier attempt of our job (the
  // member was lost, the job rescheduled onto it again meanwhile).
  const bool other_job = !request.running_job_id().empty() && request.running_job_id() != m.status.job_id();
  const bool old_attempt = m.status.role() == "worker" && !request.running_job_id().empty() && job != nullptr &&
                           request.running_job_id() == m.status.job_id() &&
                           request.running_attempt() != job->stored.status.attempt();
  r.set_cancel_job(other_job || old_attempt);
  return r;
}

absl::StatusOr<Assignment> Coordinator::GetAssignment(const std::string& member_id,
                                                      absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = members_.find(member_id);
    if (it == members_.end()) {
      return absl::NotFoundError(absl::StrCat("member ", Quote(member_id), " is not registered: register again"));
    }
    const MemberStatus& m = it->second.status;
    Job* job = m.job_id().empty() || it->second.releasing ? nullptr : FindJob(m.job_id());
    // Not again to a worker that has finished its part (the job ends when
    // the last one has).
    if (job != nullptr && m.role() == "worker" && job->done_ranks.count(m.rank()) > 0) job = nullptr;
    if (job != nullptr && !job->restoring) {
      Assignment a;
      a.set_job_id(m.job_id());
      a.set_spec_yaml(job->stored.spec_yaml);
      // The job's own directory: its weights (and all-reduce checkpoints).
      a.set_output_dir(absl::StrCat(job->stored.output_dir, "/", m.job_id()));
      a.set_attempt(job->stored.status.attempt());
      a.set_rank(m.rank());
      a.set_world_size(m.role() == "worker" ? job->spec.workers : job->spec.shards);
      std::vector<std::pair<int, std::string>> shards;
      for (const MemberStatus& jm : job->stored.status.members()) {
        if (jm.role() == "shard") shards.emplace_back(jm.rank(), jm.address());
      }
      std::sort(shards.begin(), shards.end());
      for (auto& [rank, address] : shards) a.add_shard_addresses(address);
      a.set_resume_from(job->stored.status.resumed_from());
      for (const auto& w : job->start_positions) {
        if (w.rank == m.rank()) {
          a.set_start_step(w.step);
          a.set_start_epoch(w.epoch);
          a.set_start_epoch_step(w.epoch_step);
        }
      }
      return a;
    }
    if (absl::Now() >= deadline || shutdown_) return Assignment();
    cv_.wait_until(lock, absl::ToChronoTime(deadline));
  }
}

absl::StatusOr<ReportProgressResponse> Coordinator::ReportProgress(const ReportProgressRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!request.event_json().empty()) {
    return absl::InvalidArgumentError("event_json is retired: send the event as a WorkerEvent (field `event`)");
  }
  if (request.event().ByteSizeLong() > kMaxEventBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an event is limited to ", kMaxEventBytes, " bytes"));
  }
  auto it = members_.find(request.member_id());
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("member ", Quote(request.member_id()), " is not registered"));
  }
  ReportProgressResponse r;
  Member& m = it->second;
  m.last_beat = absl::Now();
  Job* job = FindJob(request.job_id());
  if (job == nullptr || m.status.job_id() != request.job_id() || m.releasing ||
      request.attempt() != job->stored.status.attempt()) {
    r.set_cancel_job(true);  // not (or no longer) this member's job, or an ended attempt of it
    return r;
  }
  absl::Status applied = ApplyEvent(*job, m, request.event());
  if (!applied.ok()) return applied;
  r.set_cancel_job(m.status.job_id() != request.job_id());
  return r;
}

absl::Status Coordinator::ApplyEvent(Job& job, Member& member, const WorkerEvent& e) {
  const int rank = member.status.rank();
  JobStatus& st = job.stored.status;
  switch (e.kind_case()) {
    case WorkerEvent::kProgress: {
      const WorkerEvent::Progress& p = e.progress();
      while (st.workers_size() < job.spec.workers) st.add_workers()->set_rank(st.workers_size() - 1);
      if (rank < 0 || rank >= st.workers_size()) return absl::OkStatus();
      WorkerProgress* w = st.mutable_workers(rank);
      w->set_epoch(p.epoch());
      w->set_step(p.step());
      w->set_steps(p.steps());
      w->set_loss(p.loss());
      w->set_samples_per_s(p.samples_per_s());
      // The job is as far as its slowest reporting worker; rates add up.
      int64_t step = INT64_MAX;
      int epoch = INT32_MAX, reporting = 0;
      double loss = 0, rate = 0;
      for (const WorkerProgress& wp : st.workers()) {
        if (wp.steps() == 0) continue;  // not reported yet
        ++reporting;
        step = std::min(step, wp.step());
        epoch = std::min(epoch, wp.epoch());
        loss += wp.loss();
        rate += wp.samples_per_s();
      }
      if (reporting > 0) {
        st.set_step(step);
        st.set_epoch(epoch);
        st.set_steps(w->steps());
        st.set_loss(loss / reporting);
        st.set_samples_per_s(rate);
      }
      // Progress is frequent: notify watchers, persist only on transitions.
      ++job.version;
      cv_.notify_all();
      break;
    }
    case WorkerEvent::kEval: {
      EpochEval ev;
      ev.set_epoch(e.eval().epoch());
      ev.set_accuracy(e.eval().accuracy());
      ev.set_test_loss(e.eval().test_loss());
      if (st.evals_size() >= 10000) return absl::ResourceExhaustedError("a job keeps at most 10000 evaluations");
      *st.add_evals() = ev;
      if (e.eval().final()) st.set_final_accuracy(ev.accuracy());
      Changed(job);
      break;
    }
    case WorkerEvent::kWeights:
      st.set_weights_path(e.weights().path());
      Changed(job);
      break;
    case WorkerEvent::kPlan:
      if (st.params_size() == 0) {
        if (e.plan().params_size() > 1000000) return absl::InvalidArgumentError("a plan of more than 10^6 parameters");
        st.set_chunk_bytes(e.plan().chunk_bytes());
        *st.mutable_params() = e.plan().params();
        Changed(job);
      }
      break;
    case WorkerEvent::kPaused:
      // Only a pause for the checkpoint in progress counts (not a late one).
      if (job.pause_requested && e.paused().pause_id() == job.pause_id) {
        job.paused[rank] = {rank, e.paused().step(), e.paused().epoch(), e.paused().epoch_step()};
        cv_.notify_all();
      }
      break;
    case WorkerEvent::kDone:
      if (job.done_ranks.insert(rank).second) {
        st.set_samples(st.samples() + e.done().samples());
        st.set_train_seconds(std::max(st.train_seconds(), e.done().seconds()));
      }
      Changed(job);
      MaybeSucceed(job);
      break;
    case WorkerEvent::kDraining:
      member.leaving = true;
      if ((st.state() == RUNNING || st.state() == CHECKPOINTING) && !job.draining) {
        job.draining = true;
        const std::string who =
            absl::StrCat(e.draining().role() == "shard" ? "shard" : "worker", " ", rank);
        Transition(job, st.state(), "MemberLeaving",
                   absl::StrCat(who, " is shutting down: checkpointing, then the job waits for a replacement"));
        Background([this, id = st.job_id(), who] { Drain(id, who); });
      }
      break;
    case WorkerEvent::kError:
      if (!IsTerminal(st.state()) && st.state() != PENDING) {
        const std::string what = absl::StrCat("worker ", rank, ": ",
                                              Quote(e.error().message().empty() ? "failed" : e.error().message(), 4096));
        // A lost peer or shard (not a bug in the job) restarts it from its
        // last checkpoint, if it has one.
        if (e.error().retryable() && CanRestart(job)) {
          Requeue(job, "WorkerFailed", what);
        } else {
          Transition(job, FAILED, "WorkerFailed", what);
        }
        Schedule();
      }
      break;
    case WorkerEvent::KIND_NOT_SET:
      return absl::InvalidArgumentError("the event has no kind (progress, eval, plan, ...)");
  }
  return absl::OkStatus();
}

void Coordinator::MaybeSucceed(Job& job) {
  // A job being checkpointed finishes once the checkpoint is written.
  if (static_cast<int>(job.done_ranks.size()) >= job.spec.workers &&
      job.stored.status.state() == RUNNING) {
    Transition(job, SUCCEEDED, "Completed", absl::StrCat("all ", job.spec.workers, " workers finished"));
    Schedule();
  }
}

void Coordinator::ExpireLeases() {
  const absl::Time now = absl::Now();
  for (auto& [id, m] : members_) {
    if (m.status.alive() && now - m.last_beat > lease()) {
      m.status.set_alive(false);
      if (m.releasing) {
        m.releasing = false;
        m.status.set_job_id("");
        m.status.set_rank(-1);
      }
      spdlog::warn("coordinator: {} {} lost (no heartbeat for {})", m.status.role(), m.status.name(),
                   absl::FormatDuration(now - m.last_beat));
    }
  }
  // A running job needs every one of its members, alive and attached.
  for (auto& [id, job] : jobs_) {
    JobStatus& st = job.stored.status;
    if (st.state() != RUNNING && st.state() != CHECKPOINTING) continue;
    if (now < job.attach_deadline) continue;
    for (const MemberStatus& jm : st.members()) {
      bool ok = false;
      for (auto& [mid, m] : members_) {
        ok = ok || (m.status.name() == jm.name() && m.status.alive() && m.status.job_id() == id);
      }
      if (!ok) {
        const std::string what = absl::StrCat(jm.role(), " ", jm.name(), " (rank ", jm.rank(), ") was lost: missed ",
                                              options_.missed_heartbeats, " heartbeats");
        if (CanRestart(job)) {
          Requeue(job, "MemberLost", what);
        } else {
          Transition(job, FAILED, "MemberLost",
                     absl::StrCat(what, ResumePoint(job).empty()
                                            ? " (no checkpoint to restart from)"
                                            : " (no restarts left)"));
        }
        break;
      }
    }
  }
  // Registrations of members long dead (and holding no job) are forgotten,
  // so a stream of fake or short-lived members cannot fill the table.
  for (auto it = members_.begin(); it != members_.end();) {
    const Member& m = it->second;
    if (!m.status.alive() && m.status.job_id().empty() && now - m.last_beat > options_.forget_after_leases * lease()) {
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
}

void Coordinator::Schedule() {
  std::vector<Job*> pending;
  for (auto& [id, job] : jobs_) {
    if (job.stored.status.state() == PENDING) pending.push_back(&job);
  }
  std::sort(pending.begin(), pending.end(),
            [](const Job* a, const Job* b) { return a->stored.seq < b->stored.seq; });
  // The oldest pending job cannot start: it says why, the others that it
  // is in front of (strict FIFO: nothing overtakes it).
  auto hold = [&](const Job* head, const std::string& why) {
    for (Job* later : pending) {
      if (later->stored.status.state() != PENDING) continue;  // scheduled just now
      const std::string r = later == head ? why : absl::StrCat("Queued behind ", head->stored.id);
      if (later->stored.status.pending_reason() != r) {
        later->stored.status.set_pending_reason(r);
        ++later->version;
      }
    }
    cv_.notify_all();
  };
  for (Job* job : pending) {
    int stopping = 0;
    for (auto& [id, m] : members_) stopping += m.releasing && m.status.job_id() == job->stored.id ? 1 : 0;
    if (stopping > 0) {
      // Its previous attempt's workers must stop before the shards reload.
      return hold(job, absl::StrCat("Stopping the previous attempt (", stopping, " worker(s))"));
    }
    std::vector<Member*> shards, workers;
    for (auto& [id, m] : members_) {
      if (!m.status.alive() || !m.status.job_id().empty() || m.leaving) continue;
      (m.status.role() == "shard" ? shards : workers).push_back(&m);
    }
    auto by_name = [](const Member* a, const Member* b) { return a->status.name() < b->status.name(); };
    std::sort(shards.begin(), shards.end(), by_name);
    std::sort(workers.begin(), workers.end(), by_name);
    if (static_cast<int>(shards.size()) < job->spec.shards ||
        static_cast<int>(workers.size()) < job->spec.workers) {
      return hold(job, absl::StrCat("Unschedulable: needs ", job->spec.shards, " shard(s) and ", job->spec.workers,
                                    " worker(s); free now: ", shards.size(), " shard(s), ", workers.size(),
                                    " worker(s)"));
    }
    JobStatus& st = job->stored.status;
    st.clear_pending_reason();
    st.clear_members();
    std::vector<std::string> names;
    auto assign = [&](std::vector<Member*>& pool, int count) {
      for (int r = 0; r < count; ++r) {
        pool[r]->status.set_job_id(st.job_id());
        pool[r]->status.set_rank(r);
        MemberStatus* ms = st.add_members();
        *ms = pool[r]->status;
        names.push_back(pool[r]->status.name());
      }
    };
    assign(shards, job->spec.shards);
    assign(workers, job->spec.workers);
    job->attach_deadline = absl::Now();
    job->done_ranks.clear();
    // A new attempt: requests of the previous ones are refused from now on.
    st.set_attempt(st.attempt() + 1);
    Transition(*job, RUNNING, "Scheduled",
               absl::StrCat("attempt ", st.attempt(), " assigned to ", absl::StrJoin(names, ", ")));
    if (!st.resumed_from().empty()) {
      job->restoring = true;
      Background([this, id = st.job_id()] { Restore(id); });
    }
  }
}

void Coordinator::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeases();
  Schedule();
}

std::vector<MemberStatus> Coordinator::Members() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MemberStatus> out;
  for (auto& [id, m] : members_) out.push_back(m.status);
  return out;
}

absl::Status Coordinator::CheckKvAccess(const std::string& job_id, uint64_t attempt) {
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
  if (attempt != job->stored.status.attempt()) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " is at attempt ", job->stored.status.attempt(),
                                           "; this request is of attempt ", attempt, ", which has ended"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::KvSet(const std::string& job_id, uint64_t attempt, const std::string& key,
                                const std::string& value) {
  if (key.empty() || key.size() > kMaxKvKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a key must have 1 to ", kMaxKvKeyBytes, " bytes"));
  }
  if (value.size() > options_.max_kv_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a value is limited to ", options_.max_kv_value_bytes, " bytes; got ", value.size()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckKvAccess(job_id, attempt);
  if (!s.ok()) return s;
  auto& table = kv_[job_id];
  size_t bytes = 0;
  for (const auto& [k, v] : table) bytes += k.size() + v.size();
  auto it = table.find(key);
  if (it != table.end()) bytes -= key.size() + it->second.size();
  if ((it == table.end() && table.size() >= options_.max_kv_keys) ||
      bytes + key.size() + value.size() > options_.max_kv_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", job_id, "'s rendezvous store is full (",
                                                     options_.max_kv_keys, " keys, ", options_.max_kv_bytes,
                                                     " bytes at most)"));
  }
  table[key] = value;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::KvGet(const std::string& job_id, uint64_t attempt, const std::string& key,
                                               absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    absl::Status s = CheckKvAccess(job_id, attempt);
    if (!s.ok()) return s;
    auto table = kv_.find(job_id);
    if (table != kv_.end()) {
      auto it = table->second.find(key);
      if (it != table->second.end()) return it->second;
    }
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    if (absl::Now() >= deadline) {
      return absl::NotFoundError(absl::StrCat("key '", Quote(key), "' of job ", job_id, " was not set in time"));
    }
    cv_.wait_until(lock, absl::ToChronoTime(deadline));
  }
}

absl::StatusOr<int64_t> Coordinator::KvAdd(const std::string& job_id, uint64_t attempt, const std::string& key,
                                           int64_t delta) {
  if (key.empty() || key.size() > kMaxKvKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a key must have 1 to ", kMaxKvKeyBytes, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = CheckKvAccess(job_id, attempt);
  if (!s.ok()) return s;
  auto& table = kv_[job_id];
  auto it = table.find(key);
  if (it == table.end() && table.size() >= options_.max_kv_keys) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", job_id, "'s rendezvous store is full"));
  }
  int64_t n = 0;
  if (it != table.end() && !it->second.empty() && !absl::SimpleAtoi(it->second, &n)) {
    return absl::FailedPreconditionError(absl::StrCat("key '", Quote(key), "' does not hold a number"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(n, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrCat("key '", Quote(key), "' holds ", n, "; adding ", delta, " overflows"));
  }
  table[key] = std::to_string(sum);
  cv_.notify_all();
  return sum;
}

void Coordinator::EndCheckpoint(Job& job, const std::string& reason, const std::string& message) {
  job.pause_requested = false;
  job.checkpointing = false;
  job.paused.clear();
  if (job.stored.status.state() == CHECKPOINTING) {
    Transition(job, RUNNING, reason, message);
    MaybeSucceed(job);
  }
}

absl::StatusOr<CheckpointResponse> Coordinator::Checkpoint(const std::string& job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
    const JobState state = job->stored.status.state();
    if (state != RUNNING && state != CHECKPOINTING) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName(state), ": only a running job can be checkpointed"));
    }
    if (job->checkpointing) {
      return absl::UnavailableError(
          absl::StrCat("a checkpoint of job ", job_id, " is already in progress; try again when it is done"));
    }
    job->checkpointing = true;  // claimed, atomically with the check above
  }
  if (options_.on_checkpoint_claimed) options_.on_checkpoint_claimed(job_id);
  return RunCheckpoint(job_id);
}

absl::StatusOr<CheckpointResponse> Coordinator::RunCheckpoint(const std::string& job_id) {
  CheckpointManifest manifest;
  std::vector<std::string> shards;
  std::string dir;
  int keep = 1;
  bool allreduce = false;
  int64_t pause_id = 0;
  uint64_t attempt = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
    JobStatus& st = job->stored.status;
    if (st.state() != RUNNING) {
      job->checkpointing = false;
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName(st.state()), ": only a running job can be checkpointed"));
    }
    // A job that is still starting has not reported its model yet: wait.
    const absl::Time start_deadline = absl::Now() + absl::Seconds(60);
    while ((job->stored.status.params_size() == 0 || job->restoring) &&
           job->stored.status.state() == RUNNING && absl::Now() < start_deadline && !shutdown_) {
      cv_.wait_until(lock, absl::ToChronoTime(std::min(start_deadline, absl::Now() + absl::Seconds(1))));
      job = FindJob(job_id);
    }
    if (job->stored.status.params_size() == 0 || job->restoring || job->stored.status.state() != RUNNING) {
      job->checkpointing = false;
      return absl::UnavailableError(absl::StrCat("job ", job_id, " did not start training within 60 s; try again later"));
    }
    job->checkpointing = true;
    job->pause_requested = true;
    ++job->pause_id;
    job->paused.clear();
    Transition(*job, CHECKPOINTING, "CheckpointRequested", "pausing the workers at a step boundary");
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (true) {
      job = FindJob(job_id);
      if (IsTerminal(job->stored.status.state())) {
        job->pause_requested = false;
        job->checkpointing = false;
        return absl::AbortedError(absl::StrCat("job ", job_id, " ended during the checkpoint"));
      }
      int ready = static_cast<int>(job->paused.size());
      for (int r : job->done_ranks) ready += job->paused.count(r) == 0 ? 1 : 0;
      if (ready >= job->spec.workers) break;
      if (absl::Now() > deadline || shutdown_) {
        EndCheckpoint(*job, "CheckpointFailed", "the workers did not pause within 120 s");
        return absl::DeadlineExceededError(absl::StrCat("job ", job_id, ": the workers did not pause in time"));
      }
      cv_.wait_until(lock, absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
    }
    if (job->spec.mode == "allreduce" && job->paused.count(0) == 0) {
      // Worker 0 holds the model in this mode; it finished its steps before
      // reaching the agreed pause, so nobody is left to write it (the job
      // is about to end: its final weights are being written).
      EndCheckpoint(*job, "CheckpointSkipped", "worker 0 finished before the pause");
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " finished its steps before the checkpoint could be taken"));
    }
    const JobStatus& s = job->stored.status;
    manifest.job = job_id;
    manifest.name = s.name();
    manifest.created_unix_ms = absl::ToUnixMillis(absl::Now());
    manifest.spec_yaml = job->stored.spec_yaml;
    manifest.chunk_bytes = s.chunk_bytes();
    for (const ParameterInfo& p : s.params()) {
      manifest.params.push_back({p.name(), std::vector<int64_t>(p.shape().begin(), p.shape().end()),
                                 static_cast<DataType>(p.dtype())});
    }
    manifest.step = INT64_MAX;
    for (const auto& [rank, w] : job->paused) {
      manifest.workers.push_back(w);
      manifest.step = std::min(manifest.step, w.step);
    }
    if (manifest.step == INT64_MAX) manifest.step = s.step();
    std::vector<std::pair<int, std::string>> by_rank;
    for (const MemberStatus& m : s.members()) {
      if (m.role() == "shard") by_rank.emplace_back(m.rank(), m.address());
    }
    std::sort(by_rank.begin(), by_rank.end());
    for (auto& [r, a] : by_rank) shards.push_back(a);
    // The job's own directory: jobs sharing an output_dir never touch each
    // other's checkpoints.
    dir = CheckpointDir(JobDir(job->stored.output_dir, job_id), manifest.step);
    attempt = job->stored.status.attempt();
    keep = job->spec.checkpoint_keep;
    allreduce = job->spec.mode == "allreduce";
    pause_id = job->pause_id;
  }

  // The shards write their tables, all at once, outside the lock.
  const std::string tmp = PendingCheckpointDir(dir);
  std::error_code ec;
  absl::Status status = UnderRoot(dir, "the checkpoint directory").status();
  if (status.ok()) {
    std::filesystem::remove_all(tmp, ec);
    std::filesystem::create_directories(tmp, ec);
    if (ec) status = ErrnoToStatus(ec.value(), "cannot create", tmp);
  }
  std::vector<SaveTableResponse> saved(allreduce ? 1 : shards.size());
  if (status.ok() && allreduce) {
    // No shards: worker 0 holds the model (its local store) and writes it in
    // the shards' format while the workers are paused; the path and the
    // result go through the job's KV store.
    const std::string prefix = absl::StrCat("ckpt/", pause_id, "/");
    status = KvSet(job_id, attempt, prefix + "path", absl::StrCat(tmp, "/shard-0.bin"));
    absl::StatusOr<std::string> result =
        status.ok() ? KvGet(job_id, attempt, prefix + "saved", absl::Now() + absl::Minutes(10)) : status;
    nlohmann::json r = result.ok() ? nlohmann::json::parse(*result, nullptr, false) : nlohmann::json();
    if (!result.ok()) {
      status = absl::Status(result.status().code(), absl::StrCat("worker 0 did not save: ", result.status().message()));
    } else if (!r.is_object() || r.contains("error") || !r.contains("bytes") || !r["bytes"].is_number_unsigned() ||
               !r.contains("crc32") || !r["crc32"].is_number_unsigned()) {
      // What worker 0 wrote is not a saved file's size and crc32 (checked
      // by type: nlohmann's value() throws on a mismatch).
      const bool said = r.is_object() && r.contains("error") && r["error"].is_string();
      status = absl::InternalError(
          absl::StrCat("worker 0: ", Quote(said ? r["error"].get<std::string>() : *result, 1024)));
    } else {
      saved[0].set_bytes(r["bytes"].get<uint64_t>());
      saved[0].set_crc32(static_cast<uint32_t>(r["crc32"].get<uint64_t>()));
    }
  }
  if (status.ok() && !allreduce) {
    std::mutex done_mu;
    std::condition_variable done_cv;
    size_t pending = shards.size();
    for (size_t i = 0; i < shards.size(); ++i) {
      RemoteShardOptions ro;
      ro.target = shards[i];
      GrpcRemoteShard* client = SharedRemoteShard(ro);
      SaveTableRequest req;
      req.set_job(job_id);
      req.set_path(absl::StrCat(RelativeToRoot(tmp), "/shard-", i, ".bin"));
      req.set_attempt(attempt);
      CallOptions opts;
      opts.deadline = absl::Now() + absl::Minutes(10);
      client->SaveTable(req, &saved[i], opts, [&, i](absl::Status s) {
        std::lock_guard<std::mutex> l(done_mu);
        if (!s.ok() && status.ok()) status = absl::Status(s.code(), absl::StrCat("shard ", i, ": ", s.message()));
        if (--pending == 0) done_cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> l(done_mu);
    done_cv.wait(l, [&] { return pending == 0; });
  }
  if (status.ok()) {
    for (size_t i = 0; i < saved.size(); ++i) {
      manifest.shards.push_back({static_cast<int>(i), absl::StrCat("shard-", i, ".bin"), saved[i].bytes(),
                                 saved[i].crc32()});
    }
    status = WriteManifest(tmp, manifest);
  }
  // The directory appears whole or not at all; the job's older ones go.
  // File system work, outside the lock.
  if (status.ok()) status = CommitCheckpoint(tmp, dir, keep);
  if (!status.ok()) std::filesystem::remove_all(tmp, ec);

  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindJob(job_id);
  if (!status.ok()) {
    if (job != nullptr) EndCheckpoint(*job, "CheckpointFailed", std::string(status.message()));
    return status;
  }
  if (job != nullptr) {
    job->stored.status.set_last_checkpoint(dir);
    job->last_checkpoint_step = manifest.step;
    EndCheckpoint(*job, "CheckpointSaved", absl::StrCat("step ", manifest.step, " saved in ", dir));
  }
  CheckpointResponse r;
  r.set_path(dir);
  r.set_step(manifest.step);
  return r;
}

void Coordinator::Restore(const std::string& job_id) {
  std::string dir;
  JobSpec spec;
  std::vector<std::string> shards;
  uint64_t attempt = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return;
    dir = job->stored.status.resumed_from();
    attempt = job->stored.status.attempt();
    spec = job->spec;
    std::vector<std::pair<int, std::string>> by_rank;
    for (const MemberStatus& m : job->stored.status.members()) {
      if (m.role() == "shard") by_rank.emplace_back(m.rank(), m.address());
    }
    std::sort(by_rank.begin(), by_rank.end());
    for (auto& [r, a] : by_rank) shards.push_back(a);
  }
  absl::Status status = UnderRoot(dir, "the checkpoint").status();
  auto manifest = status.ok() ? ReadManifest(dir) : absl::StatusOr<CheckpointManifest>(status);
  if (!manifest.ok()) status = manifest.status();
  absl::StatusOr<PartitionPlan> plan = absl::UnknownError("");
  if (status.ok() && !shards.empty()) {
    plan = MakePartitionPlan(manifest->params, spec.shards, static_cast<size_t>(manifest->chunk_bytes));
    if (!plan.ok()) status = plan.status();
  }
  for (size_t i = 0; status.ok() && i < shards.size(); ++i) {
    GrpcRemoteShard& client = *SharedRemoteShard(RemoteShardOptions{shards[i]});
    std::vector<std::string> keys;
    for (size_t idx : plan->shard_chunks[i]) keys.push_back(plan->chunks[idx].key);
    const LoadTableRequest req =
        RestoreRequest(*manifest, RelativeToRoot(dir), job_id, attempt, MakeTableConfig(spec), keys);
    LoadTableResponse resp;
    CallOptions opts;
    opts.deadline = absl::Now() + absl::Minutes(10);
    absl::Status s = WaitFor([&](StatusCallback done) { client.LoadTable(req, &resp, opts, done); });
    if (!s.ok()) status = absl::Status(s.code(), absl::StrCat("shard ", i, ": ", s.message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return;
  job->restoring = false;
  if (!status.ok()) {
    const std::string what = absl::StrCat("cannot restore from ", dir, ": ", status.message());
    // A shard that went away (not a bad checkpoint) is worth another try
    // on whichever shards are alive then.
    if ((absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) && CanRestart(*job)) {
      Requeue(*job, "RestoreFailed", what);
    } else {
      Transition(*job, FAILED, "RestoreFailed", what);
    }
    Schedule();
    return;
  }
  // Each worker continues where it paused (same worker count); otherwise
  // every worker starts at the checkpoint's epoch, on its new slice.
  job->start_positions.clear();
  if (static_cast<int>(manifest->workers.size()) == job->spec.workers) {
    job->start_positions = manifest->workers;
  } else {
    int epoch = INT32_MAX;
    for (const auto& w : manifest->workers) epoch = std::min(epoch, w.epoch);
    if (epoch == INT32_MAX) epoch = 0;
    for (int r = 0; r < job->spec.workers; ++r) job->start_positions.push_back({r, manifest->step, epoch, 0});
  }
  job->last_checkpoint_step = manifest->step;
  Transition(*job, RUNNING, "Restored",
             absl::StrCat("step ", manifest->step, " of ", manifest->job, " loaded from ", dir,
                          spec.mode == "allreduce" ? std::string(" by the workers")
                                                   : absl::StrCat(" onto ", spec.shards, " shard(s)")));
}

}  // namespace pstrain
