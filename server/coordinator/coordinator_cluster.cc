// The coordinator's ClusterService side: members register, beat, take
// assignments, report events and use their job's rendezvous store.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/pause_keys.h"
#include "common/member_role.h"
#include "common/quote.h"
#include "common/routing_key.h"
#include "rpc/table_grant.h"
#include "server/coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

// Whether a caller's token may register a member of `role`. A member token
// has one role: a compromised worker cannot serve as a shard (and be sent
// parameters and job secrets). The any-member cluster token registers either,
// as does anyone with authentication off (an anonymous admin).
bool MayRegister(CallerRole caller, MemberRole role) {
  switch (caller) {
    case CallerRole::kShard: return role == MEMBER_ROLE_SHARD;
    case CallerRole::kWorker: return role == MEMBER_ROLE_WORKER;
    case CallerRole::kCluster:
    case CallerRole::kAdmin: return true;
    case CallerRole::kCoordinator:
    case CallerRole::kUser:
    case CallerRole::kNone: break;
  }
  return false;
}

}  // namespace

absl::StatusOr<RegisterResponse> Coordinator::Register(const RegisterRequest& request, const Caller& caller) {
  if (absl::Status s = Membership::Validate(request); !s.ok()) return s;
  if (!MayRegister(caller.role, request.role())) {
    const char* role = RoleName(request.role());
    return absl::PermissionDeniedError(absl::StrCat("a ", CallerRoleName(caller.role), " token cannot register a ",
                                                    role, ": give the process a token of group pstrain:", role));
  }
  const std::string principal =
      caller.role == CallerRole::kAdmin ? std::string() : absl::StrCat(CallerRoleName(caller.role), ":", caller.user);
  absl::MutexLock lock(&mu_);
  std::string seat_job;
  const MemberStatus* seat = SeatToReattach(request, &seat_job);
  if (seat == nullptr && !request.job_id().empty()) {
    spdlog::debug("coordinator: {} {} names job {} attempt {} but not its seat there (job ended, another attempt, "
                  "or not the seat's member id): registered free", RoleName(request.role()), Quote(request.name()),
                  Quote(request.job_id(), 64), request.attempt());
  }
  auto added = members_.Add(request, Now(), principal, seat == nullptr ? std::string() : seat->member_id());
  if (!added.ok()) return added.status();
  Member& m = **added;
  if (seat != nullptr) {
    m.status.set_job_id(seat_job);
    m.status.set_rank(seat->rank());
  }
  spdlog::info("coordinator: {} {} registered{}", RoleName(request.role()), Quote(m.status.name()),
               m.status.job_id().empty() ? "" : absl::StrCat(" (on ", m.status.job_id(), ")"));
  cv_.SignalAll();
  RegisterResponse r;
  r.set_member_id(m.status.member_id());
  r.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  Schedule();
  return r;
}

const MemberStatus* Coordinator::SeatToReattach(const RegisterRequest& request, std::string* job_id) {
  if (request.previous_member_id().empty()) return nullptr;
  // A shard learns its job from its heartbeats: one whose coordinator died
  // within a heartbeat of the job's start names none. Its member id alone
  // finds the seat (the id is the credential, unguessable): without this, a
  // coordinator killed then lost the job ("shard ... was lost").
  if (request.job_id().empty()) {
    if (request.role() != MEMBER_ROLE_SHARD) return nullptr;
    for (const std::string& id : active_) {
      RegisterRequest named = request;
      named.set_job_id(id);
      if (const MemberStatus* seat = SeatToReattach(named, job_id); seat != nullptr) return seat;
    }
    return nullptr;
  }
  Job* job = FindJob(request.job_id());
  // Only into the attempt it was running: a member of an earlier attempt
  // (back from a partition) is not re-attached to the job's new run. A
  // shard learns the attempt from its heartbeats only once the store holds
  // it, so one whose coordinator died in between names none (0): it is
  // re-attached if the current attempt names it (its tables are fenced by
  // the attempt each call carries, not by this).
  const bool attempt_unheard = request.attempt() == 0 && request.role() == MEMBER_ROLE_SHARD;
  if (job == nullptr || IsTerminal(job->stored.status.state()) ||
      (request.attempt() != job->stored.status.attempt() && !attempt_unheard)) {
    return nullptr;
  }
  // The seat's member id (which the store holds) is the proof: a name and
  // a role are no credential, and a process that registers them first
  // after a restart must not take the seat, its assignment and job secret.
  for (const MemberStatus& jm : job->stored.status.members()) {
    if (jm.name() == request.name() && jm.role() == request.role() && jm.member_id() == request.previous_member_id()) {
      *job_id = request.job_id();
      return &jm;
    }
  }
  return nullptr;
}

