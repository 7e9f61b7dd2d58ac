// Replicated shards with real processes (issue 34, docs/replication.md): a
// parameter-server job with `replicas: 1` loses a shard and goes on without
// a restart, its chunks led by their backups from a new routing generation.
// - SYNC, a shard SIGKILLed mid-run: the job ends with restarts 0 and the
//   very parameters of the same job run without interruption (SYNC and
//   seeded: no update lost, none applied twice);
// - SYNC, a shard SIGSTOPped: the job goes on within seconds (the workers
//   cancel their calls to it once it is declared lost), then it is let go:
//   the old primary is fenced (its backups refuse its forwards) and the job
//   still ends with the uninterrupted run's parameters;
// - SYNC, a shard SIGKILLed, a spare copied in its place, then another
//   shard SIGKILLed: the job survives both, again with the uninterrupted
//   run's parameters;
// - a checkpoint taken after a loss restores onto 2 shards with and without
//   replicas, bit for bit;
// - ASYNC, a shard SIGKILLed: the job keeps training and finishes.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include "absl/strings/str_replace.h"

#include "tests/checkpoint_values.h"
#include "tests/control_plane_testing.h"

namespace pstrain {
namespace {

// Small chunks, so that every shard leads some and backs up others; SGD
// with momentum, so that a promoted backup must hold the optimizer state.
std::string ReplicatedYaml(const std::string& name, const std::string& consistency, int64_t max_steps) {
  return "name: " + name + "\nmodel: mlp\nconsistency: " + consistency +
         "\nworkers: 2\nshards: 3\nreplicas: 1\nchunk_bytes: 16384\n"
         "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 512}\n"
         "epochs: 1\nbatch_size: 16\nlog_every_steps: 5\nmax_steps: " +
         std::to_string(max_steps) + "\noptimizer: {kind: sgd, lr: 0.02, momentum: 0.9}\n";
}

class ReplicationTest : public ControlPlaneTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("replication");
    missed_heartbeats_ = 5;  // a lease of 0.5 s
    StartCoordinator(0);
    StartPool(1, 2);                        // shard-0, worker-0, worker-1
    StartPool(2, 0, /*first_shard=*/1);     // shard-1, shard-2
  }

  static constexpr size_t kShard1 = 3;  // pool_'s order

  std::string WriteSpec(const std::string& name, const std::string& yaml) {
    const std::string path = dir_ + "/" + name + ".yaml";
    EXPECT_TRUE(WriteFileAtomically(path, yaml).ok());
    return path;
  }

  std::string JsonStatus(const std::string& job) { return Cli({"status", job, "-o", "json"}).out; }

  int64_t Step(const std::string& job) {
    std::smatch m;
    const std::string st = JsonStatus(job);
    return std::regex_search(st, m, std::regex("\n \"step\": \"(\\d+)\"")) ? std::stoll(m[1]) : -1;
  }

  // Runs `yaml` to its end and returns the weights worker 0 wrote.
  NamedTensors Uninterrupted(const std::string& yaml) {
    const std::string job = Submit(WriteSpec("whole", yaml));
    CliResult w = Cli({"watch", job});
    EXPECT_EQ(w.code, 0) << w.out << Logs();
    auto weights = ReadWeightsFile(dir_ + "/out/" + job + "/model.pt");
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *weights : NamedTensors();
  }

  // Seconds from now until the job's step is 5 past `before`.
  double SecondsUntilPast(const std::string& job, int64_t before) {
    const absl::Time start = absl::Now();
    while (Step(job) <= before + 5 && absl::Now() < start + absl::Seconds(60)) absl::SleepFor(absl::Milliseconds(20));
    return absl::ToDoubleSeconds(absl::Now() - start);
  }

  void ExpectSucceededWithoutARestart(const std::string& job) {
    CliResult done = Cli({"watch", job});
    EXPECT_EQ(done.code, 0) << done.out << Logs();
    const std::string st = JsonStatus(job);
    EXPECT_EQ(st.find("\"restarts\""), std::string::npos) << "the job restarted: " << st;
    EXPECT_NE(st.find("\"reason\": \"ShardLost\""), std::string::npos) << st;
  }

