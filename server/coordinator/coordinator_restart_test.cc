// A coordinator killed at the points where its memory and its store part
// ways, and results that come back after the job moved on to another
// attempt (issue 30, "Coordinator restarts never strand a job").
//
// "Killed" here: while the coordinator under test is held at the point (a
// fault-injection hook or a wait of its own), the test copies its SQLite
// database and WAL -- what a SIGKILL at that instant leaves on disk, as
// SQLite's recovery of a WAL whose writer died reads it -- and starts a new
// coordinator over the copy; Create() is the code a real restart runs. The
// held one is then ended apart from it.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>

#include <grpcpp/grpcpp.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "checkpoint/pause_keys.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "proto/parameter.grpc.pb.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_testing.h"

namespace pstrain {
namespace {

const char kAllReduce1[] = "name: t\nmode: allreduce\nworkers: 1\ndata: {format: synthetic}\n";
const char kAllReduce2[] = "name: t\nmode: allreduce\nworkers: 2\nmax_restarts: 3\ndata: {format: synthetic}\n";

// A gate a hook waits at: the test learns it was reached, then opens it.
class Gate {
 public:
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  bool AwaitReached() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return reached_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false;
};

class CoordinatorRestartTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options() {
    CoordinatorOptions o = TestCoordinatorOptions();
    o.clock = &clock_;  // leases move only when the test says
    return o;
  }
  // A fresh database file.
  std::string Db(const std::string& name) {
    const std::string db = ::testing::TempDir() + "/" + name + ".db";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
    return db;
  }
  std::unique_ptr<Coordinator> Make(const std::string& db, CoordinatorOptions o) { return MakeTestCoordinator(o, db); }
  // What a SIGKILL now leaves on disk: the database and its WAL, copied
  // (SQLite recovers the committed transactions from the WAL when the copy
  // is opened; a torn last frame is dropped, as after a crash).
  std::string CrashImage(const std::string& db) {
    const std::string image = db + ".crash";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(image + suffix);
    std::filesystem::copy_file(db, image);
    if (std::filesystem::exists(db + "-wal")) std::filesystem::copy_file(db + "-wal", image + "-wal");
    return image;
  }
  // The job's status as the store holds it now.
  JobStatus Stored(const std::string& db, const std::string& job) {
    auto store = JobStore::Open(db);
    EXPECT_TRUE(store.ok()) << store.status();
    auto stored = (*store)->Get(job);
    EXPECT_TRUE(stored.ok()) << stored.status();
    return stored.ok() ? stored->status : JobStatus();
  }
  // Polls the store until the job is in `state` (the persister writes
  // behind the coordinator's back).
  bool AwaitStored(const std::string& db, const std::string& job, JobState state) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (Stored(db, job).state() == state) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  std::string Join(Coordinator& c, MemberRole role, const std::string& name, const std::string& job = "",
                   uint64_t attempt = 0) {
    RegisterRequest r;
    r.set_role(role);
    r.set_name(name);
    if (role == MEMBER_ROLE_SHARD) r.set_address("127.0.0.1:1" + name.substr(name.size() - 1));
    r.set_job_id(job);
    r.set_attempt(attempt);
    // As a member does: it names the id it had (its credential for its seat).
    r.set_previous_member_id(ids_[name]);
    auto resp = c.Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return ids_[name] = resp.ok() ? resp->member_id() : "";
  }
  std::map<std::string, std::string> ids_;  // member name -> the id Join got last
  absl::Status Event(Coordinator& c, const std::string& member, const std::string& job, uint64_t attempt,
                     const std::string& json) {
    ReportProgressRequest r;
    r.set_member_id(member);
    r.set_job_id(job);
    r.set_attempt(attempt);
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, r.mutable_event()).ok()) << json;
    return c.ReportProgress(r).status();
  }
  HeartbeatResponse Beat(Coordinator& c, const std::string& member, const std::string& job = "",
                         uint64_t attempt = 0) {
    HeartbeatRequest hb;
    hb.set_member_id(member);
    hb.set_running_job_id(job);
    hb.set_running_attempt(attempt);
    auto r = c.Heartbeat(hb);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.value_or(HeartbeatResponse());
  }
  // The pause id a worker running `attempt` is asked to pause for; -1 if
  // none within 30 s.
  int64_t AwaitPause(Coordinator& c, const std::string& member, const std::string& job, uint64_t attempt) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      HeartbeatResponse r = Beat(c, member, job, attempt);
      if (r.pause()) return r.pause_id();
      absl::SleepFor(absl::Milliseconds(2));
    }
    return -1;
  }
  // Waits until the worker's assignment for the job is out (the attempt is
  // durable and restored); its attempt, 0 if none within 30 s.
  uint64_t AwaitAssignment(Coordinator& c, const std::string& member) {
    auto a = c.GetAssignment(member, absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() && !a->job_id().empty() ? a->attempt() : 0;
  }
  // Workers that run nothing say so: a requeued attempt's are freed.
  void BeatIdle(Coordinator& c, std::initializer_list<std::string> members) {
    for (const std::string& m : members) Beat(c, m);
  }
  // A checkpoint of an all-reduce job at `step` to resume from.
  std::string WriteCheckpointAt(int64_t step, const std::string& spec_yaml, int workers) {
    std::vector<CheckpointManifest::Worker> positions;
    for (int r = 0; r < workers; ++r) positions.push_back({r, step, 1, 0, 0});
    return WriteFakeCheckpoint(::testing::TempDir() + "/restart-ckpt-" + std::to_string(step), step, spec_yaml,
                               positions);
  }
  std::string Resume(Coordinator& c, const std::string& dir) {
    auto id = SubmitResume(c, dir);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }
  int Conditions(const JobStatus& st, const std::string& reason) {
    int n = 0;
    for (const auto& cond : st.conditions()) n += cond.reason() == reason;
    return n;
  }

  ManualClock clock_;
};

