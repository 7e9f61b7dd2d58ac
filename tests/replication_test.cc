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
// - ASYNC, a shard SIGKILLed: the job keeps training and finishes;
// - a dlrm job with embedding tables (SYNC, 3 shards, replicas 1), a shard
//   SIGKILLed, or SIGSTOPped until it is declared lost and then let go
//   (fenced): no restart, the dense values of the uninterrupted run bit for
//   bit and its test AUC and log loss to the last digit; ASYNC, it trains
//   on and finishes.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>
#include <utility>

#include "absl/strings/str_replace.h"

#include "checkpoint/manifest.h"
#include "tests/checkpoint_values.h"
#include "tests/control_plane_testing.h"
#include "tests/replication_testing.h"
#include "worker/criteo_data.h"
#include "worker/criteo_synth.h"

namespace pstrain {
namespace {

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

// A dlrm job's embedding rows replicated too: 3 shards, 2 workers on
// Criteo-format data from a planted model, Adagrad everywhere (slots that a
// promoted backup must hold).
class EmbeddingReplicationTest : public ReplicationTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("replication-emb");
    missed_heartbeats_ = 5;  // a lease of 0.5 s
    CriteoSynthOptions o;
    o.train_examples = 30000;
    o.test_examples = 2000;
    o.id_space.fill(200);
    std::filesystem::create_directories(dir_ + "/data/criteo");
    auto meta = WriteCriteoSynth(o, dir_ + "/data/criteo/train.tsv", dir_ + "/data/criteo/test.tsv", "");
    ASSERT_TRUE(meta.ok()) << meta.status();
    StartCoordinator(0);
    StartPool(3, 0);  // shard-0..2: pool_[0..2]
    for (int r = 0; r < 2; ++r) {
      const std::string name = "worker-" + std::to_string(r);
      pool_.push_back(Start(name, {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=" + name,
                                   "--data_root=" + dir_ + "/data"}));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Cli({"cluster"}).out.find("worker-1") == std::string::npos) {
      ASSERT_LT(absl::Now(), deadline) << Cli({"cluster"}).out;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  static std::string CtrYaml(const std::string& name, const std::string& consistency, int64_t max_steps) {
    std::string yaml = "name: " + name +
                       "\nmodel: dlrm\ndata: {format: criteo, dir: criteo, train_file: train.tsv, test_file: "
                       "test.tsv}\nworkers: 2\nshards: 3\nreplicas: 1\nchunk_bytes: 4096\nconsistency: " +
                       consistency + "\nbatch_size: 64\nepochs: 1\nlog_every_steps: 5\nmax_steps: " +
                       std::to_string(max_steps) +
                       "\ncheckpoint_every_steps: 60\noutput_dir: OUT\noptimizer: {kind: adagrad, lr: 0.02}\n"
                       "embeddings:\n  tables:\n";
    for (int t = 0; t < kCriteoSparseFields; ++t) {
      yaml += "    - {name: c" + std::to_string(t) + ", dim: 8, optimizer: {kind: adagrad, lr: 0.05}}\n";
    }
    return yaml;
  }

  // `yaml`'s job run whole, then again with shard `shard` SIGKILLed at
  // step 75 or so: the second ends without a restart, with the first's
  // dense values bit for bit and its test metrics (every row the test set
  // reads, through the model) to the last digit. SYNC with 2 ranks is
  // deterministic, so that means no update was lost or applied twice, on
  // the dense part or on the rows. Returns the second job and its step at
  // the SIGKILL.
  std::pair<std::string, int64_t> EndsAsWholeAfterASigkill(const std::string& yaml, int shard, const char* what) {
    const std::string whole = Submit(WriteSpec("whole", yaml));
    CliResult w = Cli({"watch", whole});
    EXPECT_EQ(w.code, 0) << w.out << Logs();
    auto want = ReadWeightsFile(dir_ + "/out/" + whole + "/model.pt");
    EXPECT_TRUE(want.ok()) << want.status();
    const std::string job = Submit(WriteSpec("killed", yaml));
    WaitForStep(job, 75);
    const int64_t before = Step(job);
    pool_[shard]->Signal(SIGKILL);
    pool_[shard]->Wait();
    std::printf("ctr %s: 5 more steps %.2f s after the SIGKILL of a shard at step %lld (lease 0.5 s)\n", what,
                SecondsUntilPast(job, before), static_cast<long long>(before));
    ExpectSucceededWithoutARestart(job);
    auto got = ReadWeightsFile(dir_ + "/out/" + job + "/model.pt");
    EXPECT_TRUE(got.ok()) << got.status();
    if (want.ok() && got.ok()) EXPECT_EQ(BitwiseDifference(*want, *got), "");
    const std::string metrics = Metrics(whole);
    EXPECT_NE(metrics.find("log_loss="), std::string::npos) << JsonStatus(whole);
    EXPECT_EQ(Metrics(job), metrics);
    std::printf("uninterrupted: %s\n", metrics.c_str());
    return {job, before};
  }

  // The test AUC and log loss `job` reported, as its status prints them
  // (every digit of a double).
  std::string Metrics(const std::string& job) {
    const std::string st = JsonStatus(job);
    std::string out;
    const std::regex metric("\"(auc|log_loss|final_auc)\": ([-0-9.eE]+)");
    for (auto it = std::sregex_iterator(st.begin(), st.end(), metric); it != std::sregex_iterator(); ++it) {
      out += (*it)[1].str() + "=" + (*it)[2].str() + " ";
    }
    return out;
  }
};

TEST_F(EmbeddingReplicationTest, SyncJobLosesAShardAndEndsLikeAnUninterruptedOne) {
  const std::string yaml = absl::StrReplaceAll(CtrYaml("ctr", "sync", 180), {{"OUT", dir_ + "/out"}});
  // shard-1: slot 1's rows are led by shard 2 from the SIGKILL on.
  const auto [job, before] = EndsAsWholeAfterASigkill(yaml, 1, "sync");
  // A checkpoint after the loss is saved by the two shards left (shard 2
  // for its slot and the lost one's), and holds every trained row.
  CliResult ck = Cli({"status", job, "-o", "json"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ck.out, m, std::regex("\"last_checkpoint\": \"([^\"]+)\""))) << ck.out;
  auto manifest = ReadManifest(m[1]);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  if (manifest->step > before + 5) {
    EXPECT_EQ(manifest->embeddings.size(), 2u);
    std::vector<std::string> files;
    for (const auto& f : manifest->embeddings) files.push_back(m[1].str() + "/" + f.file);
    auto rows = ReadEmbeddingRows({files});
    ASSERT_TRUE(rows.ok()) << rows.status();
    size_t n = 0;
    for (const auto& [table, held] : *rows) n += held.size();
    EXPECT_GT(n, 26u * 100) << "the checkpoint holds the trained rows";
  }
}

// A hybrid job (the dense part all-reduced among the workers, the rows on
// the shards) with replicas: a shard SIGKILLed, and the job ends as the
// uninterrupted one, rows and dense part alike, without a restart.
TEST_F(EmbeddingReplicationTest, HybridJobLosesAShardAndEndsLikeAnUninterruptedOne) {
  const std::string yaml =
      absl::StrReplaceAll(CtrYaml("ctr-hybrid", "sync", 180), {{"OUT", dir_ + "/out"}}) + "mode: allreduce\n";
  EndsAsWholeAfterASigkill(yaml, 0, "hybrid");
}

// A shard that hangs (SIGSTOP): the workers' calls to it are cancelled once
// it is declared lost, and when it comes back its forwards are refused.
TEST_F(EmbeddingReplicationTest, AStoppedShardThatComesBackIsFenced) {
  // Periodic checkpoints too: one under way when the shard stops is
  // abandoned once the shard is declared lost (the routing changes under
  // it), and the next one is taken under the new routing.
  const std::string yaml = absl::StrReplaceAll(CtrYaml("ctr", "sync", 180), {{"OUT", dir_ + "/out"}});
  const std::string whole = Submit(WriteSpec("whole", yaml));
  ASSERT_EQ(Cli({"watch", whole}).code, 0) << Logs();
  auto want = ReadWeightsFile(dir_ + "/out/" + whole + "/model.pt");
  ASSERT_TRUE(want.ok()) << want.status();

  const std::string job = Submit(WriteSpec("stopped", yaml));
  WaitForStep(job, 75);
  const int64_t before = Step(job);
  pool_[1]->Signal(SIGSTOP);
  const double seconds = SecondsUntilPast(job, before);
  std::printf("ctr sync: 5 more steps %.2f s after the SIGSTOP of a shard (lease 0.5 s)\n", seconds);
  EXPECT_LT(seconds, 30) << "the calls to the stopped shard were not cancelled" << Logs();
  ASSERT_TRUE(AwaitReason(job, "ShardLost", absl::Seconds(30))) << JsonStatus(job);
  pool_[1]->Signal(SIGCONT);
  ExpectSucceededWithoutARestart(job);
  auto got = ReadWeightsFile(dir_ + "/out/" + job + "/model.pt");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(BitwiseDifference(*want, *got), "");
  EXPECT_EQ(Metrics(job), Metrics(whole));
}

// Two losses with a spare copied in between: shard 1 SIGKILLed, a spare
// takes its place and gets slots 0 and 1 whole from their leaders while
// the job trains, then shard 2 SIGKILLed: no restart, and the end of the
// uninterrupted run to the last digit.
TEST_F(EmbeddingReplicationTest, ASpareRestoresTheCopiesBetweenTwoLosses) {
  const std::string yaml = absl::StrReplaceAll(
      CtrYaml("ctr", "sync", 500), {{"OUT", dir_ + "/out"}, {"epochs: 1", "epochs: 3"}});
  const std::string whole = Submit(WriteSpec("whole", yaml));
  ASSERT_EQ(Cli({"watch", whole}).code, 0) << Logs();
  auto want = ReadWeightsFile(dir_ + "/out/" + whole + "/model.pt");
  ASSERT_TRUE(want.ok()) << want.status();

  const std::string job = Submit(WriteSpec("twice", yaml));
  WaitForStep(job, 60);
  pool_[1]->Signal(SIGKILL);
  pool_[1]->Wait();
  ASSERT_TRUE(AwaitReason(job, "ShardLost", absl::Seconds(30))) << JsonStatus(job);
  const absl::Time spare = absl::Now();
  StartPool(1, 0, /*first_shard=*/3);
  ASSERT_TRUE(AwaitReason(job, "ShardCaughtUp", absl::Seconds(60))) << JsonStatus(job) << Logs();
  std::printf("ctr sync: a spare caught up %.2f s after it was started, at step %lld\n",
              absl::ToDoubleSeconds(absl::Now() - spare), static_cast<long long>(Step(job)));
  const int64_t before = Step(job);
  ASSERT_LT(before, 450) << "too late for a second loss mid-run";
  pool_[2]->Signal(SIGKILL);
  pool_[2]->Wait();
  std::printf("ctr sync: 5 more steps %.2f s after the second SIGKILL\n", SecondsUntilPast(job, before));
  ExpectSucceededWithoutARestart(job);
  auto got = ReadWeightsFile(dir_ + "/out/" + job + "/model.pt");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(BitwiseDifference(*want, *got), "") << Logs();
  EXPECT_EQ(Metrics(job), Metrics(whole));
}

// A checkpoint taken after a loss (shard 2 saving its slot and the lost
// one's) restores onto the 2 shards left, with replicas 1 and 0: both
// restored jobs hold the same rows and values (the same test AUC and log
// loss to the last digit, the checkpoint's dense values bit for bit).
TEST_F(EmbeddingReplicationTest, ACheckpointAfterALossRestoresWithAndWithoutReplicas) {
  const std::string yaml = absl::StrReplaceAll(CtrYaml("ctr", "sync", 100000), {{"OUT", dir_ + "/out"}});
  const std::string job = Submit(WriteSpec("ckpt", yaml));
  WaitForStep(job, 30);
  pool_[1]->Signal(SIGKILL);
  pool_[1]->Wait();
  ASSERT_TRUE(AwaitReason(job, "ShardLost", absl::Seconds(30))) << JsonStatus(job) << Logs();
  CliResult out = Cli({"checkpoint", job});
  ASSERT_EQ(out.code, 0) << out.out << JsonStatus(job);
  const Checkpointed ck = ParseCheckpoint(out.out);
  ASSERT_EQ(Cli({"cancel", job}).code, 0);
  auto manifest = ReadManifest(ck.path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->embeddings.size(), 2u) << "saved by the two shards left";
  auto expected = ReadCheckpointValues(ck.path);
  ASSERT_TRUE(expected.ok()) << expected.status();
  std::vector<std::string> metrics;
  for (const std::string& replicas : {std::string("1"), std::string("0")}) {
    SCOPED_TRACE("replicas " + replicas);
    const std::string name = "into-r" + replicas;
    const std::string spec = WriteSpec(
        name, absl::StrReplaceAll(yaml, {{"shards: 3\nreplicas: 1", "shards: 2\nreplicas: " + replicas},
                                         {"max_steps: 100000", "max_steps: " + std::to_string(ck.step)}}));
    CliResult r = Cli({"restore", "--from", ck.path, "--spec", spec, "--output_dir", dir_ + "/" + name});
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string restored = r.out.substr(0, r.out.find('\n'));
    CliResult w = Cli({"watch", restored});
    ASSERT_EQ(w.code, 0) << w.out << JsonStatus(restored) << Logs();
    auto got = ReadWeightsFile(dir_ + "/" + name + "/" + restored + "/model.pt");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(BitwiseDifference(*expected, *got), "");
    metrics.push_back(Metrics(restored));
    EXPECT_NE(metrics.back().find("log_loss="), std::string::npos) << JsonStatus(restored);
  }
  EXPECT_EQ(metrics[0], metrics[1]);
}

TEST_F(EmbeddingReplicationTest, AsyncJobLosesAShardAndKeepsTraining) {
  const std::string yaml = absl::StrReplaceAll(CtrYaml("ctr-async", "async", 400), {{"OUT", dir_ + "/out"}});
  const std::string job = Submit(WriteSpec("async", yaml));
  WaitForStep(job, 75);
  const int64_t before = Step(job);
  pool_[2]->Signal(SIGKILL);
  pool_[2]->Wait();
  std::printf("ctr async: 5 more steps %.2f s after the SIGKILL (lease 0.5 s)\n", SecondsUntilPast(job, before));
  ExpectSucceededWithoutARestart(job);
}

}  // namespace
}  // namespace pstrain
