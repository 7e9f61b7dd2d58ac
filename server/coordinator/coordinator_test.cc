#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_testing.h"

#include <gtest/gtest.h>

#include <map>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "server/coordinator/checkpoint_driver.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"

namespace pstrain {
namespace {

const char kSpec[] = "name: t\nworkers: 2\nshards: 1\ndata: {format: synthetic}\n";

class CoordinatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Coordinator> Make(const std::string& db = ":memory:", size_t max_conditions = 100) {
    CoordinatorOptions o;
    o.max_conditions = max_conditions;
    o.heartbeat_interval = absl::Milliseconds(50);
    o.missed_heartbeats = 3;
    o.background_tick = false;
    o.clock = &clock_;  // leases move only when the test says
    o.checkpoint_root = *CanonicalRoot(::testing::TempDir());
    auto store = JobStore::Open(db);
    EXPECT_TRUE(store.ok());
    auto c = Coordinator::Create(o, std::move(*store));
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }
  std::string Join(Coordinator& c, MemberRole role, const std::string& name,
                   const std::string& job = "", int rank = 0, uint64_t attempt = 1) {
    RegisterRequest r;
    r.set_role(role);
    r.set_name(name);
    if (role == MEMBER_ROLE_SHARD) r.set_address("127.0.0.1:1" + name.substr(name.size() - 1));
    r.set_job_id(job);
    r.set_rank(rank);
    r.set_attempt(job.empty() ? 0 : attempt);
    // As a member does: it names the id it had (its credential for its seat).
    r.set_previous_member_id(ids_[name]);
    auto resp = c.Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return ids_[name] = resp->member_id();
  }
  std::string Submit(Coordinator& c, const std::string& spec = kSpec) { return SubmitSpec(c, spec); }
  // `rounds` heartbeats 40 ms apart from each of `members`, all running
  // attempt 1 of `job`, a Tick after each round; none is told to stop.
  void KeepRunning(Coordinator& c, const std::vector<std::string>& members, const std::string& job, int rounds) {
    for (int i = 0; i < rounds; ++i) {
      clock_.Advance(absl::Milliseconds(40));
      for (const std::string& m : members) {
        HeartbeatRequest hb;
        hb.set_member_id(m);
        hb.set_running_job_id(job);
        hb.set_running_attempt(1);
        auto r = c.Heartbeat(hb);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_FALSE(r->cancel_job());
      }
      c.Tick();
    }
  }
  void Event(Coordinator& c, const std::string& member, const std::string& job, const std::string& json) {
    ReportProgressRequest r;
    r.set_member_id(member);
    r.set_job_id(job);
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, r.mutable_event()).ok()) << json;
    r.set_attempt(c.GetJob(job)->attempt());  // the current one
    ASSERT_TRUE(c.ReportProgress(r).ok());
  }
  JobState State(Coordinator& c, const std::string& job) { return c.GetJob(job)->state(); }
  // A coordinator over a fresh `db` that starts a 1-shard, 1-worker job and
  // stops (as a restart test's first life); the job's id.
  // shard-0 registered by someone else after a restart: its name, another
  // address (10.66.0.1:1), `job` and `attempt`, a guessed member id.
  static RegisterRequest Impostor(const std::string& job, uint64_t attempt) {
    RegisterRequest fake;
    fake.set_role(MEMBER_ROLE_SHARD);
    fake.set_name("shard-0");
    fake.set_address("10.66.0.1:1");
    fake.set_job_id(job);
    fake.set_attempt(attempt);
    fake.set_previous_member_id("shard-0#" + std::string(32, '0'));
    return fake;
  }
  std::string StartJobAndStop(const std::string& db) {
    std::filesystem::remove(db);
    auto c = Make(db);
    Join(*c, MEMBER_ROLE_SHARD, "shard-0");
    Join(*c, MEMBER_ROLE_WORKER, "worker-0");
    const std::string job = Submit(*c, "name: one\nworkers: 1\nshards: 1\n");
    EXPECT_EQ(State(*c, job), RUNNING);
    return job;
  }
  std::string WriteCheckpointAt(int64_t step, const std::string& spec_yaml,
                                std::vector<CheckpointManifest::Worker> workers = {}) {
    return WriteFakeCheckpoint(::testing::TempDir() + "/ckpt-" + std::to_string(step), step, spec_yaml,
                               std::move(workers));
  }
  absl::StatusOr<std::string> Resume(Coordinator& c, const std::string& dir) { return SubmitResume(c, dir); }

  ManualClock clock_;
  std::map<std::string, std::string> ids_;  // member name -> the id Join got last
};

