// Replicated shards (issue 34, docs/replication.md), the coordinator's side:
// a lost shard's chunks are led by their backups from a new routing
// generation and the job goes on; a free shard takes the lost one's place,
// is copied the chunks it backs up by their primaries (catching up), and
// then counts as a copy again, so the job survives another loss.
#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/routing_key.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_remote_shard.h"
#include "server/coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

void Remove(google::protobuf::RepeatedField<int32_t>* set, int x) {
  auto it = std::find(set->begin(), set->end(), x);
  if (it != set->end()) set->erase(it);
}

// The dense half of CaughtUp, asked of shard i (at `target`).
bool DenseCaughtUp(const std::string& target, int i, int shard, const std::string& job, const std::string& secret,
                   uint64_t generation) {
  RemoteShardOptions ro;
  ro.target = target;
  ro.default_timeout = absl::Seconds(5);
  ro.max_attempts = 1;
  StatsRequest req;
  req.set_job(job);
  StatsResponse resp;
  CallOptions opts;
  opts.job_secret = secret;
  absl::Status s = WaitFor([&](StatusCallback done) { SharedRemoteShard(ro)->StatsAsync(req, &resp, opts, done); });
  if (!s.ok() || resp.tables_size() != 1) return false;
  const ReplicationStats& r = resp.tables(0).replication();
  if (i == shard) return true;  // the spare: its table is there
  if (r.generation() < generation) return false;
  return std::count(r.copying_to().begin(), r.copying_to().end(), static_cast<uint32_t>(shard)) == 0;
}

// Whether every live primary of the job has finished copying to `shard`:
// each answers Stats with the routing generation that made `shard` a
// catching-up backup (or a later one) and does not list it in copying_to;
// and `shard` holds the job's table. `dense`: the job's dense table is on
// the shards (not a hybrid job's); `embeddings`: so are embedding rows.
bool CaughtUp(const std::vector<std::string>& targets, const std::vector<int>& skip, int shard,
              const std::string& job, const std::string& secret, uint64_t generation, bool dense, bool embeddings) {
  for (size_t i = 0; i < targets.size(); ++i) {
    if (std::count(skip.begin(), skip.end(), static_cast<int>(i)) > 0) continue;
    if (dense && !DenseCaughtUp(targets[i], static_cast<int>(i), shard, job, secret, generation)) return false;
    if (!embeddings || static_cast<int>(i) == shard) continue;
    // And the slots of embedding rows it leads (docs/replication.md).
    auto e = FetchEmbeddingStats(CreateChannel(targets[i]), job, secret, absl::Now() + absl::Seconds(5));
    if (!e.ok() || e->generation() < generation) return false;
    if (std::count(e->copying_to().begin(), e->copying_to().end(), static_cast<uint32_t>(shard)) > 0) return false;
  }
  return true;
}

}  // namespace

Routing Coordinator::RoutingOf(const JobStatus& st) {
  Routing r;
  r.set_generation(st.routing_generation());
  for (int s : st.lost_shards()) r.add_lost_shards(static_cast<uint32_t>(s));
  for (int s : st.catching_up_shards()) r.add_catching_up(static_cast<uint32_t>(s));
  for (std::string& t : ShardAddresses(st)) r.add_targets(std::move(t));
  return r;
}

void Coordinator::PublishRouting(Job& job, uint64_t attempt, const Routing& routing) {
  const std::string& id = job.stored.id;
  const std::string bytes = routing.SerializeAsString();
  // Every generation a worker may ask for next gets the newest routing.
  for (uint64_t g = job.routing_published + 1; g <= routing.generation(); ++g) {
    absl::Status s = rendezvous_.Set(id, attempt, RoutingKey(g), bytes);
    if (!s.ok()) spdlog::warn("coordinator: {} routing {} not published: {}", id, g, s.ToString());
  }
  job.routing_published = std::max(job.routing_published, routing.generation());
  spdlog::info("coordinator: {} routes by generation {} ({} shard(s) lost, {} catching up)", id,
               routing.generation(), routing.lost_shards_size(), routing.catching_up_size());
}

