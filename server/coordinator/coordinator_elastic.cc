// Worker ranks changing hands while a parameter-server job runs: a lost
// worker's rank is left vacant and the others go on (the shards stop
// waiting for it), a free pool worker takes it over with a higher
// generation (the shards refuse its predecessor) and continues it where it
// stopped; below min_workers the job waits replacement_timeout_s for one,
// then restarts from its checkpoint as before. All-reduce and pipelined
// jobs always restart: a collective group cannot shrink, and a stage's
// neighbours cannot go on without it.
#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "rpc/grpc_remote_shard.h"
#include "server/coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

bool Contains(const google::protobuf::RepeatedField<int32_t>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

void Remove(google::protobuf::RepeatedField<int32_t>* ranks, int rank) {
  auto it = std::find(ranks->begin(), ranks->end(), rank);
  if (it != ranks->end()) ranks->erase(it);
}

// What the shards said, all together.
struct SeatsAnswer {
  absl::Status status;
  std::vector<int64_t> last_steps;  // per rank, min over shards
  int64_t min_version = INT64_MAX;
};

// Tells every shard but those in `lost` (replicated shards: lost ones, and
// spares not yet caught up).
SeatsAnswer SendSeats(const std::vector<std::string>& shards, const SetWorkersRequest& req,
                      const std::string& job_secret, const std::vector<int>& lost) {
  SeatsAnswer a;
  a.last_steps.assign(req.seats_size(), INT64_MAX);
  for (size_t i = 0; i < shards.size() && a.status.ok(); ++i) {
    if (std::count(lost.begin(), lost.end(), static_cast<int>(i)) > 0) continue;
    RemoteShardOptions ro;
    ro.target = shards[i];
    ro.default_timeout = absl::Seconds(10);
    std::shared_ptr<GrpcRemoteShard> client = SharedRemoteShard(ro);
    SetWorkersResponse resp;
    CallOptions opts;
    opts.job_secret = job_secret;
    absl::Status s = WaitFor([&](StatusCallback done) { client->SetWorkersAsync(req, &resp, opts, done); });
    if (!s.ok()) {
      a.status = absl::Status(s.code(), absl::StrCat("shard ", i, ": ", s.message()));
      break;
    }
    for (int r = 0; r < resp.last_steps_size() && r < req.seats_size(); ++r) {
      a.last_steps[r] = std::min(a.last_steps[r], resp.last_steps(r));
    }
    a.min_version = std::min(a.min_version, resp.min_version());
  }
  return a;
}

// A replicated job's SetWorkers round that failed is tried again after this.
constexpr absl::Duration kSeatsRetryWait = absl::Milliseconds(200);

}  // namespace

int Coordinator::TargetWorkers(const Job& job) {
  const int target = job.stored.status.target_workers();
  return target > 0 ? target : job.spec.workers;
}

absl::StatusOr<JobStatus> Coordinator::ScaleJob(const std::string& job_id, int workers) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", Quote(job_id), "'"));
  JobStatus& st = job->stored.status;
  if (job->spec.allreduce() || job->spec.pipeline.enabled()) {
    return absl::FailedPreconditionError(absl::StrCat(job->spec.allreduce() ? "an all-reduce" : "a pipelined",
                                                      " job cannot change its worker count while it runs"));
  }
  if (st.state() != RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(st.state()), ": only a running job can be scaled"));
  }
  if (st.rank_generations_size() != job->spec.workers) {
    // Scheduled by a coordinator that kept no rank generations (an older
    // version): its ranks cannot change hands safely.
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " was started before ranks could change hands; restart it to scale it"));
  }
  if (workers < job->spec.min_workers || workers > job->spec.workers) {
    return absl::InvalidArgumentError(absl::StrCat("workers must be in ", job->spec.min_workers, "..",
                                                   job->spec.workers, " (the spec's min_workers..workers)"));
  }
  const int before = TargetWorkers(*job);
  st.set_target_workers(workers);
  // Ranks above the new count drain: their workers are stopped.
  for (const MemberStatus& jm : std::vector<MemberStatus>(st.members().begin(), st.members().end())) {
    if (jm.role() == MEMBER_ROLE_WORKER && jm.rank() >= workers && job->done_ranks.count(jm.rank()) == 0) {
      DropRank(*job, jm);
    }
  }
  Transition(*job, st.state(), "Scaled", absl::StrCat("from ", before, " to ", workers, " workers"));
  // The ranks left may all be done: the job is, then.
  MaybeSucceed(*job);
  if (IsTerminal(st.state())) {
    RefreshMembers(*job);
    return st;
  }
  PushSeats(*job);
  Schedule();  // fills the ranks below the new count
  RefreshMembers(*job);
  return st;
}