absl::StatusOr<HeartbeatResponse> Coordinator::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  Member* found = members_.Find(request.member_id());
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("member ", Quote(request.member_id()),
                                            " is not registered (coordinator restarted?): register again"));
  }
  Member& m = *found;
  if (members_.Beat(m, Now())) cv_.SignalAll();
  const bool running = !request.running_job_id().empty();
  members_.SetActivity(m, running && m.status.role() == MEMBER_ROLE_WORKER ? request.activity() : WorkerActivity());
  HeartbeatResponse r;
  if (!m.status.unresponsive().empty()) {
    // Its data path failed the coordinator's probes (coordinator_probes.cc):
    // a fresh process under its name is trusted again.
    r.set_exit_reason(m.status.unresponsive());
    r.set_cancel_job(running);
    if (m.releasing && !running) m.Free();
    return r;
  }
  if (m.releasing) {
    if (!running) {
      m.Free();
      Schedule();
    }
    r.set_cancel_job(running);
    return r;
  }
  r.set_job_id(m.status.job_id());
  Job* job = m.status.job_id().empty() ? nullptr : FindJob(m.status.job_id());
  // Shards remember the attempt they hear of here (and name it when they
  // register again after a restart): only one the store holds.
  if (job != nullptr && AttemptDurable(*job)) r.set_attempt(job->stored.status.attempt());
  if (job != nullptr && m.status.role() == MEMBER_ROLE_WORKER) {
    r.set_pause(job->checkpoint.pause_requested);
    r.set_pause_id(job->checkpoint.pause_id);
  }
  // Stop a job that is no longer ours, or an earlier attempt of our job (the
  // member was lost, the job rescheduled onto it again meanwhile).
  const bool other_job = running && request.running_job_id() != m.status.job_id();
  const bool old_attempt = m.status.role() == MEMBER_ROLE_WORKER && running && job != nullptr &&
                           request.running_job_id() == m.status.job_id() &&
                           request.running_attempt() != job->stored.status.attempt();
  r.set_cancel_job(other_job || old_attempt);
  return r;
}

absl::StatusOr<Assignment> Coordinator::GetAssignment(const std::string& member_id, absl::Time deadline) {
  if (deadline <= absl::Now()) return WaitAssignment(member_id, deadline);
  auto slot = waits_.AcquireWait("GetAssignment wait");
  if (slot.ok()) return WaitAssignment(member_id, deadline);
  // No place to wait in: an assignment that is ready is still handed out.
  auto ready = WaitAssignment(member_id, absl::InfinitePast());
  if (!ready.ok() || !ready->job_id().empty()) return ready;
  return slot.status();
}