TEST_F(CoordinatorTest, JobRunsWhenItsMembersAreFreeAndSucceedsWhenWorkersAreDone) {
  auto c = Make();
  const std::string job = Submit(*c);
  EXPECT_EQ(State(*c, job), PENDING);
  const std::string s0 = Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  EXPECT_EQ(State(*c, job), PENDING);  // all or nothing: needs 2 workers
  std::string w1 = Join(*c, MEMBER_ROLE_WORKER, "worker-1");
  EXPECT_EQ(State(*c, job), RUNNING);

  auto a = c->GetAssignment(w1, absl::Now() + absl::Seconds(30));  // once the attempt is on disk
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->job_id(), job);
  // Ranks follow the members' random order (no name puts a member first):
  // w0 and w1 below are the holders of ranks 0 and 1.
  ASSERT_TRUE(a->rank() == 0 || a->rank() == 1) << a->rank();
  auto other = c->GetAssignment(w0, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->rank(), 1 - a->rank());
  if (a->rank() == 0) std::swap(w0, w1);
  EXPECT_EQ(a->world_size(), 2);
  ASSERT_EQ(a->shard_addresses_size(), 1);
  EXPECT_EQ(a->shard_addresses(0), "127.0.0.1:10");

  Event(*c, w0, job, R"({"rank": 0, "progress": {"epoch": 1, "step": 10, "steps": 20, "loss": 1.5, "samples_per_s": 100}})");
  Event(*c, w1, job, R"({"rank": 1, "progress": {"epoch": 1, "step": 8, "steps": 20, "loss": 0.5, "samples_per_s": 50}})");
  auto st = c->GetJob(job);
  EXPECT_EQ(st->step(), 8);
  EXPECT_DOUBLE_EQ(st->loss(), 1.0);
  EXPECT_DOUBLE_EQ(st->samples_per_s(), 150);
  Event(*c, w0, job, R"({"rank": 0, "eval": {"epoch": 1, "accuracy": 0.9, "test_loss": 0.3, "final": true}})");
  Event(*c, w0, job, R"({"rank": 0, "done": {}})");
  EXPECT_EQ(State(*c, job), RUNNING);
  Event(*c, w1, job, R"({"rank": 1, "done": {}})");
  st = c->GetJob(job);
  EXPECT_EQ(st->state(), SUCCEEDED);
  EXPECT_DOUBLE_EQ(st->final_accuracy(), 0.9);
  std::vector<std::string> reasons;
  for (const auto& cond : st->conditions()) reasons.push_back(cond.reason());
  EXPECT_EQ(reasons, (std::vector<std::string>{"Submitted", "Scheduled", "Completed"}));
  EXPECT_EQ(st->members_size(), 3);
  // The members are free for the next job.
  const std::string next = Submit(*c);
  EXPECT_EQ(State(*c, next), RUNNING);
}