// The first coordinator's life: an all-reduce job of one worker in a
// checkpoint, the coordinator waiting for worker 0 to write the model, its
// CHECKPOINTING state on disk; killed there (image_). The first coordinator
// is ended in TearDown.
class KilledInACheckpointTest : public CoordinatorRestartTest {
 protected:
  void SetUp() override {
    db_ = Db("killed-in-checkpoint");
    first_ = Make(db_, Options());
    ASSERT_NE(first_, nullptr);
    w0_ = Join(*first_, MEMBER_ROLE_WORKER, "worker-0");
    job_ = SubmitSpec(*first_, kAllReduce1);
    ASSERT_EQ(AwaitAssignment(*first_, w0_), 1u);
    ASSERT_TRUE(Event(*first_, w0_, job_, 1,
                      R"({"rank": 0, "plan": {"chunk_bytes": 1024, "params": [{"name": "w", "shape": [2], "dtype": 1}]}})")
                    .ok());
    checkpoint_ = std::async(std::launch::async, [this] { return first_->Checkpoint(job_).status(); });
    pause_id_ = AwaitPause(*first_, w0_, job_, 1);
    ASSERT_GT(pause_id_, 0);
    ASSERT_TRUE(Event(*first_, w0_, job_, 1,
                      absl::StrCat(R"({"rank": 0, "paused": {"step": 10, "pause_id": )", pause_id_, "}}"))
                    .ok());
    // The coordinator has asked worker 0 to write the model: mid-checkpoint.
    auto path = first_->KvGet(w0_, job_, 1, CheckpointPathKey(pause_id_), absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(path.ok()) << path.status();
    ASSERT_TRUE(AwaitStored(db_, job_, CHECKPOINTING));
    image_ = CrashImage(db_);
  }
  void TearDown() override {
    if (first_ != nullptr) {
      (void)first_->CancelJob(job_);  // ends its checkpoint
      if (checkpoint_.valid()) {
        EXPECT_FALSE(checkpoint_.get().ok());
      }
      first_->Shutdown();
    }
  }

  std::string db_, image_, job_, w0_;
  std::unique_ptr<Coordinator> first_;
  std::future<absl::Status> checkpoint_;
  int64_t pause_id_ = -1;
};

// Killed mid-checkpoint, the job was left CHECKPOINTING for good: the
// checkpoint's own state lived in memory, a new checkpoint refused a job not
// RUNNING, and it could never succeed. On load it runs again, the
// checkpoint abandoned (its directory never committed).
TEST_F(KilledInACheckpointTest, TheJobRunsAgainAfterTheRestart) {
  auto second = Make(image_, Options());
  ASSERT_NE(second, nullptr);
  auto st = second->GetJob(job_);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), RUNNING);
  EXPECT_EQ(st->conditions().rbegin()->reason(), "CheckpointAbandoned");
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/out/" + job_ + "/ckpt-10"));
  // Its worker comes back to the same attempt, is not asked to pause, and
  // finishes: the job succeeds.
  const std::string w0 = Join(*second, MEMBER_ROLE_WORKER, "worker-0", job_, 1);
  EXPECT_FALSE(Beat(*second, w0, job_, 1).pause());
  ASSERT_TRUE(Event(*second, w0, job_, 1, R"({"rank": 0, "done": {}})").ok());
  EXPECT_EQ(second->GetJob(job_)->state(), SUCCEEDED);
}

