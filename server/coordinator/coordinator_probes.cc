// Shard probes (docs/replication.md, "A shard that hangs"). A shard that
// stops answering on its data path while its heartbeats go on (its table
// service hung, its data port cut off by a partition or a network policy)
// would hold its job's workers until their calls' deadline, and its lease
// would never run out. So the coordinator asks each shard of a running
// parameter-server or hybrid job for its table's Stats (a call that takes
// no table lock) every heartbeat interval. One that answered none for
// shard_probe_timeout is lost as if its lease had run out: a replicated
// job's backups lead its chunks, another job restarts from its checkpoint.
// It is also quarantined: it is given no job again, and its heartbeats ask
// it to exit so that its supervisor starts it afresh.
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/member_role.h"
#include "common/quote.h"
#include "rpc/grpc_remote_shard.h"
#include "server/coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

// The service ran the call (whatever it answered): the data path works.
bool Answered(const absl::Status& s) {
  return s.code() != absl::StatusCode::kDeadlineExceeded && s.code() != absl::StatusCode::kUnavailable;
}

// The client the probes of `address` go through.
std::shared_ptr<GrpcRemoteShard> ProbeClient(const std::string& address) {
  RemoteShardOptions ro;  // as CaughtUp's: the two share a client
  ro.target = address;
  ro.default_timeout = absl::Seconds(5);
  ro.max_attempts = 1;
  return SharedRemoteShard(ro);
}

// Stats of the job's dense table over gRPC. A hybrid job has none there:
// its NOT_FOUND is an answer as good as any.
void StatsProbe(const ShardProbe& probe, std::function<void(absl::Status)> done) {
  auto request = std::make_shared<StatsRequest>();
  request->set_job(probe.job);
  auto response = std::make_shared<StatsResponse>();
  CallOptions opts;
  opts.deadline = probe.deadline;
  opts.job_secret = probe.job_secret;
  ProbeClient(probe.address)->StatsAsync(*request, response.get(), opts,
                                        [request, response, done = std::move(done)](absl::Status s) { done(s); });
}

}  // namespace

void Coordinator::ProbeShards() {
  struct Target {
    std::string job, member, name;
    uint64_t attempt;
    ShardProbe probe;
  };
  std::vector<Target> targets;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_ || options_.shard_probe_timeout <= absl::ZeroDuration()) return;
    const absl::Time now = Now();
    for (Job* active : ActiveJobs()) {
      Job& job = *active;
      const JobStatus& st = job.stored.status;
      const bool shards_in_play = !job.spec.allreduce() || !job.spec.embeddings.empty();
      if ((st.state() != RUNNING && st.state() != CHECKPOINTING) || !shards_in_play) continue;
      if (job.probes_attempt != st.attempt()) {
        job.probes.clear();
        job.probes_attempt = st.attempt();
      }
      std::set<std::string> eligible;
      for (const MemberStatus& m : st.members()) {
        if (m.role() != MEMBER_ROLE_SHARD || ShardLost(st, m) || !members_.Attached(m.name(), st.job_id())) continue;
        eligible.insert(m.member_id());
        auto [it, first] = job.probes.try_emplace(m.member_id());
        if (first) it->second.answered = now;  // the timeout counts from the first probe
        if (it->second.in_flight) continue;    // one at a time: a hung shard holds one
        it->second.in_flight = true;
        ++probes_in_flight_;
        ++probing_[m.address()];
        targets.push_back({st.job_id(), m.member_id(), m.name(), st.attempt(),
                           ShardProbe{st.job_id(), m.address(), st.job_secret(),
                                      absl::Now() + options_.shard_probe_timeout}});
      }
      // A member that left the probed set (lost, released) starts afresh
      // if it comes back: its old answer time says nothing of it then.
      for (auto it = job.probes.begin(); it != job.probes.end();) {
        it = eligible.count(it->first) > 0 ? std::next(it) : job.probes.erase(it);
      }
    }
  }
  // Each answer is recorded as it comes; Shutdown cancels those in flight
  // and waits for them.
  for (const Target& t : targets) {
    auto done = [this, job_id = t.job, member = t.member, name = t.name, address = t.probe.address,
                 attempt = t.attempt](absl::Status s) {
      if (!Answered(s)) {
        spdlog::warn("coordinator: shard {} of {} answered no probe: {}: {}", Quote(name, 64), job_id,
                     absl::StatusCodeToString(s.code()), Quote(s.message(), 200));
      }
      absl::MutexLock lock(&mu_);
      --probes_in_flight_;
      if (--probing_[address] <= 0) probing_.erase(address);
      Job* job = FindJob(job_id);
      if (job == nullptr || job->probes_attempt != attempt) return;
      auto it = job->probes.find(member);
      if (it == job->probes.end()) return;
      it->second.in_flight = false;
      if (Answered(s)) it->second.answered = Now();
    };
    if (options_.shard_probe) {
      options_.shard_probe(t.probe, std::move(done));
    } else {
      StatsProbe(t.probe, std::move(done));
    }
  }
}

std::string Coordinator::Unanswered(const Job& job, const MemberStatus& m, absl::Time now) const {
  if (options_.shard_probe_timeout <= absl::ZeroDuration() || m.role() != MEMBER_ROLE_SHARD ||
      job.probes_attempt != job.stored.status.attempt()) {
    return "";
  }
  auto it = job.probes.find(m.member_id());
  if (it == job.probes.end() || now - it->second.answered <= options_.shard_probe_timeout) return "";
  return absl::StrCat("shard ", Quote(m.name(), 64), " (rank ", m.rank(), ") was lost: its table service at ",
                      Quote(m.address(), 128), " answered no probe for ",
                      absl::FormatDuration(now - it->second.answered),
                      " while it still heartbeats (hung, or its data port cut off); it is quarantined");
}

void Coordinator::CancelProbes() {
  std::vector<std::string> probing;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, n] : probing_) probing.push_back(address);
  }
  for (const std::string& address : probing) ProbeClient(address)->CancelCalls();
}

void Coordinator::ProbeLoop() {
  while (true) {
    const absl::Time next = absl::Now() + options_.heartbeat_interval;
    ProbeShards();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&shutdown_), next)) return;
  }
}

}  // namespace pstrain