absl::StatusOr<Assignment> Coordinator::WaitAssignment(const std::string& member_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    Member* member = members_.Find(member_id);
    if (member == nullptr) {
      return absl::NotFoundError(absl::StrCat("member ", Quote(member_id), " is not registered: register again"));
    }
    const MemberStatus& m = member->status;
    Job* job = m.job_id().empty() || member->releasing ? nullptr : FindJob(m.job_id());
    // Not again to a worker that has finished its part (the job ends when
    // the last one has).
    if (job != nullptr && m.role() == MEMBER_ROLE_WORKER && job->done_ranks.count(m.rank()) > 0) job = nullptr;
    // A replacement waits until the shards know it holds the rank.
    auto rejoin = job == nullptr ? decltype(job->joining)::iterator() : job->joining.find(m.rank());
    const bool held = job != nullptr && m.role() == MEMBER_ROLE_WORKER && rejoin != job->joining.end() &&
                      !rejoin->second.admitted;
    // Nor before the store holds the attempt it carries (Start() bumped it
    // in memory; the persister wakes us once it is written).
    if (job != nullptr && !job->checkpoint.restoring && !held && AttemptDurable(*job)) {
      Assignment a;
      a.set_job_id(m.job_id());
      a.set_spec_yaml(job->stored.spec_yaml);
      // The job's own directory: its weights (and all-reduce checkpoints).
      a.set_output_dir(JobDir(job->stored.output_dir, m.job_id()));
      a.set_attempt(job->stored.status.attempt());
      a.set_job_secret(job->stored.status.job_secret());
      if (options_.table_grant_signer != nullptr) {
        a.set_table_grant(options_.table_grant_signer->Sign(m.job_id(), a.attempt(), a.job_secret()));
      }
      a.set_rank(m.rank());
      a.set_world_size(m.role() == MEMBER_ROLE_WORKER ? job->spec.workers : job->spec.shards);
      for (const std::string& address : ShardAddresses(job->stored.status)) a.add_shard_addresses(address);
      a.set_resume_from(job->stored.status.resumed_from());
      const JobStatus& st = job->stored.status;
      if (m.role() == MEMBER_ROLE_WORKER && m.rank() >= 0 && m.rank() < st.rank_generations_size()) {
        a.set_generation(st.rank_generations(m.rank()));
      }
      if (m.role() == MEMBER_ROLE_WORKER && rejoin != job->joining.end()) {
        a.set_replacement(true);
        a.set_replacement_step(rejoin->second.step);
      }
      for (const auto& w : job->checkpoint.start_positions) {
        if (w.rank != m.rank()) continue;
        a.set_start_step(w.step);
        a.set_start_epoch(w.epoch);
        a.set_start_epoch_step(w.epoch_step);
        a.set_start_loss_scale(w.loss_scale);
      }
      return a;
    }
    if (absl::Now() >= deadline || shutdown_) return Assignment();
    cv_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<ReportProgressResponse> Coordinator::ReportProgress(const ReportProgressRequest& request) {
  if (!request.event_json().empty()) {
    return absl::InvalidArgumentError("event_json is retired: send the event as a WorkerEvent (field `event`)");
  }
  if (request.event().ByteSizeLong() > kMaxEventBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an event is limited to ", kMaxEventBytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  Member* m = members_.Find(request.member_id());
  if (m == nullptr) {
    return absl::NotFoundError(absl::StrCat("member ", Quote(request.member_id()), " is not registered"));
  }
  ReportProgressResponse r;
  members_.Beat(*m, Now());
  Job* job = FindJob(request.job_id());
  if (job == nullptr || m->status.job_id() != request.job_id() || m->releasing ||
      request.attempt() != job->stored.status.attempt()) {
    r.set_cancel_job(true);  // not (or no longer) this member's job, or an ended attempt of it
    return r;
  }
  absl::Status applied = ApplyEvent(*job, *m, request.event());
  if (!applied.ok()) return applied;
  r.set_cancel_job(m->status.job_id() != request.job_id());
  return r;
}

absl::Status Coordinator::ApplyEvent(Job& job, Member& member, const WorkerEvent& e) {
  const int rank = member.status.rank();
  JobStatus& st = job.stored.status;
  // A member speaks for its own rank only (the rank is its assignment's, not
  // the event's), and rank 0's duties are rank 0's: nobody else may set the
  // accuracy, the weights or the plan.
  if ((e.has_eval() || e.has_weights() || e.has_plan()) && (member.status.role() != MEMBER_ROLE_WORKER || rank != 0)) {
    return absl::PermissionDeniedError("only worker rank 0 reports evaluations, weights and the parameter plan");
  }
  switch (e.kind_case()) {
    case WorkerEvent::kProgress:
      MergeProgress(st, job.spec.workers, rank, e.progress());
      telemetry_.Progress(st.job_id(), rank, e.progress(), st);
      // Progress is frequent: notify watchers, persist only on transitions.
      ++job.version;
      cv_.SignalAll();
      return absl::OkStatus();
    case WorkerEvent::kEval: {
      absl::Status s = AddEval(st, e.eval());
      if (s.ok()) {
        // At rank 0's step (it evaluates between steps).
        int64_t step = e.eval().final() ? st.steps() : 0;
        for (const WorkerProgress& w : st.workers()) {
          if (w.rank() == 0 && !e.eval().final()) step = w.step();
        }
        telemetry_.Eval(st.job_id(), e.eval(), step);
        Changed(job);
      }
      return s;
    }
    case WorkerEvent::kWeights: {
      // Only where the job's files go: a path elsewhere would have
      // `pstrain export` copy any file the coordinator names.
      const std::string dir = JobDir(job.stored.output_dir, job.stored.id);
      const std::string& path = e.weights().path();
      if (path.size() > 4096 || path.rfind(dir + "/", 0) != 0 || path.find("/../") != std::string::npos) {
        return absl::PermissionDeniedError(
            absl::StrCat("weights path ", Quote(path), " is not under the job's directory ", dir));
      }
      st.set_weights_path(path);
      Changed(job);
      return absl::OkStatus();
    }
    case WorkerEvent::kPlan:
      if (st.params_size() > 0) return absl::OkStatus();  // the first plan stands
      if (e.plan().params_size() > 1000000) return absl::InvalidArgumentError("a plan of more than 10^6 parameters");
      st.set_chunk_bytes(e.plan().chunk_bytes());
      *st.mutable_params() = e.plan().params();
      Changed(job);
      return absl::OkStatus();
    case WorkerEvent::kPaused:
      // Only a pause for the checkpoint in progress counts (not a late one).
      if (job.checkpoint.pause_requested && e.paused().pause_id() == job.checkpoint.pause_id) {
        // A member's word: a loss scale out of range is not kept.
        const double scale = e.paused().has_loss_scale() && ValidLossScale(e.paused().loss_scale())
                                 ? e.paused().loss_scale()
                                 : 0.0;
        job.checkpoint.paused[rank] = {rank, e.paused().step(), e.paused().epoch(), e.paused().epoch_step(), scale};
        cv_.SignalAll();
      }
      return absl::OkStatus();
    case WorkerEvent::kDone:
      if (job.done_ranks.insert(rank).second) {
        st.set_samples(st.samples() + e.done().samples());
        st.set_train_seconds(std::max(st.train_seconds(), e.done().seconds()));
      }
      Changed(job);
      MaybeSucceed(job);
      return absl::OkStatus();
    case WorkerEvent::kDraining: {
      member.leaving = true;
      if ((st.state() != RUNNING && st.state() != CHECKPOINTING) || job.checkpoint.draining) return absl::OkStatus();
      const std::string who = absl::StrCat(e.draining().role() == MEMBER_ROLE_SHARD ? "shard" : "worker", " ", rank);
      // A parameter-server job lets a leaving worker go and carries on
      // without it (or with a spare in its place), as for a lost one.
      for (const MemberStatus& jm : std::vector<MemberStatus>(st.members().begin(), st.members().end())) {
        if (jm.name() != member.status.name() || jm.role() != MEMBER_ROLE_WORKER) continue;
        if (VacateRank(job, jm, absl::StrCat(who, " (", Quote(jm.name()), ") is shutting down"))) {
          Schedule();
          return absl::OkStatus();
        }
      }
      job.checkpoint.draining = true;
      Transition(job, st.state(), "MemberLeaving",
                 absl::StrCat(who, " is shutting down: checkpointing, then the job waits for a replacement"));
      Background([this, id = st.job_id(), who] { Drain(id, who); });
      return absl::OkStatus();
    }
    case WorkerEvent::kError:
      if (!IsTerminal(st.state()) && st.state() != PENDING) {
        const std::string& said = e.error().message();
        // A lost peer or shard (not a bug in the job) restarts it from its
        // last checkpoint, if it has one.
        RestartOrFail(job, "WorkerFailed",
                      absl::StrCat("worker ", rank, ": ", Quote(said.empty() ? "failed" : said, 4096)),
                      e.error().retryable());
        Schedule();
      }
      return absl::OkStatus();
    case WorkerEvent::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the event has no kind (progress, eval, plan, ...)");
}

absl::Status Coordinator::CheckJobMember(const std::string& member_id, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const Member* m = members_.Find(member_id);
  if (m == nullptr) {
    return absl::NotFoundError("this member is not registered (coordinator restarted?): register again");
  }
  if (m->status.job_id() != job_id) {
    return absl::PermissionDeniedError(absl::StrCat("member ", Quote(m->status.name()), " is not assigned to job ",
                                                    Quote(job_id), ": only its members use its rendezvous store"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckKvWrite(const std::string& member_id, const std::string& key) {
  if (IsRoutingKey(key)) {
    return absl::PermissionDeniedError(absl::StrCat("keys under '", kRoutingKeyPrefix,
                                                    "' are the coordinator's (shard routings): members only read them"));
  }
  if (IsCheckpointPathKey(key)) {
    return absl::PermissionDeniedError(
        "a checkpoint's path keys are the coordinator's (where worker 0 writes): members only read them");
  }
  if (IsCheckpointSavedKey(key)) {
    // Worker 0 answers for the model (a pipelined job: worker s for stage s).
    const int writer = CheckpointSavedKeyWriter(key);
    absl::MutexLock lock(&mu_);
    const Member* m = members_.Find(member_id);
    if (writer < 0 || m == nullptr || m->status.role() != MEMBER_ROLE_WORKER ||
        static_cast<int>(m->status.rank()) != writer) {
      return absl::PermissionDeniedError(
          writer <= 0 ? "only worker 0 answers a checkpoint's save"
                      : absl::StrCat("only worker ", writer, " answers the save of pipeline stage ", writer));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::KvSet(const std::string& member_id, const std::string& job_id, uint64_t attempt,
                                const std::string& key, const std::string& value) {
  if (absl::Status s = CheckJobMember(member_id, job_id); !s.ok()) return s;
  if (absl::Status s = CheckKvWrite(member_id, key); !s.ok()) return s;
  return rendezvous_.Set(job_id, attempt, key, value);
}

absl::StatusOr<std::string> Coordinator::KvGet(const std::string& member_id, const std::string& job_id,
                                               uint64_t attempt, const std::string& key, absl::Time deadline) {
  if (absl::Status s = CheckJobMember(member_id, job_id); !s.ok()) return s;
  if (deadline <= absl::Now()) return rendezvous_.Get(job_id, attempt, key, deadline);
  auto slot = waits_.AcquireWait("KvGet wait");
  if (slot.ok()) return rendezvous_.Get(job_id, attempt, key, deadline);
  // No place to wait in: a key that is there is still returned.
  auto present = rendezvous_.Get(job_id, attempt, key, absl::InfinitePast());
  if (present.status().code() != absl::StatusCode::kNotFound) return present;
  return slot.status();
}

absl::StatusOr<int64_t> Coordinator::KvAdd(const std::string& member_id, const std::string& job_id,
                                           uint64_t attempt, const std::string& key, int64_t delta) {
  if (absl::Status s = CheckJobMember(member_id, job_id); !s.ok()) return s;
  if (absl::Status s = CheckKvWrite(member_id, key); !s.ok()) return s;
  return rendezvous_.Add(job_id, attempt, key, delta);
}

}  // namespace pstrain