// The workers remember the pause they served last and ignore a request
// with the same id. A restarted coordinator counted pause ids from 1 again:
// its first checkpoint's pause was ignored (a 120 s stall, then failure).
TEST_F(KilledInACheckpointTest, PauseIdsAreNotReusedAfterTheRestart) {
  auto second = Make(image_, Options());
  ASSERT_NE(second, nullptr);
  const std::string w0 = Join(*second, MEMBER_ROLE_WORKER, "worker-0", job_, 1);
  std::future<absl::Status> checkpoint;
  absl::Cleanup end = [&] {
    (void)second->CancelJob(job_);
    if (checkpoint.valid()) checkpoint.wait();
  };
  checkpoint = std::async(std::launch::async, [&] { return second->Checkpoint(job_).status(); });
  const int64_t again = AwaitPause(*second, w0, job_, 1);
  ASSERT_GT(again, 0) << "no pause: " << second->GetJob(job_)->DebugString();
  EXPECT_NE(again, pause_id_) << "the worker that served pause " << pause_id_ << " would ignore this one";
}

// Start() gave a job a new attempt in memory and the persister wrote it
// later; a member told of it in between, and a SIGKILL then, had the
// restarted coordinator hand the same attempt number to the job's next run,
// which the old run's members passed as their own. Nobody learns an attempt
// before the store holds it.
TEST_F(CoordinatorRestartTest, AnAttemptIsOnDiskBeforeAnyMemberLearnsIt) {
  const std::string db = Db("attempt-durable");
  Gate persist;
  bool held = false;
  CoordinatorOptions o = Options();
  o.before_persist = [&](const std::string&) {
    if (!std::exchange(held, true)) persist.Arrive();  // the first write: the new attempt's
  };
  auto first = Make(db, o);
  ASSERT_NE(first, nullptr);
  absl::Cleanup open = [&] { persist.Open(); };
  const std::string w0 = Join(*first, MEMBER_ROLE_WORKER, "worker-0");
  const std::string job = SubmitSpec(*first, kAllReduce1);
  ASSERT_EQ(first->GetJob(job)->attempt(), 1u);  // scheduled, in memory
  ASSERT_TRUE(persist.AwaitReached());
  // The store still says attempt 0: that is what a restart now would load.
  EXPECT_EQ(Stored(db, job).attempt(), 0u);
  auto a = first->GetAssignment(w0, absl::Now() + absl::Milliseconds(300));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->job_id(), "") << "assigned attempt " << a->attempt() << " before the store holds it";
  EXPECT_EQ(Beat(*first, w0).attempt(), 0u);
  // Killed here, the restarted coordinator runs the job as attempt 1 on
  // whoever is free -- which is safe because nobody heard of the first 1.
  {
    auto second = Make(CrashImage(db), Options());
    ASSERT_NE(second, nullptr);
    EXPECT_EQ(second->GetJob(job)->attempt(), 0u);
    const std::string w9 = Join(*second, MEMBER_ROLE_WORKER, "worker-9");
    EXPECT_EQ(AwaitAssignment(*second, w9), 1u);
  }
  // Once written, the first coordinator hands it out.
  persist.Open();
  EXPECT_EQ(AwaitAssignment(*first, w0), 1u);
  EXPECT_EQ(Stored(db, job).attempt(), 1u);
}

