// Shard probes (coordinator_probes.cc): a shard that heartbeats while its
// data path answers nothing is lost after shard_probe_timeout, quarantined
// (never placed again, asked to exit) and replaced; one that answers, even
// with an error, is not. The probes are the test's: it decides which shard
// answers and holds the calls of a hung one in flight.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_testing.h"

namespace pstrain {
namespace {

class ProbeTest : public ::testing::Test {
 protected:
  ~ProbeTest() override {
    // A hung shard's probes end by their deadline: before the coordinator
    // goes, as Shutdown waits for them.
    std::vector<std::function<void(absl::Status)>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (auto& done : held) done(absl::DeadlineExceededError("probe deadline"));
    c_.reset();
  }

  void Make(absl::Duration probe_timeout = absl::Milliseconds(400)) {
    CoordinatorOptions o = TestCoordinatorOptions();  // 50 ms heartbeats, 3 missed: a lease of 150 ms
    o.clock = &clock_;
    o.shard_probe_timeout = probe_timeout;
    o.shard_probe = [this](const ShardProbe& p, std::function<void(absl::Status)> done) {
      EXPECT_GT(p.deadline, absl::Now());
      {
        absl::MutexLock lock(&mu_);
        ++probes_[p.address];
        if (hung_.count(p.address) > 0) {
          held_.push_back(std::move(done));  // in flight until the test ends
          return;
        }
      }
      // An error from the service is an answer all the same.
      done(p.address == Address("shard-0") || p.address == Address("shard-9") ? absl::NotFoundError("no table")
                                                                             : absl::OkStatus());
    };
    c_ = MakeTestCoordinator(o);
  }

  // Ports nobody listens on (the coordinator's own calls to its shards,
  // seats and catching up, are refused at once).
  static std::string Address(const std::string& name) { return "127.0.0.1:1" + name.substr(name.size() - 1); }

  std::string Join(MemberRole role, const std::string& name) {
    RegisterRequest r;
    r.set_role(role);
    r.set_name(name);
    if (role == MEMBER_ROLE_SHARD) r.set_address(Address(name));
    auto resp = c_->Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return ids_[name] = resp.value_or(RegisterResponse()).member_id();
  }

  // A coordinator, shard-0..2 and worker-0, and a 3-shard job with
  // replicas: 1 on them (its id).
  std::string StartReplicatedJob() {
    Make();
    for (const char* name : {"shard-0", "shard-1", "shard-2"}) Join(MEMBER_ROLE_SHARD, name);
    Join(MEMBER_ROLE_WORKER, "worker-0");
    return SubmitSpec(*c_, "name: r\nworkers: 1\nshards: 3\nreplicas: 1\n");
  }

  // The member of `job` holding shard rank `rank`.
  MemberStatus ShardAt(const std::string& job, int rank) {
    const JobStatus st = *c_->GetJob(job);
    for (const MemberStatus& m : st.members()) {
      if (m.role() == MEMBER_ROLE_SHARD && m.rank() == rank) return m;
    }
    ADD_FAILURE() << "no shard at rank " << rank;
    return MemberStatus();
  }

  // `rounds` of 40 ms: every member in `running` heartbeats naming `job`,
  // those in `idle` naming none; a probe round (unless `probe` is false:
  // the prober's thread has not come round yet); a tick. The last
  // heartbeat responses, by member id.
  std::map<std::string, HeartbeatResponse> Rounds(int rounds, const std::vector<std::string>& running,
                                                  const std::string& job,
                                                  const std::vector<std::string>& idle = {}, bool probe = true) {
    std::map<std::string, HeartbeatResponse> last;
    for (int i = 0; i < rounds; ++i) {
      clock_.Advance(absl::Milliseconds(40));
      for (const auto& [members, names_job] : {std::pair{&running, job}, std::pair{&idle, std::string()}}) {
        for (const std::string& m : *members) {
          HeartbeatRequest hb;
          hb.set_member_id(m);
          hb.set_running_job_id(names_job);
          hb.set_running_attempt(c_->GetJob(job)->attempt());
          auto r = c_->Heartbeat(hb);
          EXPECT_TRUE(r.ok()) << r.status();
          if (r.ok()) last[m] = *r;
        }
      }
      if (probe) c_->ProbeShards();
      c_->Tick();
    }
    return last;
  }

