// Checkpoints, restores, drains and restarts with real processes: the
// coordinator's checkpoint protocol end to end, in both modes.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "tests/control_plane_testing.h"

namespace pstrain {
namespace {

// Checkpoint a 2-shard job, kill every process, start a fresh cluster with 3
// shards, restore: the job finishes with the accuracy of an uninterrupted
// run (SYNC with 2 workers is deterministic, so it is the same up to float
// rounding), and the 2-shard checkpoint was re-partitioned onto 3 shards.
TEST_F(ControlPlaneTest, CheckpointKillEverythingRestoreOntoThreeShardsAndFinish) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  }
  StartPool(1, 0, /*first_shard=*/1);  // shard-1 beside the fixture's shard-0
  const std::string spec = dir_ + "/fmnist.yaml";
  const std::string yaml =
      "name: fmnist\nmodel: mlp\ndata: {format: idx, limit_train: 16000, limit_test: 2000}\n"
      "consistency: sync\nworkers: 2\nshards: 2\nepochs: 2\nbatch_size: 32\nlog_every_steps: 5\n"
      "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}\n";
  ASSERT_TRUE(WriteFileAtomically(spec, yaml).ok());
  // The uninterrupted run.
  const std::string whole = Submit(spec);
  CliResult a = Cli({"watch", whole});
  ASSERT_EQ(a.code, 0) << a.out;
  const double acc_whole = FinalAccuracy(a.out);
  ASSERT_GT(acc_whole, 0.5) << a.out;

  // The interrupted one: checkpoint mid-run, then kill everything.
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 60, absl::Seconds(120)));
  CliResult ck = Cli({"checkpoint", job});
  ASSERT_EQ(ck.code, 0) << ck.out;
  const std::string ckpt = ck.out.substr(0, ck.out.find(' '));
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/manifest.json")) << ck.out;
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/shard-1.bin"));
  KillEverything();

  // A fresh cluster with 3 shards; the same job store.
  StartCoordinator(0);
  StartPool(3, 2);
  const std::string spec3 = dir_ + "/fmnist3.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec3, absl::StrReplaceAll(yaml, {{"shards: 2", "shards: 3"}})).ok());
  CliResult restored = Cli({"restore", "--from", ckpt, "--spec", spec3, "--output_dir", dir_ + "/restored"});
  ASSERT_EQ(restored.code, 0) << restored.out;
  const std::string resumed = restored.out.substr(0, restored.out.find('\n'));
  CliResult b = Cli({"watch", resumed});
  ASSERT_EQ(b.code, 0) << b.out << Cli({"status", resumed}).out;
  const double acc_resumed = FinalAccuracy(b.out);
  std::printf("uninterrupted accuracy %.4f, checkpointed + restored onto 3 shards %.4f\n", acc_whole, acc_resumed);
  EXPECT_NEAR(acc_resumed, acc_whole, 0.005) << a.out << "\n---\n" << b.out;
  CliResult st = Cli({"status", resumed, "-o", "json"});
  EXPECT_NE(st.out.find("\"reason\": \"Restored\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("onto 3 shard(s)"), std::string::npos) << st.out;
}

// Under SYNC every step needs all workers, so a checkpoint must pause them
// before the same step; taken again and again, it never deadlocks.
TEST_F(ControlPlaneTest, RepeatedCheckpointsOfASyncJobSucceed) {
  const std::string spec = dir_ + "/sync.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec, "name: s\nmodel: mlp\nconsistency: sync\nworkers: 2\nshards: 1\n"
                                        "data: {format: synthetic, synthetic_train: 60000}\nepochs: 100\n"
                                        "batch_size: 16\nlog_every_steps: 5\n").ok());
  const std::string job = Submit(spec);
  WaitForState(job, "RUNNING", absl::Seconds(60));
  for (int i = 0; i < 6; ++i) {
    absl::SleepFor(absl::Milliseconds(150 * (i % 3)));
    const absl::Time start = absl::Now();
    CliResult ck = Cli({"checkpoint", job}, absl::Seconds(60));
    ASSERT_EQ(ck.code, 0) << "checkpoint " << i << ": " << ck.out << Cli({"status", job}).out;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << ck.out;
  }
  EXPECT_EQ(State(job), "RUNNING");
  EXPECT_EQ(Cli({"cancel", job}).code, 0);
}

