// The coordinator against hostile or buggy members and clients: attempt
// fencing of events, heartbeats, KV and re-registration; bounded members,
// names, KV and conditions; events of the wrong shape; one checkpoint at a
// time; the status written without the coordinator's lock.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <future>

#include "absl/cleanup/cleanup.h"
#include "checkpoint/pause_keys.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_testing.h"

namespace pstrain {
namespace {

const char kSpec[] = "name: t\nworkers: 1\nshards: 1\ndata: {format: synthetic}\n";

CoordinatorOptions Options() { return TestCoordinatorOptions(); }

std::unique_ptr<Coordinator> Make(const CoordinatorOptions& o = Options()) { return MakeTestCoordinator(o); }

absl::StatusOr<RegisterResponse> Join(Coordinator& c, MemberRole role, const std::string& name,
                                      const std::string& job = "", uint64_t attempt = 0) {
  RegisterRequest r;
  r.set_role(role);
  r.set_name(name);
  if (role == MEMBER_ROLE_SHARD) r.set_address("127.0.0.1:1");
  r.set_job_id(job);
  r.set_rank(0);
  r.set_attempt(attempt);
  return c.Register(r);
}

std::string Submit(Coordinator& c, const std::string& spec = kSpec) { return SubmitSpec(c, spec); }

absl::StatusOr<ReportProgressResponse> Event(Coordinator& c, const std::string& member, const std::string& job,
                                             uint64_t attempt, const WorkerEvent& event) {
  ReportProgressRequest r;
  r.set_member_id(member);
  r.set_job_id(job);
  r.set_attempt(attempt);
  *r.mutable_event() = event;
  return c.ReportProgress(r);
}

// A WorkerEvent from its JSON form (protobuf's JSON mapping).
WorkerEvent Parse(const std::string& json) {
  WorkerEvent e;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &e).ok()) << json;
  return e;
}

