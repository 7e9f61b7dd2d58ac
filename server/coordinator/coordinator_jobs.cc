// The coordinator's JobService side: jobs are submitted, read, watched and
// cancelled; pending ones are placed by the scheduler and started.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "common/random_hex.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/scheduler.h"
#include "spdlog/spdlog.h"

namespace pstrain {

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
  status.set_final_auc(-1);
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

void Coordinator::Schedule() {
  // Running jobs first: a vacant rank is filled before new jobs start, a
  // lost shard of a replicated job replaced.
  FillVacancies();
  FillLostShards();
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
  // Every shard of a new attempt is whole: its tables are made afresh.
  st.set_routing_generation(0);
  st.clear_lost_shards();
  st.clear_catching_up_shards();
  job.routing_published = 0;
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

}  // namespace pstrain