bool Coordinator::AllRanksSettled(const Job& job) const {
  const JobStatus& st = job.stored.status;
  int done = 0;
  for (int r = 0; r < job.spec.workers; ++r) {
    if (job.done_ranks.count(r) > 0) {
      ++done;
    } else if (!Contains(st.vacant_ranks(), r) || job.awaited.count(r) > 0) {
      return false;
    }
  }
  return done > 0;
}

void Coordinator::DropRank(Job& job, const MemberStatus& holder) {
  JobStatus& st = job.stored.status;
  const int rank = holder.rank();
  for (int i = 0; i < st.members_size(); ++i) {
    if (st.members(i).name() == holder.name() && st.members(i).role() == holder.role()) {
      st.mutable_members()->DeleteSubrange(i, 1);
      break;
    }
  }
  members_.ReleaseByName(holder.name(), st.job_id());  // stopped by its heartbeat, then free
  // Its last progress no longer holds the job's step back (it counts only
  // ranks that report).
  if (rank < st.workers_size()) {
    WorkerProgress* w = st.mutable_workers(rank);
    w->set_steps(0);
    w->set_samples_per_s(0);
  }
  if (!Contains(st.vacant_ranks(), rank)) st.add_vacant_ranks(rank);
  st.set_active_workers(job.spec.workers - st.vacant_ranks_size());
  job.joining.erase(rank);
  job.awaited.erase(rank);
}

bool Coordinator::VacateRank(Job& job, const MemberStatus& lost, const std::string& what) {
  JobStatus& st = job.stored.status;
  if (job.spec.allreduce() || job.spec.pipeline.enabled() || lost.role() != MEMBER_ROLE_WORKER ||
      st.rank_generations_size() != job.spec.workers) {
    return false;
  }
  const int rank = lost.rank();
  if (rank < 0 || rank >= job.spec.workers || Contains(st.vacant_ranks(), rank)) return false;
  const int remaining = job.spec.workers - st.vacant_ranks_size() - 1;
  bool free_worker = false;
  for (const FreeMember& f : members_.FreeMembers()) free_worker = free_worker || f.role == MEMBER_ROLE_WORKER;
  // Rank 0 evaluates and writes the weights: the job does not finish
  // without it, so it is always awaited.
  const bool await = rank < TargetWorkers(job) && (remaining < job.spec.min_workers || rank == 0);
  if (await && !free_worker && job.spec.replacement_timeout_s == 0) return false;
  DropRank(job, lost);
  std::string next;
  if (await) {
    // The shards keep waiting for the rank (a SYNC step does not complete
    // without it) until a replacement comes or the deadline passes.
    job.awaited[rank] = Now() + absl::Seconds(job.spec.replacement_timeout_s);
    next = absl::StrCat("; waiting up to ", job.spec.replacement_timeout_s, " s for a replacement (",
                        rank == 0 ? "rank 0 evaluates and writes the weights" : "below min_workers", ")");
  } else {
    next = absl::StrCat("; running with ", st.active_workers(), " of ", job.spec.workers, " workers");
  }
  Transition(job, st.state(), "MemberLost", what + next);
  // The rank may have been the last one unfinished (its worker killed after
  // its last push, the others done): nothing else would end the job.
  MaybeSucceed(job);
  if (IsTerminal(st.state())) return true;
  if (!await) PushSeats(job);
  if (free_worker) FillVacancies();  // at once: an awaited rank's deadline may be now
  return true;
}