// The job of these tests: all-reduce, 2 workers, resumed from a checkpoint
// (so it can restart), its workers joined.
class LateResultTest : public CoordinatorRestartTest {
 protected:
  void Start(CoordinatorOptions o) {
    dir_ = WriteCheckpointAt(120, kAllReduce2, 2);
    c_ = Make(":memory:", o);
    Join(*c_, MEMBER_ROLE_WORKER, "worker-0");
    Join(*c_, MEMBER_ROLE_WORKER, "worker-1");
    job_ = Resume(*c_, dir_);
    const std::vector<std::string> w = WorkersByRank(*c_, job_);
    ASSERT_EQ(w.size(), 2u);
    w0_ = w[0];
    w1_ = w[1];
  }
  // Attempt `attempt` fails (a retryable error from worker 1), the workers
  // stop, and the job is scheduled again as attempt + 1.
  void Restart(uint64_t attempt) {
    ASSERT_TRUE(Event(*c_, w1_, job_, attempt, R"({"rank": 1, "error": {"message": "a peer left", "retryable": true}})")
                    .ok());
    ASSERT_EQ(c_->GetJob(job_)->state(), PENDING);
    BeatIdle(*c_, {w0_, w1_});
    ASSERT_EQ(c_->GetJob(job_)->attempt(), attempt + 1);
  }

  std::string dir_, job_, w0_, w1_;
  std::unique_ptr<Coordinator> c_;
};

// A restore's LoadTable calls may take minutes; their result used to be
// applied to whatever attempt the job was on by then: a late result of
// attempt 1 ended attempt 2's restore (its workers started before their
// shards were loaded) or, failed, restarted it.
TEST_F(LateResultTest, ALateRestoreResultLeavesTheNextAttemptAlone) {
  std::map<uint64_t, Gate> loaded;  // by attempt
  CoordinatorOptions o = Options();
  o.on_restore_loaded = [&](const std::string&, uint64_t attempt) { loaded.at(attempt).Arrive(); };
  loaded[1], loaded[2];  // made before any thread looks
  absl::Cleanup open = [&] {
    for (auto& [attempt, gate] : loaded) gate.Open();
  };
  Start(o);
  ASSERT_TRUE(loaded[1].AwaitReached());  // attempt 1's result is in, not yet applied
  Restart(1);
  ASSERT_TRUE(loaded[2].AwaitReached());
  // Attempt 1's result comes back while attempt 2 restores, then attempt 2's.
  loaded[1].Open();
  loaded[2].Open();
  c_->Shutdown();  // joins the restores
  const JobStatus st = *c_->GetJob(job_);
  EXPECT_EQ(st.state(), RUNNING);
  EXPECT_EQ(st.attempt(), 2u);
  EXPECT_EQ(Conditions(st, "Restored"), 1) << "attempt 1's late result was applied to attempt 2:\n"
                                           << st.DebugString();
}

// A checkpoint's shard writes may take minutes; their end used to be
// applied to whatever attempt the job was on by then: a late failure of
// attempt 1's checkpoint ended attempt 2's checkpoint in the middle (its
// workers resumed while the model was being written).
TEST_F(LateResultTest, ALateCheckpointResultLeavesTheNextAttemptsCheckpointAlone) {
  Gate written;
  bool held = false;
  CoordinatorOptions o = Options();
  o.on_checkpoint_written = [&](const std::string&) {
    if (!std::exchange(held, true)) written.Arrive();
  };
  std::future<absl::Status> first, second;
  absl::Cleanup end = [&] {
    written.Open();
    if (c_ != nullptr) (void)c_->CancelJob(job_);
  };
  Start(o);
  ASSERT_EQ(AwaitAssignment(*c_, w0_), 1u);  // restored
  first = std::async(std::launch::async, [&] { return c_->Checkpoint(job_).status(); });
  const int64_t pause1 = AwaitPause(*c_, w0_, job_, 1);
  ASSERT_GT(pause1, 0);
  for (int rank : {0, 1}) {
    ASSERT_TRUE(Event(*c_, rank == 0 ? w0_ : w1_, job_, 1,
                      absl::StrCat(R"({"rank": )", rank, R"(, "paused": {"step": 130, "pause_id": )", pause1, "}}"))
                    .ok());
  }
  ASSERT_TRUE(c_->KvGet(w0_, job_, 1, CheckpointPathKey(pause1), absl::Now() + absl::Seconds(30)).ok());
  // Attempt 1 fails while worker 0 writes: its write fails, and the result
  // is held back until attempt 2 is in a checkpoint of its own.
  Restart(1);
  ASSERT_TRUE(written.AwaitReached());
  ASSERT_EQ(AwaitAssignment(*c_, w0_), 2u);
  second = std::async(std::launch::async, [&] { return c_->Checkpoint(job_).status(); });
  const int64_t pause2 = AwaitPause(*c_, w0_, job_, 2);
  ASSERT_GT(pause2, 0);
  ASSERT_EQ(c_->GetJob(job_)->state(), CHECKPOINTING);
  written.Open();
  EXPECT_FALSE(first.get().ok());
  const JobStatus st = *c_->GetJob(job_);
  EXPECT_EQ(st.state(), CHECKPOINTING) << st.DebugString();
  EXPECT_EQ(Conditions(st, "CheckpointFailed"), 0) << st.DebugString();
  HeartbeatResponse beat = Beat(*c_, w0_, job_, 2);
  EXPECT_TRUE(beat.pause());
  EXPECT_EQ(beat.pause_id(), pause2);
}