// SIGTERM on a worker (a pod being deleted) drains it: the job is
// checkpointed, the worker exits 0, the job waits for a replacement and
// resumes from that checkpoint on it. (That a restored job trains to its
// end is CheckpointKillEverything...'s and AllReduceCheckpoint...'s.)
TEST_F(ControlPlaneTest, SigtermDrainsAWorkerAndTheJobResumesOnAReplacement) {
  const std::string job = Submit(DrainSpec());
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 40, absl::Seconds(60)));
  ChildProcess& leaving = *pool_[2];  // worker-1
  leaving.Signal(SIGTERM);
  EXPECT_EQ(leaving.Wait(absl::Seconds(60)), 0) << ReadFile(dir_ + "/worker-1.log").value_or("");
  WaitForState(job, "PENDING", absl::Seconds(30));
  CliResult st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("\"reason\": \"MemberLeaving\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("\"reason\": \"CheckpointSaved\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("\"reason\": \"MemberLeft\""), std::string::npos) << st.out;
  // A replacement joins; the job resumes from the checkpoint and trains on.
  pool_.push_back(Start("worker-2", {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=worker-2"}));
  EXPECT_GE(WaitUntilRestoredAndTraining(job), 40);
  EXPECT_NE(Cli({"status", job}).out.find("worker-2"), std::string::npos);
  EXPECT_EQ(Cli({"cancel", job}).code, 0);
}

// SIGTERM on the shard of a running job: the job is checkpointed while the
// shard still serves, requeued, and the shard exits 0; the job resumes on
// a replacement shard.
TEST_F(ControlPlaneTest, SigtermOnAShardCheckpointsTheJobBeforeItGoes) {
  const std::string job = Submit(DrainSpec());
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 40));
  ChildProcess& shard = *pool_[0];  // shard-0
  shard.Signal(SIGTERM);
  EXPECT_EQ(shard.Wait(absl::Seconds(60)), 0) << ReadFile(dir_ + "/shard-0.log").value_or("");
  CliResult st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("shard 0 is shutting down"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("\"reason\": \"CheckpointSaved\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("\"reason\": \"MemberLeft\""), std::string::npos) << st.out;
  StartPool(1, 0, /*first_shard=*/9);
  EXPECT_GE(WaitUntilRestoredAndTraining(job), 40);
  EXPECT_NE(Cli({"status", job}).out.find("shard-9"), std::string::npos);
  EXPECT_EQ(Cli({"cancel", job}).code, 0);
}

// All-reduce jobs in the pool: worker 0 writes the checkpoint in the shards'
// format, so it resumes in all-reduce mode and in ps mode (re-partitioned
// onto the shards) alike.
TEST_F(ControlPlaneTest, AllReduceCheckpointResumesInBothModes) {
  const std::string spec = dir_ + "/ar.yaml";
  const std::string yaml = "name: ar\nmode: allreduce\nmodel: mlp\nworkers: 2\n"
                           "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 512}\n"
                           "epochs: 1000\nbatch_size: 16\nlog_every_steps: 5\n";
  ASSERT_TRUE(WriteFileAtomically(spec, yaml).ok());
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 30, absl::Seconds(60)));
  CliResult out = Cli({"checkpoint", job});
  ASSERT_EQ(out.code, 0) << out.out << Cli({"status", job}).out;
  const Checkpointed ck = ParseCheckpoint(out.out);
  ASSERT_GE(ck.step, 30) << out.out;
  EXPECT_TRUE(std::filesystem::exists(ck.path + "/shard-0.bin"));
  ASSERT_EQ(Cli({"cancel", job}).code, 0);

  // The resumed jobs stop 100 steps past the checkpoint.
  const std::string short_yaml = yaml + "max_steps: " + std::to_string(ck.step + 100) + "\n";
  const std::string ar_spec = dir_ + "/ar-resumed.yaml";
  ASSERT_TRUE(WriteFileAtomically(ar_spec, short_yaml).ok());
  CliResult again = Cli({"restore", "--from", ck.path, "--spec", ar_spec, "--output_dir", dir_ + "/ar2"});
  ASSERT_EQ(again.code, 0) << again.out;
  const std::string resumed = again.out.substr(0, again.out.find('\n'));
  CliResult w = Cli({"watch", resumed});
  EXPECT_EQ(w.code, 0) << w.out << Cli({"status", resumed}).out;
  CliResult st = Cli({"status", resumed, "-o", "json"});
  EXPECT_NE(st.out.find("loaded from " + ck.path + " by the workers"), std::string::npos) << st.out;

  const std::string ps_spec = dir_ + "/ps.yaml";
  ASSERT_TRUE(WriteFileAtomically(ps_spec, absl::StrReplaceAll(short_yaml, {{"mode: allreduce", "mode: ps\nshards: 1\n"
                                                                                                 "consistency: sync"}}))
                  .ok());
  CliResult as_ps = Cli({"restore", "--from", ck.path, "--spec", ps_spec, "--output_dir", dir_ + "/ps"});
  ASSERT_EQ(as_ps.code, 0) << as_ps.out;
  const std::string ps_job = as_ps.out.substr(0, as_ps.out.find('\n'));
  CliResult w2 = Cli({"watch", ps_job});
  EXPECT_EQ(w2.code, 0) << w2.out << Cli({"status", ps_job}).out;
  st = Cli({"status", ps_job, "-o", "json"});
  EXPECT_NE(st.out.find("onto 1 shard(s)"), std::string::npos) << st.out;
}