TEST_F(CoordinatorTest, FifoAllOrNothingAndCancelFreesMembers) {
  auto c = Make();
  Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  Join(*c, MEMBER_ROLE_WORKER, "worker-1");
  const std::string big = Submit(*c, "name: big\nworkers: 3\nshards: 1\n");
  const std::string small = Submit(*c);
  // The big job cannot start, and the small one does not overtake it.
  EXPECT_EQ(State(*c, big), PENDING);
  EXPECT_EQ(State(*c, small), PENDING);
  ASSERT_TRUE(c->CancelJob(big).ok());
  EXPECT_EQ(State(*c, big), CANCELLED);
  EXPECT_EQ(State(*c, small), RUNNING);
  ASSERT_TRUE(c->CancelJob(small).ok());
  for (const auto& m : c->Members()) EXPECT_EQ(m.job_id(), "") << m.name();
  EXPECT_EQ(c->CancelJob(small).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->CancelJob("job-999999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, CancelledMemberLearnsItThroughItsHeartbeat) {
  auto c = Make();
  Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  const std::string job = Submit(*c, "name: one\nworkers: 1\nshards: 1\n");
  HeartbeatRequest hb;
  hb.set_member_id(w0);
  hb.set_running_job_id(job);
  hb.set_running_attempt(1);
  EXPECT_FALSE(c->Heartbeat(hb)->cancel_job());
  ASSERT_TRUE(c->CancelJob(job).ok());
  EXPECT_TRUE(c->Heartbeat(hb)->cancel_job());
}

TEST_F(CoordinatorTest, LostMemberFailsItsRunningJob) {
  auto c = Make();
  Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  const std::string job = Submit(*c, "name: one\nworkers: 1\nshards: 1\n");
  EXPECT_EQ(State(*c, job), RUNNING);
  // Only the worker keeps beating.
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(absl::Milliseconds(40));
    HeartbeatRequest hb;
    hb.set_member_id(w0);
    ASSERT_TRUE(c->Heartbeat(hb).ok());
    c->Tick();
  }
  auto st = c->GetJob(job);
  EXPECT_EQ(st->state(), FAILED);
  EXPECT_EQ(st->conditions().rbegin()->reason(), "MemberLost");
  EXPECT_NE(st->conditions().rbegin()->message().find("shard-0"), std::string::npos);
}

TEST_F(CoordinatorTest, RestartedCoordinatorKeepsJobsAndReattachesMembers) {
  const std::string db = ::testing::TempDir() + "/coord.db";
  std::filesystem::remove(db);
  std::string job, pending;
  {
    auto c = Make(db);
    Join(*c, MEMBER_ROLE_SHARD, "shard-0");
    Join(*c, MEMBER_ROLE_WORKER, "worker-0");
    job = Submit(*c, "name: one\nworkers: 1\nshards: 1\n");
    pending = Submit(*c, "name: two\nworkers: 1\nshards: 1\n");
    EXPECT_EQ(State(*c, job), RUNNING);
  }
  auto c = Make(db);
  EXPECT_EQ(State(*c, job), RUNNING);
  EXPECT_EQ(State(*c, pending), PENDING);
  // The members come back, saying what they were running, and keep beating:
  // the job carries on past the re-attach window and then completes.
  const std::string s0 = Join(*c, MEMBER_ROLE_SHARD, "shard-0", job, 0);
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0", job, 0);
  KeepRunning(*c, {s0, w0}, job, 6);
  EXPECT_EQ(State(*c, job), RUNNING);
  EXPECT_EQ(State(*c, pending), PENDING);
  Event(*c, w0, job, R"({"rank": 0, "done": {}})");
  EXPECT_EQ(State(*c, job), SUCCEEDED);
  EXPECT_EQ(State(*c, pending), RUNNING);
}

// A shard learns its job's attempt only from heartbeats, once the store
// holds it; a coordinator killed in between (right after the job started)
// leaves it naming the job with attempt 0. It is re-attached when the
// current attempt names it, and the job carries on past the re-attach
// window; a shard naming another attempt is still not (it failed the job:
// "shard shard-0 (rank 0) was lost", make test-torch2's
// JobCompletesAcrossACoordinatorRestart).
TEST_F(CoordinatorTest, AShardThatNeverHeardItsAttemptIsReattachedAfterARestart) {
  for (const uint64_t heard : {uint64_t{0}, uint64_t{2}}) {
    SCOPED_TRACE(heard);
    const std::string db = ::testing::TempDir() + "/coord-heard-" + std::to_string(heard) + ".db";
    const std::string job = StartJobAndStop(db);
    auto c = Make(db);
    const std::string s0 = Join(*c, MEMBER_ROLE_SHARD, "shard-0", job, 0, heard);
    const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0", job, 0);
    for (int i = 0; i < 300; ++i) {  // 12 s: past the re-attach window (10 s at least)
      clock_.Advance(absl::Milliseconds(40));
      for (const std::string& m : {s0, w0}) {
        HeartbeatRequest hb;
        hb.set_member_id(m);
        if (m == w0) {
          hb.set_running_job_id(job);
          hb.set_running_attempt(1);
        }
        ASSERT_TRUE(c->Heartbeat(hb).ok());
      }
      c->Tick();
    }
    EXPECT_EQ(State(*c, job), heard == 0 ? RUNNING : FAILED);
  }
}

// After a coordinator restart, a name and a role are no credential. A
// process that registers a running job's shard name first -- naming the
// job, its attempt and any id but the seat's -- is not re-attached: no
// assignment (job secret, spec), and its address never reaches the job's
// status (where SaveTable and SetWorkers would be sent). The real shard,
// naming the member id the store holds, takes its seat back even though
// the impostor is live, and the job carries on past the re-attach window.
TEST_F(CoordinatorTest, AnImpostorRegisteringFirstAfterARestartGetsNoSeat) {
  const std::string db = ::testing::TempDir() + "/coord-impostor.db";
  const std::string job = StartJobAndStop(db);
  const std::string seat_id = ids_["shard-0"];
  auto c = Make(db);
  auto impostor = c->Register(Impostor(job, 1));
  ASSERT_TRUE(impostor.ok()) << impostor.status();  // the name was free
  EXPECT_NE(impostor->member_id(), seat_id);
  auto a = c->GetAssignment(impostor->member_id(), absl::Now() + absl::Milliseconds(200));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->job_id(), "");
  EXPECT_EQ(a->job_secret(), "");
  c->Tick();
  {
    const JobStatus st = c->GetJob(job).value();
    for (const MemberStatus& m : st.members()) EXPECT_NE(m.address(), "10.66.0.1:1") << m.name();
  }
  // The real members come back with their ids.
  const std::string s0 = Join(*c, MEMBER_ROLE_SHARD, "shard-0", job, 0);
  EXPECT_EQ(s0, seat_id);
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0", job, 0);
  HeartbeatRequest gone;
  gone.set_member_id(impostor->member_id());
  EXPECT_EQ(c->Heartbeat(gone).status().code(), absl::StatusCode::kNotFound);
  KeepRunning(*c, {s0, w0}, job, 300);  // 12 s: past the re-attach window (10 s at least)
  EXPECT_EQ(State(*c, job), RUNNING);
  {
    const JobStatus st = c->GetJob(job).value();
    for (const MemberStatus& m : st.members()) EXPECT_NE(m.address(), "10.66.0.1:1") << m.name();
  }
}

