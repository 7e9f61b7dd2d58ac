// A coordinator killed at the points where its memory and its store part
// ways (issue 30, "Coordinator restarts never strand a job"); the fixture is
// coordinator_restart_testing.h.
//
// "Killed" here: while the coordinator under test is held at the point (a
// fault-injection hook or a wait of its own), the test copies its SQLite
// database and WAL -- what a SIGKILL at that instant leaves on disk, as
// SQLite's recovery of a WAL whose writer died reads it -- and starts a new
// coordinator over the copy; Create() is the code a real restart runs. The
// held one is then ended apart from it.
#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/pause_keys.h"
#include "proto/parameter.grpc.pb.h"
#include "server/coordinator/coordinator_restart_testing.h"

namespace pstrain {
namespace {

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

// A shard that only answers SetWorkers: held (never answered) while
// `hold` is set, recorded and answered once it is not.
class SeatsShard final : public ParameterService::CallbackService {
 public:
  grpc::ServerUnaryReactor* SetWorkers(grpc::CallbackServerContext* context, const SetWorkersRequest* request,
                                       SetWorkersResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    if (hold_) {
      held_.push_back(reactor);  // the coordinator dies before it arrives
      return reactor;
    }
    for (int r = 0; r < request->seats_size(); ++r) response->add_last_steps(7);
    response->set_min_version(8);
    received_.push_back(*request);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  void Hold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  size_t Held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  void FailHeld() {
    absl::MutexLock lock(&mu_);
    for (auto* r : held_) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "shard gone"));
    held_.clear();
  }
  // The first request answered; nullopt if none within 30 s.
  std::optional<SetWorkersRequest> AwaitReceived() {
    absl::MutexLock lock(&mu_);
    auto received = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !received_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&received), absl::Seconds(30))) return std::nullopt;
    return received_.front();
  }

 private:
  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ServerUnaryReactor*> held_ ABSL_GUARDED_BY(mu_);
  std::vector<SetWorkersRequest> received_ ABSL_GUARDED_BY(mu_);
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