void Coordinator::FillVacancies() {
  for (Job* active : ActiveJobs()) {
    Job& job = *active;
    JobStatus& st = job.stored.status;
    if (st.state() != RUNNING || st.vacant_ranks_size() == 0 || job.checkpoint.restoring ||
        st.rank_generations_size() != job.spec.workers) {
      continue;
    }
    std::vector<int> vacant(st.vacant_ranks().begin(), st.vacant_ranks().end());
    std::sort(vacant.begin(), vacant.end());  // rank 0 first: the job needs it to finish
    std::vector<FreeMember> free = members_.FreeMembers();
    // In the members' random order, as the scheduler (no name puts a member
    // first in line for every vacant rank).
    std::sort(free.begin(), free.end(),
              [](const FreeMember& a, const FreeMember& b) { return std::tie(a.order, a.id) < std::tie(b.order, b.id); });
    size_t next = 0;
    for (int rank : vacant) {
      if (rank >= TargetWorkers(job)) break;  // scaled down: stays vacant
      while (next < free.size() && free[next].role != MEMBER_ROLE_WORKER) ++next;
      if (next == free.size()) break;
      HandOver(job, rank, *members_.Find(free[next++].id));
    }
  }
}

void Coordinator::HandOver(Job& job, int rank, Member& worker) {
  JobStatus& st = job.stored.status;
  worker.status.set_job_id(st.job_id());
  worker.status.set_rank(rank);
  st.set_rank_generations(rank, st.rank_generations(rank) + 1);
  Remove(st.mutable_vacant_ranks(), rank);
  job.awaited.erase(rank);
  job.joining[rank] = Job::Rejoin();
  job.done_ranks.erase(rank);
  *st.add_members() = worker.status;
  st.set_active_workers(job.spec.workers - st.vacant_ranks_size());
  st.set_replacements(st.replacements() + 1);
  Transition(job, st.state(), "WorkerReplaced",
             absl::StrCat("worker ", Quote(worker.status.name()), " takes over rank ", rank, " (generation ",
                          st.rank_generations(rank), "); ", st.active_workers(), " of ", job.spec.workers,
                          " workers"));
  PushSeats(job);
}

void Coordinator::ExpireAwaitedRanks() {
  const absl::Time now = Now();
  for (Job* active : ActiveJobs()) {
    Job& job = *active;
    const JobState state = job.stored.status.state();
    if (state != RUNNING && state != CHECKPOINTING) continue;
    for (const auto& [rank, deadline] : job.awaited) {
      if (now < deadline) continue;
      RestartOrFail(job, "MemberLost",
                    absl::StrCat("no worker took over rank ", rank, " within ", job.spec.replacement_timeout_s, " s"),
                    /*retryable=*/true);
      break;
    }
  }
}

void Coordinator::RestoreSeats(Job& job) {
  JobStatus& st = job.stored.status;
  if ((st.state() != RUNNING && st.state() != CHECKPOINTING) || job.spec.allreduce() ||
      st.rank_generations_size() != job.spec.workers) {
    return;
  }
  // A replicated job's routing too: the workers' copy was in the lost
  // coordinator's KV store.
  bool changed = st.vacant_ranks_size() > 0 || st.routing_generation() > 0;
  for (int g : st.rank_generations()) changed = changed || g > 0;
  if (!changed) return;  // the shards' view is the one they started with
  // As VacateRank decides, with what is known now: rank 0, and any rank
  // while fewer than min_workers are active, is waited for -- from the end
  // of the window in which members re-attach.
  const int active = job.spec.workers - st.vacant_ranks_size();
  for (int rank : st.vacant_ranks()) {
    if (rank < TargetWorkers(job) && (rank == 0 || active < job.spec.min_workers)) {
      job.awaited[rank] = std::max(job.attach_deadline, Now()) + absl::Seconds(job.spec.replacement_timeout_s);
    }
  }
  spdlog::info("coordinator: {} sends its shards its seats again ({} vacant, {} awaited)", st.job_id(),
               st.vacant_ranks_size(), job.awaited.size());
  PushSeats(job);
  // A spare that was being copied: watched again.
  for (int shard : st.catching_up_shards()) {
    Background([this, id = st.job_id(), attempt = st.attempt(), shard] { CatchUpLoop(id, attempt, shard); });
  }
}

void Coordinator::PushSeats(Job& job) {
  if (job.seats_in_flight) {
    job.seats_dirty = true;
    return;
  }
  job.seats_in_flight = true;
  Background([this, id = job.stored.id] { PushSeatsLoop(id); });
}