// A shard learns its job from heartbeats: killed within a heartbeat of the
// job's start, the coordinator comes back to a shard that names no job. Its
// member id alone takes its seat back (control_plane_test's impostor race
// lost the job this way, 1 run in 3); a guessed id, with no job named, does not.
TEST_F(CoordinatorTest, AShardThatHeardNoJobTakesItsSeatBackByItsMemberId) {
  const std::string db = ::testing::TempDir() + "/coord-unheard.db";
  const std::string job = StartJobAndStop(db);
  const std::string seat_id = ids_["shard-0"];
  auto c = Make(db);
  auto impostor = c->Register(Impostor("", 0));  // names no job either
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  EXPECT_NE(impostor->member_id(), seat_id);
  // The real shard: no job, no attempt, its id; it gets the seat although
  // the impostor holds the name.
  const std::string s0 = Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  EXPECT_EQ(s0, seat_id);
  auto a = c->GetAssignment(s0, absl::Now() + absl::Milliseconds(200));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_id(), job);
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0", job, 0);
  KeepRunning(*c, {s0, w0}, job, 300);  // past the re-attach window
  EXPECT_EQ(State(*c, job), RUNNING);
}

TEST_F(CoordinatorTest, RunningJobFailsIfItsMembersDoNotComeBackAfterARestart) {
  const std::string db = ::testing::TempDir() + "/coord2.db";
  const std::string job = StartJobAndStop(db);
  auto c = Make(db);
  c->Tick();
  EXPECT_EQ(State(*c, job), RUNNING);  // members get time to come back
  clock_.Advance(absl::Seconds(9));
  c->Tick();
  EXPECT_EQ(State(*c, job), RUNNING);  // 10 s at least
  clock_.Advance(absl::Milliseconds(1200));  // past the re-attach window
  c->Tick();
  EXPECT_EQ(State(*c, job), FAILED);
}