  // Until the job's transitions hold `reason`; false after `timeout`.
  bool AwaitReason(const std::string& job, const std::string& reason, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (JsonStatus(job).find("\"reason\": \"" + reason + "\"") == std::string::npos) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return true;
  }

  // Every tensor `job` wrote equals `want`'s up to float32 reassociation.
  void ExpectAllClose(const NamedTensors& want, const std::string& job) {
    auto weights = ReadWeightsFile(dir_ + "/out/" + job + "/model.pt");
    ASSERT_TRUE(weights.ok()) << weights.status();
    const NamedTensors& got = *weights;
    ASSERT_EQ(want.size(), got.size());
    for (const auto& [name, w] : want) {
      auto it = got.find(name);
      ASSERT_NE(it, got.end()) << name;
      EXPECT_TRUE(w.allclose(it->second, 1e-5, 1e-6))
          << name << ": largest difference " << w.sub(it->second).abs().max().item().toDouble();
    }
    std::printf("bitwise equal to the uninterrupted run: %s\n", BitwiseDifference(want, got).empty() ? "yes" : "no");
  }
};

TEST_F(ReplicationTest, SyncJobLosesAShardAndEndsLikeAnUninterruptedOne) {
  const std::string yaml = ReplicatedYaml("sync", "sync", 1200);
  const NamedTensors uninterrupted = Uninterrupted(yaml);
  ASSERT_FALSE(uninterrupted.empty());

  const std::string job = Submit(WriteSpec("killed", yaml));
  WaitForStep(job, 100);
  const int64_t before = Step(job);
  pool_[kShard1]->Signal(SIGKILL);
  pool_[kShard1]->Wait();
  std::printf("sync: 5 more steps %.2f s after the SIGKILL (lease 0.5 s)\n", SecondsUntilPast(job, before));
  ExpectSucceededWithoutARestart(job);
  ExpectAllClose(uninterrupted, job);
}

TEST_F(ReplicationTest, AStoppedPrimaryThatComesBackIsFenced) {
  const std::string yaml = ReplicatedYaml("sync", "sync", 1200);
  const NamedTensors uninterrupted = Uninterrupted(yaml);
  ASSERT_FALSE(uninterrupted.empty());

  const std::string job = Submit(WriteSpec("stopped", yaml));
  WaitForStep(job, 100);
  const int64_t before = Step(job);
  pool_[kShard1]->Signal(SIGSTOP);
  // Hung, not dead: its connections stay open and answer nothing. Once it
  // is declared lost the workers cancel their calls to it and go to the new
  // primaries, so the job goes on within about the lease, not after the
  // calls' deadline (the workers' --rpc_timeout_s, 120 s).
  const double seconds = SecondsUntilPast(job, before);
  std::printf("sync, a primary stopped: 5 more steps %.2f s after the SIGSTOP (lease 0.5 s)\n", seconds);
  EXPECT_LT(seconds, 20) << JsonStatus(job) << Logs();
  ASSERT_TRUE(AwaitReason(job, "ShardLost", absl::Seconds(30))) << JsonStatus(job) << Logs();
  // Back, with its table and the calls it held: it must not lead again
  // (it may then be given its old place as a spare, copied afresh).
  pool_[kShard1]->Signal(SIGCONT);
  ExpectSucceededWithoutARestart(job);
  ExpectAllClose(uninterrupted, job);
}

