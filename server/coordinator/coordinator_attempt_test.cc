// Results that come back after a job moved on to another attempt (issue
// 30, "Coordinator restarts never strand a job"), and a parameter-server job
// whose last unfinished rank is vacated; the fixture is
// coordinator_restart_testing.h.
#include <gtest/gtest.h>

#include <future>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/pause_keys.h"
#include "server/coordinator/coordinator_restart_testing.h"

namespace pstrain {
namespace {

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
}  // namespace
}  // namespace pstrain