// A checkpoint waiting for the workers to pause used to wait on when the
// job was requeued and restarted, for up to 120 s, and then end whatever
// checkpoint the new attempt had. It gives up as soon as its attempt ends.
TEST_F(LateResultTest, APauseOfAnEndedAttemptGivesUp) {
  std::future<absl::Status> first;
  absl::Cleanup end = [&] {
    if (c_ != nullptr) (void)c_->CancelJob(job_);
  };
  Start(Options());
  ASSERT_EQ(AwaitAssignment(*c_, w0_), 1u);
  first = std::async(std::launch::async, [&] { return c_->Checkpoint(job_).status(); });
  ASSERT_GT(AwaitPause(*c_, w0_, job_, 1), 0);
  Restart(1);
  ASSERT_EQ(first.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "still waiting for the workers of an ended attempt";
  EXPECT_EQ(first.get().code(), absl::StatusCode::kAborted);
  ASSERT_EQ(AwaitAssignment(*c_, w0_), 2u);
  const JobStatus st = *c_->GetJob(job_);
  EXPECT_EQ(st.state(), RUNNING);
  EXPECT_EQ(Conditions(st, "CheckpointFailed"), 0);
}

// A parameter-server job whose last unfinished rank is vacated (its worker
// killed after its last push, no spare, min_workers below workers) used to
// run forever: nothing checked whether the job was done. Lost, leaving or
// scaled away, the job then succeeds.
class LastRankVacatedTest : public CoordinatorRestartTest {
 protected:
  void SetUp() override {
    c_ = Make(":memory:", Options());
    s0_ = Join(*c_, MEMBER_ROLE_SHARD, "shard-0");
    for (int r = 0; r < 3; ++r) w_.push_back(Join(*c_, MEMBER_ROLE_WORKER, absl::StrCat("worker-", r)));
    job_ = SubmitSpec(*c_, "name: t\nworkers: 3\nmin_workers: 1\nshards: 1\ndata: {format: synthetic}\n");
    ASSERT_EQ(c_->GetJob(job_)->state(), RUNNING);
    w_ = WorkersByRank(*c_, job_);
    ASSERT_EQ(w_.size(), 3u);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(Event(*c_, w_[r], job_, 1, absl::StrCat(R"({"rank": )", r, R"(, "done": {"samples": 10}})")).ok());
    }
    ASSERT_EQ(c_->GetJob(job_)->state(), RUNNING);  // rank 2 trains on
  }
  void ExpectSucceeded() {
    const JobStatus st = *c_->GetJob(job_);
    EXPECT_EQ(st.state(), SUCCEEDED) << st.DebugString();
    EXPECT_NE(st.conditions().rbegin()->message().find("2 of 3 ranks finished"), std::string::npos)
        << st.conditions().rbegin()->message();
  }

  std::unique_ptr<Coordinator> c_;
  std::string s0_, job_;
  std::vector<std::string> w_;
};

TEST_F(LastRankVacatedTest, Lost) {
  for (int i = 0; i < 6; ++i) {  // rank 2's worker is silent
    clock_.Advance(absl::Milliseconds(40));
    Beat(*c_, s0_);
    for (int r = 0; r < 2; ++r) Beat(*c_, w_[r], job_, 1);
    c_->Tick();
  }
  ExpectSucceeded();
}

TEST_F(LastRankVacatedTest, ShuttingDown) {
  ASSERT_TRUE(Event(*c_, w_[2], job_, 1, R"({"rank": 2, "draining": {"role": "MEMBER_ROLE_WORKER"}})").ok());
  ExpectSucceeded();
}