void Coordinator::PushSeatsLoop(const std::string& job_id) {
  int failed_rounds = 0;
  while (true) {
    if (failed_rounds > 0) absl::SleepFor(kSeatsRetryWait);
    SetWorkersRequest req;
    std::vector<std::string> shards;
    std::string secret;
    std::vector<int> lost;
    {
      absl::MutexLock lock(&mu_);
      Job* job = FindJob(job_id);
      if (job == nullptr) return;
      // SetWorkers tells the shards the attempt: only one the store holds.
      if (!AttemptDurable(*job) && !AwaitDurableAttempt(job_id, job->stored.status.attempt()) && !shutdown_) {
        job = FindJob(job_id);
        const JobState state = job == nullptr ? FAILED : job->stored.status.state();
        if (job != nullptr && !IsTerminal(state) && state != PENDING) continue;  // a newer attempt: wait for it
      }
      job = FindJob(job_id);
      if (job == nullptr) return;
      const JobStatus& st = job->stored.status;
      job->seats_dirty = false;
      if (IsTerminal(st.state()) || st.state() == PENDING || shutdown_) {
        job->seats_in_flight = false;
        return;
      }
      req.set_job(job_id);
      req.set_attempt(st.attempt());
      for (int r = 0; r < job->spec.workers; ++r) {
        WorkerSeat* seat = req.add_seats();
        seat->set_active(!Contains(st.vacant_ranks(), r) || job->awaited.count(r) > 0);
        seat->set_generation(r < st.rank_generations_size() ? st.rank_generations(r) : 0);
      }
      shards = ShardAddresses(st);
      secret = st.job_secret();
      // Neither lost shards nor spares still without the table are told.
      lost.assign(st.lost_shards().begin(), st.lost_shards().end());
      lost.insert(lost.end(), st.catching_up_shards().begin(), st.catching_up_shards().end());
      // A replicated table learns who leads each chunk with its seats.
      if (job->spec.replicas > 0) *req.mutable_routing() = RoutingOf(st);
    }
    const SeatsAnswer answer = SendSeats(shards, req, secret, lost);
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr) return;
    JobStatus& st = job->stored.status;
    if (st.attempt() != req.attempt() || IsTerminal(st.state()) || st.state() == PENDING) {
      // A view of an ended attempt; a later one's change waits its turn.
      if (job->seats_dirty) continue;
      job->seats_in_flight = false;
      return;
    }
    if (!answer.status.ok()) {
      // A replicated job outlives a dying shard: its lease decides (the
      // next round leaves it out once it is declared lost), not this call.
      if (job->spec.replicas > 0 && ++failed_rounds * kSeatsRetryWait <= 2 * lease()) continue;
      job->seats_in_flight = false;
      RestartOrFail(*job, "MemberLost",
                    absl::StrCat("the shards could not be told of the job's workers: ", answer.status.message()),
                    /*retryable=*/true);
      Schedule();
      return;
    }
    failed_rounds = 0;
    // The shards lead by this routing now: the workers may follow it.
    if (req.has_routing()) PublishRouting(*job, req.attempt(), req.routing());
    for (int r = 0; r < req.seats_size(); ++r) {
      // Under SYNC the others cover a vacant rank's batches from the step
      // after the one in flight; what it trained itself ends here.
      if (req.seats(r).active() || job->joining.count(r) > 0) continue;
      const int64_t last = answer.last_steps[r] == INT64_MAX ? -1 : answer.last_steps[r];
      spdlog::info("coordinator: {} rank {} is vacant after its step {}", job_id, r, last);
    }
    for (auto& [rank, rejoin] : job->joining) {
      if (rejoin.admitted || req.seats(rank).generation() != st.rank_generations(rank)) continue;
      // Where the rank continues: under SYNC the step in flight (a step is
      // global), otherwise the step after its last one.
      const int64_t last = answer.last_steps[rank] == INT64_MAX ? -1 : answer.last_steps[rank];
      rejoin.step = job->spec.consistency == SYNC ? answer.min_version : last + 1;
      for (const auto& w : job->checkpoint.start_positions) {
        if (w.rank == rank) rejoin.step = std::max(rejoin.step, w.step);
      }
      rejoin.admitted = true;
      spdlog::info("coordinator: {} rank {} continues at step {}", job_id, rank, rejoin.step);
    }
    cv_.SignalAll();
    if (!job->seats_dirty) {
      job->seats_in_flight = false;
      return;
    }
  }
}

}  // namespace pstrain