// Restoring onto a shard that cannot be reached (gone since it was
// scheduled) is retried as a restart, at most max_restarts times, then the
// job fails saying why.
TEST_F(CoordinatorTest, RestoreOntoAnUnreachableShardIsRetriedThenFails) {
  const std::string dir =
      WriteCheckpointAt(5, "name: t\nworkers: 1\nshards: 1\nmax_restarts: 2\ndata: {format: synthetic}\n");
  auto c = Make(":memory:", /*max_conditions=*/4);
  const std::string s0 = Join(*c, MEMBER_ROLE_SHARD, "shard-0");  // at 127.0.0.1:10, where nothing listens
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  auto job = Resume(*c, dir);
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(50);
  while (State(*c, *job) != FAILED && absl::Now() < deadline) {
    // Both members stay alive; the worker runs nothing (so a requeued
    // attempt releases it at once).
    for (const std::string& m : {s0, w0}) {
      HeartbeatRequest hb;
      hb.set_member_id(m);
      ASSERT_TRUE(c->Heartbeat(hb).ok());
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  auto st = c->GetJob(*job);
  ASSERT_EQ(st->state(), FAILED);
  EXPECT_EQ(st->restarts(), 2);
  int requeued = 0;
  for (const auto& cond : st->conditions()) requeued += cond.reason() == "RestoreFailed" && cond.state() == PENDING;
  // Every scheduling was a new attempt (persisted in the status).
  EXPECT_EQ(st->attempt(), 3u);
  // The conditions are capped: the first (Submitted) and the newest.
  ASSERT_EQ(st->conditions_size(), 4);
  EXPECT_EQ(st->conditions(0).reason(), "Submitted");
  EXPECT_GE(requeued, 1);
  EXPECT_EQ(st->conditions().rbegin()->reason(), "RestoreFailed");
  EXPECT_NE(st->conditions().rbegin()->message().find("shard 0"), std::string::npos)
      << st->conditions().rbegin()->message();
}

// A job restarted from its checkpoint reports the checkpoint's step and
// epoch once restored, not the step its lost attempt had reached past it
// (the status's step also decides when a periodic checkpoint is due).
TEST_F(CoordinatorTest, ARestoredJobsProgressIsTheCheckpointsUntilItsWorkersReport) {
  const std::string dir =
      WriteCheckpointAt(120, "name: t\nmode: allreduce\nworkers: 2\nmax_restarts: 2\ndata: {format: synthetic}\n",
                        {{0, 120, 2, 20, 0}, {1, 120, 2, 20, 0}});
  auto c = Make();
  const std::string w0 = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  const std::string w1 = Join(*c, MEMBER_ROLE_WORKER, "worker-1");
  auto job = Resume(*c, dir);
  ASSERT_TRUE(job.ok()) << job.status();
  auto restored = [&](uint64_t attempt) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      auto st = c->GetJob(*job);
      if (st->attempt() == attempt && st->conditions().rbegin()->reason() == "Restored") return true;
      // The workers run nothing: their heartbeats say the last attempt stopped.
      for (const std::string& w : {w0, w1}) {
        HeartbeatRequest hb;
        hb.set_member_id(w);
        EXPECT_TRUE(c->Heartbeat(hb).ok());
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  };
  ASSERT_TRUE(restored(1));
  EXPECT_EQ(c->GetJob(*job)->step(), 120);
  EXPECT_EQ(c->GetJob(*job)->epoch(), 3);
  for (int rank : {0, 1}) {
    Event(*c, rank == 0 ? w0 : w1, *job,
          absl::StrCat(R"({"rank": )", rank,
                       R"(, "progress": {"epoch": 4, "step": 170, "steps": 1000, "samples_per_s": 900}})"));
  }
  ASSERT_EQ(c->GetJob(*job)->step(), 170);
  // A rank fails with a retryable error: the job goes back to its
  // checkpoint, on the same (now free) workers.
  Event(*c, w1, *job, R"({"rank": 1, "error": {"message": "a peer left", "retryable": true}})");
  auto st = c->GetJob(*job);
  EXPECT_EQ(st->state(), PENDING);
  EXPECT_EQ(st->samples_per_s(), 0);  // nothing trains
  ASSERT_TRUE(restored(2)) << c->GetJob(*job)->DebugString();
  st = c->GetJob(*job);
  EXPECT_EQ(st->restarts(), 1);
  EXPECT_EQ(st->step(), 120);
  EXPECT_EQ(st->epoch(), 3);  // the manifest's epoch 2 counts from 0, the status's from 1
  EXPECT_EQ(st->samples_per_s(), 0);
}

// Where restored workers start, and with which fp16 loss scale: each
// rank's own when the worker count is the same; otherwise every rank at the
// checkpoint's epoch start with the smallest scale any rank had.
TEST(StartPositionsTest, LossScalesFollowTheirRanksOrTheSmallestIsShared) {
  CheckpointManifest m;
  m.step = 40;
  m.workers.push_back({0, 40, 2, 7, 8192.0});
  m.workers.push_back({1, 41, 2, 8, 4096.0});
  m.workers.push_back({2, 40, 3, 0, 0.0});  // an fp32 rank: none
  auto same = StartPositions(m, 3);
  ASSERT_EQ(same.size(), 3u);
  EXPECT_EQ(same[1].loss_scale, 4096.0);
  EXPECT_EQ(same[1].epoch_step, 8);
  auto fewer = StartPositions(m, 2);
  ASSERT_EQ(fewer.size(), 2u);
  for (const auto& w : fewer) {
    EXPECT_EQ(w.loss_scale, 4096.0);
    EXPECT_EQ(w.step, 40);
    EXPECT_EQ(w.epoch, 2);
    EXPECT_EQ(w.epoch_step, 0);
  }
  m.workers.clear();
  EXPECT_EQ(StartPositions(m, 2)[0].loss_scale, 0.0);
}

TEST_F(CoordinatorTest, SpecErrorsAreRefusedAtSubmit) {
  auto c = Make();
  SubmitJobRequest req;
  req.set_spec_yaml("workers: 0\n");
  auto id = c->SubmitJob(req);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("workers"), absl::string_view::npos);
  EXPECT_TRUE(c->ListJobs().empty());
}

TEST_F(CoordinatorTest, KeyValueStoreWaitsForKeys) {
  auto c = Make();
  const std::string shard = Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  const std::string w = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  Join(*c, MEMBER_ROLE_WORKER, "worker-1");
  const std::string job = Submit(*c);  // scheduled: attempt 1
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(c->KvSet(shard, job, 1, "nccl_id", "abc").ok());
  });
  auto v = c->KvGet(w, job, 1, "nccl_id", absl::Now() + absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "abc");
  EXPECT_EQ(c->KvGet(w, job, 1, "missing", absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kNotFound);  // as control.proto promises
  EXPECT_EQ(*c->KvAdd(w, job, 1, "ranks", 1), 1);
  EXPECT_EQ(*c->KvAdd(w, job, 1, "ranks", 2), 3);
  EXPECT_EQ(c->KvSet(w, "job-999", 1, "k", "v").code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace pstrain