// Heartbeats of 1 s: the workers agree on a pause step four heartbeats --
// 4 s -- of training ahead.
class SlowHeartbeatTest : public ControlPlaneTest {
 protected:
  void SetUp() override {
    heartbeat_ms_ = 1000;
    ControlPlaneTest::SetUp();
  }
};

// The workers agree on a pause step ahead of where they are; when the job
// ends before it, an all-reduce job has nobody left to write the model: the
// checkpoint is refused and the job still ends (it hung in CHECKPOINTING).
// 400 steps: at 100 to 400 steps/s the job lasts 1 to 4 s, so the request
// lands while it runs, and its pause (4 s of training on) past its end. (A
// 60-step job with 100 ms heartbeats once ended before the request came.)
TEST_F(SlowHeartbeatTest, AllReduceCheckpointPastTheLastStepIsRefusedAndTheJobEnds) {
  const std::string spec = dir_ + "/short.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec, "name: short\nmode: allreduce\nmodel: mlp\nworkers: 2\n"
                                        "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 256}\n"
                                        "epochs: 1\nmax_steps: 400\nbatch_size: 16\nlog_every_steps: 1\n").ok());
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 2));
  CliResult ck = Cli({"checkpoint", job});  // the pause lands 4 s of training (and at least 20 steps) ahead
  if (ck.code != 0) {
    EXPECT_NE(ck.out.find("finished its steps before the checkpoint"), std::string::npos) << ck.out;
  }
  CliResult watch = Cli({"watch", job}, absl::Seconds(60));
  EXPECT_EQ(watch.code, 0) << watch.out << Cli({"status", job}).out;
}

// A rank of a running all-reduce job dies: the other fails fast, and the
// coordinator restarts the job from its last checkpoint once two workers
// are free again; it trains on from there.
TEST_F(ControlPlaneTest, AllReduceJobRestartsFromItsCheckpointWhenARankDies) {
  const std::string spec = dir_ + "/ar.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec, "name: ar\nmode: allreduce\nmodel: mlp\nworkers: 2\n"
                                        "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 512}\n"
                                        "epochs: 1000\nbatch_size: 16\nlog_every_steps: 5\n"
                                        "collective_timeout_s: 10\n").ok());
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 30));
  CliResult out = Cli({"checkpoint", job});
  ASSERT_EQ(out.code, 0) << out.out << Cli({"status", job}).out;
  const Checkpointed ck = ParseCheckpoint(out.out);
  ASSERT_GE(ck.step, 30) << out.out;
  pool_[2]->Signal(SIGKILL);  // worker-1
  pool_[2]->Wait();
  WaitForState(job, "PENDING", absl::Seconds(30));
  CliResult st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("\"reason\": \"WorkerFailed\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("a peer left"), std::string::npos) << st.out;
  pool_.push_back(Start("worker-2", {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=worker-2",
                                     "--gloo_hostname=127.0.0.1"}));
  EXPECT_EQ(WaitUntilRestoredAndTraining(job), ck.step);
  EXPECT_NE(Cli({"status", job}).out.find("restarts:   1"), std::string::npos);
  st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("loaded from " + ck.path + " by the workers"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("worker-2"), std::string::npos) << st.out;
  auto metrics_addr = WaitForAddressFile(dir_ + "/metrics.addr", absl::Seconds(10));
  ASSERT_TRUE(metrics_addr.ok());
  EXPECT_NE(Scrape(*metrics_addr).find("pstrain_job_restarts{job=\"" + job + "\",name=\"ar\"} 1"),
            std::string::npos);
  EXPECT_EQ(Cli({"cancel", job}).code, 0);
}

TEST_F(ControlPlaneTest, CorruptCheckpointIsRefused) {
  const std::string fake = dir_ + "/ckpt-7";
  std::filesystem::create_directories(fake);
  CliResult none = Cli({"restore", "--from", fake});
  EXPECT_EQ(none.code, 4) << none.out;  // no manifest: not a checkpoint
  EXPECT_NE(none.out.find("manifest"), std::string::npos) << none.out;
  ASSERT_TRUE(WriteFileAtomically(fake + "/manifest.json",
                                  "{\"format\": \"pstrain-checkpoint-1\", \"job\": \"j\"}").ok());
  CliResult partial = Cli({"restore", "--from", fake});
  EXPECT_NE(partial.code, 0);
  EXPECT_NE(partial.out.find("incomplete"), std::string::npos) << partial.out;
}

}  // namespace
}  // namespace pstrain