TEST_F(LastRankVacatedTest, ScaledAway) {
  ASSERT_TRUE(c_->ScaleJob(job_, 2).ok());
  ExpectSucceeded();
}

// A shard that only answers SetWorkers: held (never answered) while
// `hold` is set, recorded and answered once it is not.
class SeatsShard final : public ParameterService::CallbackService {
 public:
  grpc::ServerUnaryReactor* SetWorkers(grpc::CallbackServerContext* context, const SetWorkersRequest* request,
                                       SetWorkersResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::lock_guard<std::mutex> lock(mu_);
    if (hold_) {
      held_.push_back(reactor);  // the coordinator dies before it arrives
      return reactor;
    }
    for (int r = 0; r < request->seats_size(); ++r) response->add_last_steps(7);
    response->set_min_version(8);
    received_.push_back(*request);
    cv_.notify_all();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  void Hold(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = hold;
  }
  size_t Held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  void FailHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* r : held_) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "shard gone"));
    held_.clear();
  }
  // The first request answered; nullopt if none within 30 s.
  std::optional<SetWorkersRequest> AwaitReceived() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return !received_.empty(); })) return std::nullopt;
    return received_.front();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  std::vector<grpc::ServerUnaryReactor*> held_;
  std::vector<SetWorkersRequest> received_;
};

// The shards learn who holds each rank (SetWorkers) from a coordinator
// that keeps which ranks it awaits in memory. One killed before its
// SetWorkers arrived left the shards with the old view for good: a
// vacated rank still active held every SYNC step back. After a restart the
// view is sent again, rank 0 (vacant, awaited) active, the other vacant
// rank not.
TEST_F(CoordinatorRestartTest, SeatsAreSentAgainAfterARestart) {
  SeatsShard shard;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&shard);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  absl::Cleanup stop = [&] {
    shard.FailHeld();
    server->Shutdown();
  };
  const std::string db = Db("seats");
  auto first = Make(db, Options());
  ASSERT_NE(first, nullptr);
  RegisterRequest r;
  r.set_role(MEMBER_ROLE_SHARD);
  r.set_name("shard-0");
  r.set_address(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(first->Register(r).ok());
  std::vector<std::string> w;
  for (int rank = 0; rank < 3; ++rank) w.push_back(Join(*first, MEMBER_ROLE_WORKER, absl::StrCat("worker-", rank)));
  const std::string job = SubmitSpec(
      *first, "name: t\nworkers: 3\nmin_workers: 1\nreplacement_timeout_s: 60\nshards: 1\ndata: {format: synthetic}\n");
  w = WorkersByRank(*first, job);
  ASSERT_EQ(w.size(), 3u);
  ASSERT_EQ(AwaitAssignment(*first, w[1]), 1u);
  shard.Hold(true);
  // Rank 0 leaves (awaited: it evaluates and writes the weights), then rank
  // 2 (not awaited: one worker is enough). The shards hear of neither.
  for (int rank : {0, 2}) {
    ASSERT_TRUE(Event(*first, w[rank], job, 1,
                      absl::StrCat(R"({"rank": )", rank, R"(, "draining": {"role": "MEMBER_ROLE_WORKER"}})"))
                    .ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Stored(db, job).vacant_ranks_size() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(Stored(db, job).vacant_ranks_size(), 2);
  while (shard.Held() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(shard.Held(), 1u);
  const std::string image = CrashImage(db);
  shard.Hold(false);
  auto second = Make(image, Options());
  ASSERT_NE(second, nullptr);
  std::optional<SetWorkersRequest> sent = shard.AwaitReceived();
  ASSERT_TRUE(sent.has_value()) << "the restarted coordinator never told the shards";
  EXPECT_EQ(sent->job(), job);
  EXPECT_EQ(sent->attempt(), 1u);
  ASSERT_EQ(sent->seats_size(), 3);
  EXPECT_TRUE(sent->seats(0).active()) << "rank 0 is awaited";
  EXPECT_TRUE(sent->seats(1).active());
  EXPECT_FALSE(sent->seats(2).active()) << "rank 2 is vacant";
  EXPECT_EQ(second->GetJob(job)->state(), RUNNING);
  shard.FailHeld();
  second->Shutdown();
  first->Shutdown();
}

}  // namespace
}  // namespace pstrain