// Two shards lost one after the other, with a spare copied in between: the
// job survives both with replicas: 1 (without the spare, the second loss
// would leave some chunks without a copy and restart it).
TEST_F(ReplicationTest, ASpareRestoresTheCopiesBetweenTwoLosses) {
  const std::string yaml = ReplicatedYaml("sync", "sync", 3000);
  const NamedTensors uninterrupted = Uninterrupted(yaml);
  ASSERT_FALSE(uninterrupted.empty());

  const std::string job = Submit(WriteSpec("twice", yaml));
  WaitForStep(job, 100);
  pool_[kShard1]->Signal(SIGKILL);
  pool_[kShard1]->Wait();
  pool_.push_back(Start("shard-3", {"server/ps/pstrain-ps", "--host=127.0.0.1", "--port=0",
                                    "--advertise_host=127.0.0.1", "--coordinator=" + coordinator_, "--name=shard-3",
                                    "--checkpoint_root=" + dir_}));
  ASSERT_TRUE(AwaitReason(job, "ShardCaughtUp", absl::Seconds(60))) << JsonStatus(job) << Logs();
  const int64_t before = Step(job);
  ASSERT_LT(before, 2900) << "the job ended before the second loss";
  pool_[kShard1 + 1]->Signal(SIGKILL);  // shard-2
  pool_[kShard1 + 1]->Wait();
  std::printf("sync, second loss: 5 more steps %.2f s after the SIGKILL\n", SecondsUntilPast(job, before));
  ExpectSucceededWithoutARestart(job);
  ExpectAllClose(uninterrupted, job);
}

// A replicated job's checkpoint, taken after it lost a shard (each chunk
// saved once, by its primary now), restores onto another shard count with
// or without replicas: the restored values are the checkpoint's, bit for bit.
TEST_F(ReplicationTest, ACheckpointAfterALossRestoresOntoAnyShardCountAndReplicas) {
  const std::string yaml = ReplicatedYaml("ckpt", "sync", 100000);
  const std::string job = Submit(WriteSpec("ckpt", absl::StrReplaceAll(yaml, {{"epochs: 1", "epochs: 1000"}})));
  WaitForStep(job, 30);
  pool_[kShard1]->Signal(SIGKILL);
  pool_[kShard1]->Wait();
  ASSERT_TRUE(AwaitReason(job, "ShardLost", absl::Seconds(30))) << JsonStatus(job) << Logs();
  CliResult out = Cli({"checkpoint", job});
  ASSERT_EQ(out.code, 0) << out.out << JsonStatus(job);
  const Checkpointed ck = ParseCheckpoint(out.out);
  ASSERT_EQ(Cli({"cancel", job}).code, 0);
  auto expected = ReadCheckpointValues(ck.path);
  ASSERT_TRUE(expected.ok()) << expected.status();
  // Two shards are left in the pool (shard-0, shard-2).
  for (const std::string& layout : {std::string("shards: 2\nreplicas: 1"), std::string("shards: 2\nreplicas: 0")}) {
    SCOPED_TRACE(layout);
    const std::string name = layout.back() == '1' ? "into-r1" : "into-r0";
    const std::string spec = WriteSpec(
        name, absl::StrReplaceAll(yaml, {{"shards: 3\nreplicas: 1", layout},
                                         {"max_steps: 100000", "max_steps: " + std::to_string(ck.step)}}));
    CliResult r = Cli({"restore", "--from", ck.path, "--spec", spec, "--output_dir", dir_ + "/" + name});
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string restored = r.out.substr(0, r.out.find('\n'));
    CliResult w = Cli({"watch", restored});
    ASSERT_EQ(w.code, 0) << w.out << JsonStatus(restored) << Logs();
    auto got = ReadWeightsFile(dir_ + "/" + name + "/" + restored + "/model.pt");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(BitwiseDifference(*expected, *got), "");
  }
}

TEST_F(ReplicationTest, AsyncJobLosesAShardAndKeepsTraining) {
  const std::string job = Submit(WriteSpec("async", ReplicatedYaml("async", "async", 1200)));
  WaitForStep(job, 100);
  const int64_t before = Step(job);
  pool_[kShard1]->Signal(SIGKILL);
  pool_[kShard1]->Wait();
  std::printf("async: 5 more steps %.2f s after the SIGKILL (lease 0.5 s)\n", SecondsUntilPast(job, before));
  ExpectSucceededWithoutARestart(job);
}

}  // namespace
}  // namespace pstrain