  static bool HasReason(const JobStatus& st, const std::string& reason, const std::string& text) {
    for (const JobCondition& c : st.conditions()) {
      if (c.reason() == reason && c.message().find(text) != std::string::npos) return true;
    }
    return false;
  }

  ManualClock clock_;
  std::unique_ptr<Coordinator> c_;
  std::map<std::string, std::string> ids_;
  absl::Mutex mu_;
  std::set<std::string> hung_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> probes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(absl::Status)>> held_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ProbeTest, AReplicatedJobLosesAHeartbeatingShardThatAnswersNoProbeAndTakesASpare) {
  const std::string job = StartReplicatedJob();
  ASSERT_EQ(c_->GetJob(job)->state(), RUNNING);
  const MemberStatus victim = ShardAt(job, 1);
  {
    absl::MutexLock lock(&mu_);
    hung_.insert(victim.address());
  }
  // It heartbeats all along: only the probes tell. 280 ms, under the
  // 400 ms timeout: nothing yet (shard-0, if it answers, says NOT_FOUND:
  // an answer).
  const std::vector<std::string> all = {ids_["shard-0"], ids_["shard-1"], ids_["shard-2"], ids_["worker-0"]};
  Rounds(7, all, job);
  EXPECT_EQ(c_->GetJob(job)->lost_shards_size(), 0) << c_->GetJob(job)->DebugString();
  // 240 ms more: lost, its chunks led by their backups; the job goes on.
  auto last = Rounds(6, all, job);
  JobStatus st = *c_->GetJob(job);
  EXPECT_EQ(st.state(), RUNNING);
  ASSERT_EQ(st.lost_shards_size(), 1) << st.DebugString();
  EXPECT_EQ(st.lost_shards(0), 1);
  EXPECT_TRUE(HasReason(st, "ShardLost", "answered no probe for")) << st.DebugString();
  // Quarantined: its heartbeats ask it to exit and stop the job; the others
  // carry on untold.
  EXPECT_NE(last[victim.member_id()].exit_reason().find("answered no probe"), std::string::npos);
  EXPECT_TRUE(last[victim.member_id()].cancel_job());
  for (const std::string& m : all) {
    if (m != victim.member_id()) {
      EXPECT_EQ(last[m].exit_reason(), "") << m;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(probes_[victim.address()], 1) << "one probe in flight to a hung shard, not one per round";
    for (const std::string name : {"shard-0", "shard-1", "shard-2"}) {
      if (Address(name) != victim.address()) {
        EXPECT_GE(probes_[Address(name)], 12) << name;
      }
    }
  }
  // It stops the job and stays alive, yet is never the spare.
  std::vector<std::string> others;
  for (const std::string& m : all) {
    if (m != victim.member_id()) others.push_back(m);
  }
  Rounds(5, others, job, {victim.member_id()});
  EXPECT_EQ(c_->GetJob(job)->catching_up_shards_size(), 0);
  for (const MemberStatus& m : c_->Members()) {
    if (m.member_id() == victim.member_id()) {
      EXPECT_TRUE(m.alive());
      EXPECT_NE(m.unresponsive(), "");
    }
  }
  // A new shard is.
  const std::string s3 = Join(MEMBER_ROLE_SHARD, "shard-3");
  others.push_back(s3);
  Rounds(1, others, job, {victim.member_id()});
  st = *c_->GetJob(job);
  ASSERT_EQ(st.catching_up_shards_size(), 1) << st.DebugString();
  EXPECT_EQ(ShardAt(job, 1).name(), "shard-3");
}

// A shard lost by its lease (it answered its probes) that comes back long
// after is probed afresh when it becomes the spare: its answers from
// before say nothing of it now.
TEST_F(ProbeTest, ASpareThatWasLostLongAgoIsProbedAfresh) {
  const std::string job = StartReplicatedJob();
  ASSERT_EQ(c_->GetJob(job)->state(), RUNNING);
  const std::vector<std::string> all = {ids_["shard-0"], ids_["shard-1"], ids_["shard-2"], ids_["worker-0"]};
  Rounds(3, all, job);
  const MemberStatus gone = ShardAt(job, 2);
  std::vector<std::string> others;
  for (const std::string& m : all) {
    if (m != gone.member_id()) others.push_back(m);
  }
  // Silent for 600 ms (lost by its lease after 150), then back, idle.
  Rounds(15, others, job);
  ASSERT_EQ(c_->GetJob(job)->lost_shards_size(), 1);
  // Placed as the spare by its heartbeat; the ticks come before the
  // prober's next round: nothing to judge it by yet.
  Rounds(1, others, job, {gone.member_id()}, /*probe=*/false);
  JobStatus st = *c_->GetJob(job);
  ASSERT_EQ(st.catching_up_shards_size(), 1) << st.DebugString();
  EXPECT_EQ(ShardAt(job, 2).member_id(), gone.member_id());
  others.push_back(gone.member_id());
  Rounds(2, others, job, {}, /*probe=*/false);
  st = *c_->GetJob(job);
  EXPECT_FALSE(HasReason(st, "ShardLost", "answered no probe")) << st.DebugString();
  EXPECT_EQ(st.catching_up_shards_size(), 1) << st.DebugString();
}

// Without replicas the job restarts from its checkpoint (here it has none:
// it fails), and never on the quarantined shard: the next job waits until
// a fresh process registers the name.
TEST_F(ProbeTest, AnUnreplicatedJobEndsAndTheNextWaitsForAShardItCanTrust) {
  Make();
  const std::string s0 = Join(MEMBER_ROLE_SHARD, "shard-9");
  const std::string w0 = Join(MEMBER_ROLE_WORKER, "worker-0");
  const std::string job = SubmitSpec(*c_, "name: one\nworkers: 1\nshards: 1\n");
  ASSERT_EQ(c_->GetJob(job)->state(), RUNNING);
  {
    absl::MutexLock lock(&mu_);
    hung_.insert(Address("shard-9"));
  }
  Rounds(12, {s0, w0}, job);
  JobStatus st = *c_->GetJob(job);
  EXPECT_EQ(st.state(), FAILED) << st.DebugString();
  EXPECT_TRUE(HasReason(st, "MemberLost", "answered no probe for")) << st.DebugString();
  // Its heartbeats go on, saying it runs nothing: the next job is not
  // placed on it.
  const std::string next = SubmitSpec(*c_, "name: two\nworkers: 1\nshards: 1\n");
  Rounds(5, {}, next, {s0, w0});
  EXPECT_EQ(c_->GetJob(next)->state(), PENDING);
  // The process exits; a lease later a new one registers the name, and
  // the job runs on it.
  Rounds(5, {}, next, {w0});
  {
    absl::MutexLock lock(&mu_);
    hung_.clear();
  }
  const std::string fresh = Join(MEMBER_ROLE_SHARD, "shard-9");
  EXPECT_NE(fresh, s0);
  Rounds(1, {}, next, {fresh, w0});
  EXPECT_EQ(c_->GetJob(next)->state(), RUNNING) << c_->GetJob(next)->DebugString();
}

// A real probe (a Stats call over gRPC) of a shard that completes TCP
// handshakes and never answers (a socket that listens and never accepts)
// would stay in flight until its deadline; the coordinator's Shutdown
// cancels it instead of waiting the probe timeout out.
TEST(ProbeShutdownTest, ShutdownCancelsAProbeOfAHungShard) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  CoordinatorOptions o = TestCoordinatorOptions();
  o.shard_probe_timeout = absl::Seconds(30);
  std::unique_ptr<Coordinator> c = MakeTestCoordinator(o);
  ASSERT_NE(c, nullptr);
  for (const auto& [role, name] : {std::pair{MEMBER_ROLE_SHARD, "shard-0"}, std::pair{MEMBER_ROLE_WORKER, "worker-0"}}) {
    RegisterRequest r;
    r.set_role(role);
    r.set_name(name);
    if (role == MEMBER_ROLE_SHARD) r.set_address("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
    ASSERT_TRUE(c->Register(r).ok());
  }
  const std::string job = SubmitSpec(*c, "name: one\nworkers: 1\nshards: 1\n");
  ASSERT_EQ(c->GetJob(job)->state(), RUNNING);
  c->ProbeShards();
  absl::SleepFor(absl::Milliseconds(300));  // connected, the call sent, no answer
  const absl::Time start = absl::Now();
  c.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "Shutdown waited for the probe's deadline";
  close(fd);
}

TEST(ProbeOptionsTest, ATimeoutUnderTwoHeartbeatsIsRefused) {
  CoordinatorOptions o = TestCoordinatorOptions();
  o.shard_probe_timeout = absl::Milliseconds(90);  // heartbeats of 50 ms
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  auto c = Coordinator::Create(o, std::move(*store));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("two heartbeat intervals"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace pstrain