// A member of an ended attempt (cut off by a partition, then back) cannot
// touch the job's current attempt: its events are ignored and it is told to
// stop, its KV requests are refused, and it is not re-attached.
TEST(CoordinatorFencingTest, RequestsOfAnotherAttemptAreRefusedOrIgnored) {
  auto c = Make();
  const std::string shard = Join(*c, MEMBER_ROLE_SHARD, "shard-0")->member_id();
  const std::string worker = Join(*c, MEMBER_ROLE_WORKER, "worker-0")->member_id();
  const std::string job = Submit(*c);
  auto st = c->GetJob(job);
  ASSERT_EQ(st->state(), RUNNING);
  ASSERT_EQ(st->attempt(), 1u);
  auto a = c->GetAssignment(worker, absl::Now() + absl::Seconds(30));  // once the attempt is on disk
  EXPECT_EQ(a->attempt(), 1u);
  EXPECT_NE(a->output_dir().find("/" + job), std::string::npos) << a->output_dir();

  // Events of attempt 0 (or 2): ignored, the sender is told to stop.
  auto r = Event(*c, worker, job, 0, Parse(R"({"rank": 0, "done": {"samples": 5}})"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->cancel_job());
  EXPECT_EQ(c->GetJob(job)->state(), RUNNING);
  r = Event(*c, worker, job, 2, Parse(R"({"rank": 0, "error": {"message": "x"}})"));
  EXPECT_TRUE(r->cancel_job());
  EXPECT_EQ(c->GetJob(job)->state(), RUNNING);
  // KV of another attempt: ABORTED.
  EXPECT_EQ(c->KvSet(worker, job, 0, "k", "v").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c->KvAdd(worker, job, 2, "k", 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c->KvGet(worker, job, 0, "k", absl::Now()).status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(c->KvSet(worker, job, 1, "k", "v").ok());
  // A heartbeat saying it runs attempt 0 of the job it is assigned: stop it.
  HeartbeatRequest hb;
  hb.set_member_id(worker);
  hb.set_running_job_id(job);
  hb.set_running_attempt(0);
  EXPECT_TRUE(c->Heartbeat(hb)->cancel_job());
  hb.set_running_attempt(1);
  auto beat = c->Heartbeat(hb);
  EXPECT_FALSE(beat->cancel_job());
  EXPECT_EQ(beat->attempt(), 1u);
  // Re-registering under another attempt does not re-attach.
  RegisterRequest rejoin;
  rejoin.set_role(MEMBER_ROLE_WORKER);
  rejoin.set_name("worker-0");
  rejoin.set_job_id(job);
  rejoin.set_attempt(7);
  rejoin.set_previous_member_id(worker);
  auto again = c->Register(rejoin);
  ASSERT_TRUE(again.ok());
  for (const auto& m : c->Members()) {
    if (m.member_id() == again->member_id()) {
      EXPECT_EQ(m.job_id(), "");
    }
  }
  (void)shard;
}

// What a worker says it is doing comes from the member: an unknown phase,
// a negative or NaN duration, a negative step or shard are stored as
// something that means something; a shard's heartbeat carries none.
TEST(CoordinatorLimitsTest, ActivityFromHeartbeatsIsSanitised) {
  auto c = Make();
  const std::string shard = Join(*c, MEMBER_ROLE_SHARD, "shard-0")->member_id();
  const std::string worker = Join(*c, MEMBER_ROLE_WORKER, "worker-0")->member_id();
  const std::string job = Submit(*c);
  ASSERT_EQ(c->GetJob(job)->state(), RUNNING);
  auto activity_of = [&](const std::string& name) {
    const JobStatus st = *c->GetJob(job);
    for (const MemberStatus& m : st.members()) {
      if (m.name() == name) return m.activity();
    }
    ADD_FAILURE() << name << " is not a member of " << job;
    return WorkerActivity();
  };
  HeartbeatRequest hb;
  hb.set_member_id(worker);
  hb.set_running_job_id(job);
  hb.set_running_attempt(1);
  hb.mutable_activity()->set_phase(static_cast<WorkerActivity::Phase>(999));
  hb.mutable_activity()->set_for_s(std::nan(""));
  hb.mutable_activity()->set_step(-5);
  hb.mutable_activity()->set_shard(-70);
  ASSERT_TRUE(c->Heartbeat(hb).ok());
  WorkerActivity a = activity_of("worker-0");
  EXPECT_EQ(a.phase(), WorkerActivity::PHASE_UNSPECIFIED);
  EXPECT_EQ(a.for_s(), 0);
  EXPECT_EQ(a.step(), 0);
  EXPECT_EQ(a.shard(), -1);
  hb.mutable_activity()->set_phase(WorkerActivity::SHARDS);
  hb.mutable_activity()->set_for_s(1e300);
  hb.mutable_activity()->set_shard(0);
  hb.mutable_activity()->set_step(12);
  ASSERT_TRUE(c->Heartbeat(hb).ok());
  a = activity_of("worker-0");
  EXPECT_EQ(a.phase(), WorkerActivity::SHARDS);
  EXPECT_EQ(a.for_s(), 0);
  EXPECT_EQ(a.step(), 12);
  EXPECT_EQ(a.shard(), 0);
  // A shard's heartbeat: no activity kept, whatever it sends.
  HeartbeatRequest shb = hb;
  shb.set_member_id(shard);
  ASSERT_TRUE(c->Heartbeat(shb).ok());
  EXPECT_EQ(activity_of("shard-0").phase(), WorkerActivity::PHASE_UNSPECIFIED);
}

TEST(CoordinatorLimitsTest, MembersNamesAndDeadRegistrationsAreBounded) {
  CoordinatorOptions o = Options();
  o.max_members = 3;
  o.forget_after_leases = 2;
  ManualClock clock;
  o.clock = &clock;
  auto c = Make(o);
  auto r = Join(*c, MEMBER_ROLE_WORKER, std::string(1 << 20, 'n'));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(r.status().message().size(), 400u);
  EXPECT_EQ(Join(*c, MEMBER_ROLE_WORKER, "bad\nname").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Join(*c, MEMBER_ROLE_UNSPECIFIED, "x").status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Join(*c, MEMBER_ROLE_WORKER, "w1").ok());
  ASSERT_TRUE(Join(*c, MEMBER_ROLE_WORKER, "w2").ok());
  ASSERT_TRUE(Join(*c, MEMBER_ROLE_WORKER, "w3").ok());
  EXPECT_EQ(Join(*c, MEMBER_ROLE_WORKER, "w4").status().code(), absl::StatusCode::kResourceExhausted);
  // A live member's name is not for a stranger.
  EXPECT_EQ(Join(*c, MEMBER_ROLE_WORKER, "w3").status().code(), absl::StatusCode::kAlreadyExists);
  // Nobody beats: lost after one lease, forgotten after two more.
  clock.Advance(absl::Milliseconds(200));
  c->Tick();
  EXPECT_EQ(c->Members().size(), 3u);
  for (const auto& m : c->Members()) EXPECT_FALSE(m.alive());
  clock.Advance(absl::Milliseconds(100));
  c->Tick();
  EXPECT_EQ(c->Members().size(), 3u);  // 300 ms silent: two leases, not more
  clock.Advance(absl::Milliseconds(50));
  c->Tick();
  EXPECT_TRUE(c->Members().empty());
  EXPECT_TRUE(Join(*c, MEMBER_ROLE_WORKER, "w4").ok());
}

TEST(CoordinatorLimitsTest, KeyValueStoreIsBoundedAndKeepsItsContract) {
  CoordinatorOptions o = Options();
  o.max_kv_keys = 3;
  o.max_kv_value_bytes = 100;
  auto c = Make(o);
  (void)Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  const std::string w = Join(*c, MEMBER_ROLE_WORKER, "worker-0")->member_id();
  const std::string job = Submit(*c);  // running: attempt 1
  EXPECT_EQ(c->KvSet(w, job, 1, "k", std::string(101, 'v')).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->KvSet(w, job, 1, std::string(600, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->KvSet(w, job, 1, "", "v").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->KvSet(w, job, 1, "a", "1").ok());
  ASSERT_TRUE(c->KvSet(w, job, 1, "b", "1").ok());
  ASSERT_TRUE(c->KvSet(w, job, 1, "c", "1").ok());
  EXPECT_EQ(c->KvSet(w, job, 1, "d", "1").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(c->KvSet(w, job, 1, "c", "2").ok());  // an existing key may change
  // NOT_FOUND for a key still missing at the deadline, as control.proto says.
  EXPECT_EQ(c->KvGet(w, job, 1, "zzz", absl::Now() + absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(c->KvSet(w, job, 1, "a", std::to_string(INT64_MAX - 1)).ok());
  EXPECT_EQ(*c->KvAdd(w, job, 1, "a", 1), INT64_MAX);
  EXPECT_EQ(c->KvAdd(w, job, 1, "a", 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*c->KvGet(w, job, 1, "a", absl::Now()), std::to_string(INT64_MAX));  // unchanged
  // Only the job's members: an unknown id, and a registered member of no job.
  const std::string idle = Join(*c, MEMBER_ROLE_WORKER, "worker-1")->member_id();
  EXPECT_EQ(c->KvSet("worker-0#1", job, 1, "a", "1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->KvSet(idle, job, 1, "a", "1").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(c->KvGet(idle, job, 1, "a", absl::Now()).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(c->KvAdd(idle, job, 1, "a", 1).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(CoordinatorLimitsTest, MalformedEventsAreRefusedAndChangeNothing) {
  auto c = Make();
  ASSERT_TRUE(Join(*c, MEMBER_ROLE_SHARD, "shard-0").ok());
  const std::string w = Join(*c, MEMBER_ROLE_WORKER, "worker-0")->member_id();
  const std::string job = Submit(*c);
  // An event without a kind; an oversized one.
  EXPECT_EQ(Event(*c, w, job, 1, WorkerEvent()).status().code(), absl::StatusCode::kInvalidArgument);
  WorkerEvent huge;
  huge.mutable_plan()->add_params()->set_name(std::string(2 << 20, 'p'));
  auto r = Event(*c, w, job, 1, huge);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(r.status().message().size(), 600u);
  // The retired free-form JSON field.
  ReportProgressRequest legacy;
  legacy.set_member_id(w);
  legacy.set_job_id(job);
  legacy.set_attempt(1);
  legacy.set_event_json(R"({"event": "done", "rank": 0})");
  EXPECT_EQ(c->ReportProgress(legacy).status().code(), absl::StatusCode::kInvalidArgument);
  auto st = c->GetJob(job);
  EXPECT_EQ(st->params_size(), 0);
  EXPECT_EQ(st->state(), RUNNING);
  // A typed event goes through.
  ASSERT_TRUE(Event(*c, w, job, 1, Parse(R"({"rank": 0, "eval": {"epoch": 1, "accuracy": 0.5}})")).ok());
  EXPECT_EQ(c->GetJob(job)->evals_size(), 1);
}

// Two checkpoint requests at once: the second is refused (UNAVAILABLE, try
// again) while the first holds the claim -- both passed the old check.
TEST(CoordinatorConcurrencyTest, OnlyOneCheckpointOfAJobRunsAtATime) {
  Gate claimed;
  claimed.Open();
  CoordinatorOptions o = Options();
  o.on_checkpoint_claimed = [&](const std::string&) { claimed.Arrive(); };
  auto c = Make(o);
  ASSERT_TRUE(Join(*c, MEMBER_ROLE_SHARD, "shard-0").ok());
  ASSERT_TRUE(Join(*c, MEMBER_ROLE_WORKER, "worker-0").ok());
  const std::string job = Submit(*c);
  // The job has not reported its model: the first checkpoint waits for it.
  auto first = std::async(std::launch::async, [&] { return c->Checkpoint(job).status(); });
  ASSERT_TRUE(claimed.AwaitReached());
  absl::Status second = c->Checkpoint(job).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable) << second;
  EXPECT_NE(second.message().find("already in progress"), absl::string_view::npos) << second;
  ASSERT_TRUE(c->CancelJob(job).ok());  // ends the first one's wait
  EXPECT_FALSE(first.get().ok());
}

// A pipelined job's stages hold parts of the model that no checkpoint
// gathers yet: a checkpoint (asked for, or a drain's) is refused saying so,
// not half taken.
// Writing the status to SQLite (an fsync) happens without the coordinator's
// mutex: a slow disk does not stall heartbeats and queries.
// A submission's insert into the store (an fsync) does not hold the
// coordinator: members heartbeat and register, jobs are read, while it
// waits on the disk. (An elastic test under heavy load once saw a CLI
// submit time out; this was a suspect.)
TEST(CoordinatorConcurrencyTest, ASubmissionIsStoredOffTheLock) {
  Gate insert;
  CoordinatorOptions hooked = Options();
  hooked.before_create = [&] { insert.Arrive(); };
  auto h = Make(hooked);
  const std::string member = Join(*h, MEMBER_ROLE_WORKER, "worker-1")->member_id();
  auto submitting = std::async(std::launch::async, [&] { return Submit(*h); });
  absl::Cleanup open = [&] { insert.Open(); };
  ASSERT_TRUE(insert.AwaitReached());
  auto others = std::async(std::launch::async, [&] {
    HeartbeatRequest hb;
    hb.set_member_id(member);
    return h->Heartbeat(hb).ok() && Join(*h, MEMBER_ROLE_SHARD, "shard-9").ok() && h->ListJobs().empty();
  });
  EXPECT_EQ(others.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "blocked behind the insert";
  insert.Open();
  EXPECT_TRUE(others.get());
  EXPECT_FALSE(submitting.get().empty());
  EXPECT_EQ(h->ListJobs().size(), 1u);
}

TEST(CoordinatorConcurrencyTest, StatusIsPersistedOffTheLock) {
  Gate persist;
  CoordinatorOptions o = Options();
  o.before_persist = [&](const std::string&) { persist.Arrive(); };
  auto c = Make(o);
  const std::string job = Submit(*c);  // the persister now hangs in its write
  absl::Cleanup open = [&] { persist.Open(); };
  ASSERT_TRUE(persist.AwaitReached());
  auto done = std::async(std::launch::async, [&] {
    auto w = Join(*c, MEMBER_ROLE_WORKER, "worker-x");
    return w.ok() && c->GetJob(job).ok() && !c->ListJobs().empty();
  });
  EXPECT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "blocked behind the store";
  persist.Open();
  EXPECT_TRUE(done.get());
}

TEST(CoordinatorLimitsTest, PathsOutsideTheRootAreRefused) {
  auto c = Make();
  for (const std::string& dir : {std::string("/etc"), ::testing::TempDir() + "/../elsewhere", std::string("a\0b", 3)}) {
    SubmitJobRequest req;
    req.set_spec_yaml(kSpec);
    req.set_output_dir(dir);
    EXPECT_EQ(c->SubmitJob(req).status().code(), absl::StatusCode::kInvalidArgument) << dir;
    SubmitJobRequest resume;
    resume.set_resume_from(dir);
    EXPECT_EQ(c->SubmitJob(resume).status().code(), absl::StatusCode::kInvalidArgument) << dir;
  }
  // A symbolic link inside the root that leads out of it.
  const std::string link = ::testing::TempDir() + "/escape-link";
  std::error_code ec;
  std::filesystem::remove(link, ec);
  std::filesystem::create_directory_symlink("/usr", link);
  SubmitJobRequest req;
  req.set_spec_yaml(kSpec);
  req.set_output_dir(link + "/x");
  EXPECT_EQ(c->SubmitJob(req).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->ListJobs().empty());
}

// A checkpoint's paths are the coordinator's (else a member could have
// worker 0 write its table anywhere worker 0 may), its answers worker 0's.
TEST(CoordinatorHostileTest, ACheckpointsKeysAreTheCoordinatorsAndWorker0s) {
  auto c = Make();
  const std::string shard = Join(*c, MEMBER_ROLE_SHARD, "shard-0")->member_id();
  Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  Join(*c, MEMBER_ROLE_WORKER, "worker-1");
  const std::string job = Submit(*c, "name: t\nworkers: 2\nshards: 1\ndata: {format: synthetic}\n");
  std::string rank[2];
  const JobStatus st = c->GetJob(job).value();
  for (const MemberStatus& m : st.members()) {
    if (m.role() == MEMBER_ROLE_WORKER) rank[m.rank()] = m.member_id();
  }
  ASSERT_FALSE(rank[0].empty());
  ASSERT_FALSE(rank[1].empty());
  for (const std::string& key : {CheckpointPathKey(7), CheckpointBuffersPathKey(7)}) {
    for (const std::string& m : {rank[0], rank[1], shard}) {
      EXPECT_EQ(c->KvSet(m, job, 1, key, "/etc/x").code(), absl::StatusCode::kPermissionDenied) << key;
      EXPECT_EQ(c->KvAdd(m, job, 1, key, 1).status().code(), absl::StatusCode::kPermissionDenied) << key;
    }
  }
  for (const std::string& key : {CheckpointSavedKey(7), CheckpointBuffersSavedKey(7)}) {
    EXPECT_EQ(c->KvSet(rank[1], job, 1, key, "x").code(), absl::StatusCode::kPermissionDenied) << key;
    EXPECT_EQ(c->KvSet(shard, job, 1, key, "x").code(), absl::StatusCode::kPermissionDenied) << key;
    EXPECT_TRUE(c->KvSet(rank[0], job, 1, key, "x").ok()) << key;
  }
  // A pipelined job's stage s is answered by worker s alone; a key naming
  // no stage a job can have, by nobody.
  EXPECT_TRUE(c->KvSet(rank[1], job, 1, CheckpointSavedKey(7, 1), "x").ok());
  EXPECT_EQ(c->KvSet(rank[0], job, 1, CheckpointSavedKey(7, 1), "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(c->KvSet(shard, job, 1, CheckpointSavedKey(7, 1), "x").code(), absl::StatusCode::kPermissionDenied);
  for (const std::string& m : {rank[0], rank[1]}) {
    EXPECT_EQ(c->KvSet(m, job, 1, "ckpt/7/stage-01/saved", "x").code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_TRUE(c->KvSet(rank[1], job, 1, PauseStepKey(7), "40").ok());  // any worker may pick the step
}

}  // namespace
}  // namespace pstrain