bool Coordinator::LoseShard(Job& job, const MemberStatus& lost, const std::string& what) {
  JobStatus& st = job.stored.status;
  if ((job.spec.allreduce() && job.spec.embeddings.empty()) || job.spec.replicas == 0 || lost.role() != MEMBER_ROLE_SHARD || ShardLost(st, lost) ||
      lost.rank() < 0 || lost.rank() >= job.spec.shards) {
    return false;
  }
  const auto& catching = st.catching_up_shards();
  if (std::find(catching.begin(), catching.end(), lost.rank()) != catching.end()) {
    // A spare lost while it was being copied: it led nothing; its place is
    // vacant again.
    Remove(st.mutable_catching_up_shards(), lost.rank());
  } else if (st.lost_shards_size() + st.catching_up_shards_size() + 1 > job.spec.replicas) {
    // Each chunk has replicas + 1 copies on distinct shards: up to
    // `replicas` of them lost (or not yet copied) leave every chunk one.
    return false;
  }
  st.add_lost_shards(lost.rank());
  st.set_routing_generation(st.routing_generation() + 1);
  members_.ReleaseByName(lost.name(), st.job_id());
  Transition(job, st.state(), "ShardLost",
             absl::StrCat(what, "; its chunks are led by their backups from routing generation ",
                          st.routing_generation(), " (", st.lost_shards_size(), " of the ", job.spec.replicas,
                          " shard loss(es) the job's replicas cover)"));
  PushSeats(job);
  return true;
}

void Coordinator::FillLostShards() {
  for (Job* active : ActiveJobs()) {
    Job& job = *active;
    JobStatus& st = job.stored.status;
    // One spare at a time per job: a second loss meanwhile waits.
    if (st.state() != RUNNING || job.spec.replicas == 0 || st.lost_shards_size() == 0 ||
        st.catching_up_shards_size() > 0) {
      continue;
    }
    std::vector<FreeMember> free = members_.FreeMembers();
    std::sort(free.begin(), free.end(),
              [](const FreeMember& a, const FreeMember& b) { return std::tie(a.order, a.id) < std::tie(b.order, b.id); });
    auto spare = std::find_if(free.begin(), free.end(),
                              [](const FreeMember& f) { return f.role == MEMBER_ROLE_SHARD; });
    if (spare == free.end()) return;  // none for any job
    const int index = st.lost_shards(0);
    Member& m = *members_.Find(spare->id);
    job.probes.erase(spare->id);  // probed afresh from its first probe in this place
    m.status.set_job_id(st.job_id());
    m.status.set_rank(index);
    for (int i = 0; i < st.members_size(); ++i) {
      if (st.members(i).role() == MEMBER_ROLE_SHARD && st.members(i).rank() == index) {
        *st.mutable_members(i) = m.status;  // its place in the routing's targets
      }
    }
    Remove(st.mutable_lost_shards(), index);
    st.add_catching_up_shards(index);
    st.set_routing_generation(st.routing_generation() + 1);
    Transition(job, st.state(), "ShardReplaced",
               absl::StrCat("shard ", Quote(m.status.name()), " takes the place of lost shard ", index,
                            " (routing generation ", st.routing_generation(),
                            "); it leads nothing until the primaries have copied it their chunks"));
    PushSeats(job);
    Background([this, id = st.job_id(), attempt = st.attempt(), index] { CatchUpLoop(id, attempt, index); });
  }
}

void Coordinator::CatchUpLoop(const std::string& job_id, uint64_t attempt, int shard) {
  while (true) {
    std::vector<std::string> targets;
    std::vector<int> skip;
    std::string secret;
    uint64_t generation = 0;
    bool dense = true, embeddings = false;
    {
      absl::MutexLock lock(&mu_);
      Job* job = FindJob(job_id);
      if (job == nullptr || shutdown_) return;
      const JobStatus& st = job->stored.status;
      const auto& catching = st.catching_up_shards();
      if (st.attempt() != attempt || IsTerminal(st.state()) ||
          std::find(catching.begin(), catching.end(), shard) == catching.end()) {
        return;
      }
      targets = ShardAddresses(st);
      skip.assign(st.lost_shards().begin(), st.lost_shards().end());
      secret = st.job_secret();
      generation = st.routing_generation();
      dense = !job->spec.allreduce();
      embeddings = !job->spec.embeddings.empty();
    }
    if (!CaughtUp(targets, skip, shard, job_id, secret, generation, dense, embeddings)) {
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    absl::MutexLock lock(&mu_);
    Job* job = FindJob(job_id);
    if (job == nullptr || shutdown_) return;
    JobStatus& st = job->stored.status;
    if (st.attempt() == attempt && st.routing_generation() == generation) {
      Remove(st.mutable_catching_up_shards(), shard);
      st.set_routing_generation(st.routing_generation() + 1);
      Transition(*job, st.state(), "ShardCaughtUp",
                 absl::StrCat("shard ", shard, " holds every chunk it backs up (routing generation ",
                              st.routing_generation(), "): ", job->spec.replicas - st.lost_shards_size(),
                              " more shard loss(es) covered"));
      PushSeats(*job);
      FillLostShards();  // another lost shard may wait for a spare
      return;
    }
    // The routing changed meanwhile (another loss): look again.
  }
}

}  // namespace pstrain
