// Workers lost and replaced while a parameter-server job runs, with real
// processes: the job goes on without a restore (restarts stays 0), a spare
// pool worker takes over the lost rank, and the figures of how long the
// survivors stood still are printed. Also an ASYNC job with embeddings.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "tests/control_plane_testing.h"

namespace pstrain {
namespace {

class ElasticTest : public ControlPlaneTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("elastic");
    missed_heartbeats_ = 5;  // a lease of 0.5 s
    StartCoordinator(0);
    StartPool(1, 3);
    pool_names_ = {"shard-0", "worker-0", "worker-1", "worker-2"};  // pool_'s order
  }

  // A worker started by the test, at the end of the pool.
  void StartSpare(const std::string& name) {
    pool_.push_back(Start(name, {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=" + name}));
    pool_names_.push_back(name);
  }
  std::vector<std::string> pool_names_;

  // `fashion`: the first 24,576 Fashion-MNIST images (where installed), so
  // accuracies say something, scored on the whole test set (on the first
  // 2,000 images the two runs' accuracies once differed by exactly the
  // 0.5-point bound; on 10,000 they differed by 0.07-0.15 in three runs);
  // else synthetic data of the same size.
  std::string ElasticSpec(const std::string& name, const std::string& consistency, int min_workers,
                          const std::string& extra = "", bool fashion = false) {
    const std::string path = dir_ + "/" + name + ".yaml";
    const std::string data = fashion && HaveFashionMnist()
                                 ? "data: {format: idx, limit_train: " + std::to_string(train_) + "}\n"
                                 : "data: {format: synthetic, synthetic_train: " + std::to_string(train_) +
                                       ", synthetic_test: 1024}\n";
    EXPECT_TRUE(WriteFileAtomically(
                    path, extra + "name: " + name + "\nmodel: mlp\nconsistency: " + consistency +
                              "\nworkers: 3\nmin_workers: " + std::to_string(min_workers) + "\nshards: 1\n" + data +
                              "epochs: 2\nbatch_size: 16\nlog_every_steps: 5\noutput_dir: " + dir_ + "/out\n")
                    .ok());
    return path;
  }

  // Training examples per epoch of the next ElasticSpec (Fashion-MNIST has
  // 60,000).
  int64_t train_ = 24576;

  static bool HaveFashionMnist() {
    return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  }

  int64_t Step(const std::string& job) {
    CliResult st = Cli({"status", job, "-o", "json"});
    std::smatch m;
    return std::regex_search(st.out, m, std::regex("\n \"step\": \"(\\d+)\"")) ? std::stoll(m[1]) : -1;
  }

  // The first number after `"field": ` in the job's JSON status (0 if absent:
  // proto3 JSON leaves zeros out).
  double Field(const std::string& job, const std::string& field) {
    CliResult st = Cli({"status", job, "-o", "json"});
    std::smatch m;
    if (!std::regex_search(st.out, m, std::regex("\"" + field + "\": \"?([-0-9.e]+)"))) return 0;
    return std::stod(m[1]);
  }

  // The step rank `rank` last reported (-1: none yet).
  int64_t RankStep(const std::string& job, int rank) {
    CliResult st = Cli({"status", job, "-o", "json"});
    std::smatch m;
    const std::regex re("\"rank\": " + std::to_string(rank) + ",\\s*\"epoch\": \\d+,\\s*\"step\": \"(\\d+)\"");
    return std::regex_search(st.out, m, re) ? std::stoll(m[1]) : -1;
  }

  // SIGKILLs pool member `index` (1..3: worker-0..2) once the job is past
  // `step` -- and, given `rank` (the rank that member holds), once that
  // rank itself is (the job's step is its slowest *reporting* worker's: a
  // member that joined late had trained nothing when killed); returns the
  // seconds until the job's slowest surviving worker completed another step.
  // The index in pool_ of the worker that holds `rank` of `job`: ranks
  // follow the coordinator's random member order, not names.
  size_t PoolIndexOfRank(const std::string& job, int rank) {
    CliResult st = Cli({"status", job, "-o", "json"});
    std::smatch m;
    // One member's object: its name, its rank, perhaps its activity (an
    // object), and last its role (field numbers order the JSON).
    const std::regex re("\"name\": \"([^\"]+)\"[^{}]*\"rank\": " + std::to_string(rank) +
                        "\\b[^{}]*(\\{[^{}]*\\}[^{}]*)?\"role\": \"MEMBER_ROLE_WORKER\"");
    EXPECT_TRUE(std::regex_search(st.out, m, re)) << st.out;
    auto it = std::find(pool_names_.begin(), pool_names_.end(), m.empty() ? "" : std::string(m[1]));
    EXPECT_NE(it, pool_names_.end()) << "rank " << rank << " is held by " << (m.empty() ? "nobody" : m[1].str());
    return it == pool_names_.end() ? pool_.size() - 1 : static_cast<size_t>(it - pool_names_.begin());
  }

  double KillWorkerAndTimeRecovery(const std::string& job, size_t index, int64_t step, int rank = -1) {
    WaitForStep(job, step);
    const absl::Time ready_by = absl::Now() + absl::Seconds(60);
    while (rank >= 0 && RankStep(job, rank) < step && absl::Now() < ready_by) absl::SleepFor(absl::Milliseconds(20));
    const int64_t before = Step(job);
    pool_[index]->Signal(SIGKILL);
    pool_[index]->Wait();
    const absl::Time killed = absl::Now();
    // The status's step is the slowest *reporting* worker's: the dead one
    // holds it back until the coordinator drops its rank, so the next
    // increase is the survivors'.
    while (Step(job) <= before + 5 && absl::Now() < killed + absl::Seconds(60)) absl::SleepFor(absl::Milliseconds(20));
    return absl::ToDoubleSeconds(absl::Now() - killed);
  }

  // Under SYNC every example of both epochs is trained once, less the lost
  // worker's batches in flight: the finishing workers trained the whole
  // data but what rank 2 trained before it died (its steps 0..last, the
  // shards' least, 16 examples each, from the coordinator's log) and at
  // most two steps -- its batches while vacant were covered by the others.
  // Two: killed between its pushes to two chunks, its step last + 1 counts
  // as neither its own nor covered, and the chunk whose view the workers
  // follow, having completed that step with it, saw no vacancy, so its
  // next batch was not covered either (the CTR case below met it).
  void ExpectEveryExampleOnceLessTheBatchInFlight(const std::string& job) {
    const std::string log = ReadFile(dir_ + "/coordinator.log").value_or("");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex(job + " rank 2 is vacant after its step (-?\\d+)"))) << log;
    const double own = 16.0 * (std::stoll(m[1]) + 1);
    const double samples = Field(job, "samples");
    std::printf("%s: rank 2 trained %.0f examples before it died; the others %.0f; of %lld\n", job.c_str(), own,
                samples, static_cast<long long>(2 * train_));
    EXPECT_LE(samples + own, 2 * train_) << Logs();
    EXPECT_GE(samples + own, 2 * train_ - 2 * 16) << Logs();
  }

  void ExpectFinishedWithoutARestart(const std::string& job, double min_accuracy = 0.9) {
    WaitForState(job, "SUCCEEDED", absl::Seconds(180));
    CliResult st = Cli({"status", job, "-o", "json"});
    EXPECT_EQ(Field(job, "restarts"), 0) << st.out;
    if (st.out.find("\"reason\": \"Scaled\"") == std::string::npos) {
      EXPECT_NE(st.out.find("\"reason\": \"MemberLost\""), std::string::npos) << st.out;
    }
    EXPECT_GE(Field(job, "final_accuracy"), min_accuracy) << st.out;
  }
};

TEST_F(ElasticTest, SyncJobLosesAWorkerAndFinishesWithTheOthers) {
  // The same job uninterrupted first, for its accuracy (on Fashion-MNIST:
  // synthetic data ends at 1.0 either way).
  const std::string whole = Submit(ElasticSpec("whole", "sync", 2, "", /*fashion=*/true));
  WaitForState(whole, "SUCCEEDED", absl::Seconds(180));
  const double uninterrupted = Field(whole, "final_accuracy");
  const std::string job = Submit(ElasticSpec("sync", "sync", 2, "", /*fashion=*/true));
  WaitForStep(job, 1);
  // Rank 2's holder (rank 0 evaluates and writes the weights: it is
  // awaited, not left vacant).
  const double recovery = KillWorkerAndTimeRecovery(job, PoolIndexOfRank(job, 2), 40, /*rank=*/2);
  std::printf("sync: 5 more steps %.2f s after the SIGKILL (lease 0.5 s)\n", recovery);
  ExpectFinishedWithoutARestart(job, HaveFashionMnist() ? 0.7 : 0.9);
  CliResult st = Cli({"status", job});
  EXPECT_NE(st.out.find("2 of 3 training (vacant: rank 2)"), std::string::npos) << st.out;
  EXPECT_EQ(Field(job, "active_workers"), 2) << st.out << Logs();
  std::printf("sync: final accuracy %.4f, uninterrupted %.4f\n", Field(job, "final_accuracy"), uninterrupted);
  EXPECT_NEAR(Field(job, "final_accuracy"), uninterrupted, 0.005);
  ExpectEveryExampleOnceLessTheBatchInFlight(job);
}

TEST_F(ElasticTest, ASpareWorkerTakesOverTheLostRank) {
  for (const std::string consistency : {"sync", "async"}) {
    SCOPED_TRACE(consistency);
    // The spare starts once the survivors have trained on (5 steps after
    // the kill), and the job must still run then: at 24,576 examples an
    // async job (~500 steps/s) ended before it came ("2 of 3 ranks finished
    // (the others were lost, not replaced)"), and so did a sync one at
    // ~340 steps/s, 2 s after the kill. Async trains 4x as long, sync 2x
    // (LibTorch 2.6's CPU build trains sync at ~700 samples/s: 4x ran past
    // the 180 s the test allows).
    train_ = consistency == "async" ? 4 * 24576 : 2 * 24576;
    const std::string job = Submit(ElasticSpec(consistency, consistency, 2));
    WaitForStep(job, 1);
    const double recovery = KillWorkerAndTimeRecovery(job, PoolIndexOfRank(job, 2), 40, /*rank=*/2);
    const absl::Time started = absl::Now();
    const std::string spare = "worker-spare-" + consistency;
    StartSpare(spare);
    // The replacement's first step: the job's replacements counter, then
    // its rank's progress moving.
    while (Field(job, "replacements") < 1 && absl::Now() < started + absl::Seconds(60)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::printf("%s: 5 more steps %.2f s after the SIGKILL; spare admitted %.2f s after it was started\n",
                consistency.c_str(), recovery, absl::ToDoubleSeconds(absl::Now() - started));
    ExpectFinishedWithoutARestart(job);
    CliResult st = Cli({"status", job, "-o", "json"});
    EXPECT_EQ(Field(job, "replacements"), 1) << st.out << Logs();
    EXPECT_NE(st.out.find("\"reason\": \"WorkerReplaced\""), std::string::npos) << st.out;
    EXPECT_NE(st.out.find(spare), std::string::npos) << st.out;
    // It continued the rank where the rank had got to, not at its start.
    const std::string log = ReadFile(dir_ + "/coordinator.log").value_or("");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex(job + " rank 2 continues at step (\\d+)"))) << log;
    const int64_t continued = std::stoll(m[1]);
    EXPECT_GT(continued, 0);
    if (consistency == "sync") ExpectEveryExampleOnceLessTheBatchInFlight(job);
    if (consistency == "async") {
      // Every example of both epochs once: the finishing workers' count is
      // the whole data less exactly what the lost worker trained before it
      // died (its steps 0..continued-1, 16 examples each).
      EXPECT_EQ(Field(job, "samples"), 2 * train_ - continued * 16) << st.out;
    }
    std::printf("%s: rank 2 continued at step %s; %.0f samples trained by the finishing workers\n",
                consistency.c_str(), m[1].str().c_str(), Field(job, "samples"));
  }
}

TEST_F(ElasticTest, ADrainedWorkerLeavesAndTheJobGoesOnWithoutACheckpoint) {
  const std::string job = Submit(ElasticSpec("drain", "sync", 2));
  WaitForStep(job, 40);
  const size_t leaving = PoolIndexOfRank(job, 2);  // not rank 0: it is awaited
  pool_[leaving]->Signal(SIGTERM);
  EXPECT_EQ(pool_[leaving]->Wait(absl::Seconds(60)), 0) << Logs();  // it leaves cleanly
  ExpectFinishedWithoutARestart(job);
  CliResult st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("is shutting down; running with 2 of 3 workers"), std::string::npos) << st.out;
  EXPECT_EQ(st.out.find("CheckpointSaved"), std::string::npos) << st.out;
}

TEST_F(ElasticTest, ScaleDownAndBackUpWhileTheJobRuns) {
  const std::string job = Submit(ElasticSpec("scale", "sync", 1));
  WaitForStep(job, 30);
  CliResult down = Cli({"scale", job, "--workers", "2"});
  ASSERT_EQ(down.code, 0) << down.out;
  EXPECT_NE(down.out.find("2 workers asked for, 2 training now"), std::string::npos) << down.out;
  CliResult st = Cli({"status", job});
  EXPECT_NE(st.out.find("2 of 3 training (vacant: rank 2)"), std::string::npos) << st.out;
  // Rank 2's worker went back to the pool; the job trains on with two.
  const int64_t at = Step(job);
  WaitForStep(job, at + 20);
  EXPECT_EQ(Cli({"scale", job, "--workers", "4"}).code, 2);  // beyond the spec's workers
  EXPECT_EQ(Cli({"scale", "job-999999", "--workers", "2"}).code, 4);
  CliResult up = Cli({"scale", job, "--workers", "3"});
  ASSERT_EQ(up.code, 0) << up.out;
  ExpectFinishedWithoutARestart(job);
  st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("\"reason\": \"Scaled\""), std::string::npos) << st.out;
  EXPECT_EQ(Field(job, "replacements"), 1) << st.out;  // rank 2 taken up again
  EXPECT_EQ(Field(job, "active_workers"), 3) << st.out << Logs();
}

// The figure to compare with: the same loss handled as before this change,
// a restart from the newest checkpoint once a third worker is there.
TEST_F(ElasticTest, TodaysRestartFromACheckpointForComparison) {
  const std::string job = Submit(ElasticSpec("restart", "sync", 3, "checkpoint_every_steps: 20\n"));
  WaitForStep(job, 60);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Cli({"status", job, "-o", "json"}).out.find("last_checkpoint") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(50));
  }
  const int64_t before = Step(job);
  pool_[3]->Signal(SIGKILL);
  pool_[3]->Wait();
  const absl::Time killed = absl::Now();
  absl::SleepFor(absl::Seconds(2));
  StartSpare("spare");
  while (!(State(job) == "RUNNING" && Step(job) > before + 5) && absl::Now() < killed + absl::Seconds(120)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("restart: back past the pre-kill step + 5 %.2f s after the SIGKILL (spare started after 2 s)\n",
              absl::ToDoubleSeconds(absl::Now() - killed));
  WaitForState(job, "SUCCEEDED", absl::Seconds(180));
  EXPECT_EQ(Field(job, "restarts"), 1) << Cli({"status", job}).out;
}

TEST_F(ElasticTest, WithoutMinWorkersALostWorkerStillRestartsTheJob) {
  // min_workers = workers and no spare: today's behaviour, a restart from
  // the checkpoint (here none: the job fails saying why).
  const std::string job = Submit(ElasticSpec("strict", "sync", 3));
  WaitForStep(job, 20);
  pool_[3]->Signal(SIGKILL);
  pool_[3]->Wait();
  WaitForState(job, "FAILED", absl::Seconds(60));
  CliResult st = Cli({"status", job});
  EXPECT_NE(st.out.find("no checkpoint to restart from"), std::string::npos) << st.out;
}

// A job with embeddings (DLRM on planted Criteo-format data, 26 tables on 2
// shards), ASYNC and SSP: the shards wait for no vacant rank, so a lost
// worker's rank stays vacant while the others train on, and a spare takes
// it over where it had got to in its share of the file.
class CtrElasticTest : public ElasticTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("ctr-elastic");
    missed_heartbeats_ = 5;  // a lease of 0.5 s
    std::filesystem::create_directories(dir_ + "/data/criteo");
    auto gen = ChildProcess::Start({"worker/criteo_gen", "--id_space", "50", "--train_examples",
                                    std::to_string(kTrain), "--test_examples", "3000", "--out_train",
                                    dir_ + "/data/criteo/train.tsv", "--out_test", dir_ + "/data/criteo/test.tsv",
                                    "--out_meta", dir_ + "/data/criteo/meta.txt"},
                                   dir_ + "/gen.log");
    ASSERT_TRUE(gen.ok()) << gen.status();
    ASSERT_EQ((*gen)->Wait(absl::Minutes(2)), 0) << ReadFile(dir_ + "/gen.log").value_or("");
    StartCoordinator(0);
    StartPool(2, 0);
    pool_names_ = {"shard-0", "shard-1"};
    for (int r = 0; r < 3; ++r) StartCtrWorker("worker-" + std::to_string(r));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Cli({"cluster"}).out.find("worker-2") == std::string::npos) {
      ASSERT_LT(absl::Now(), deadline) << Cli({"cluster"}).out;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  void StartCtrWorker(const std::string& name) {
    pool_.push_back(Start(name, {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=" + name,
                                 "--data_root=" + dir_ + "/data"}));
    pool_names_.push_back(name);
  }

  // Lines of the training file: 3 equal shares of 40,000, 313 batches of
  // 128 each an epoch (the last of 64).
  static constexpr int64_t kTrain = 120000;
};

TEST_F(CtrElasticTest, AJobWithEmbeddingsLosesAWorkerAndASpareTakesItsRankOver) {
  // sync-replicas: the rows and the dense part on both shards (the steps
  // the shards complete for the vacant rank are forwarded to the backups).
  for (const auto& [name, consistency] : std::vector<std::pair<std::string, std::string>>{
           {"async", "async"}, {"ssp", "ssp\nstaleness: 2"}, {"sync", "sync"}, {"sync-replicas", "sync\nreplicas: 1"}}) {
    SCOPED_TRACE(name);
    std::string spec = ReadFile("examples/criteo_synth.yaml").value_or("");
    for (const auto& [what, with] : std::vector<std::pair<std::string, std::string>>{
             {"name: criteo_synth", "name: ctr-" + name},
             {"consistency: async", "consistency: " + consistency},
             {"workers: 2", "workers: 3\nmin_workers: 2"},
             {"epochs: 1", "epochs: 2\nlog_every_steps: 5\noutput_dir: " + dir_ + "/out"}}) {
      const size_t at = spec.find(what);
      ASSERT_NE(at, std::string::npos) << what;
      spec.replace(at, what.size(), with);
    }
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/" + name + ".yaml", spec).ok());
    const std::string job = Submit(dir_ + "/" + name + ".yaml");
    WaitForStep(job, 1);
    const double recovery = KillWorkerAndTimeRecovery(job, PoolIndexOfRank(job, 2), 40, /*rank=*/2);
    const absl::Time started = absl::Now();
    StartCtrWorker("worker-spare-" + name);
    while (Field(job, "replacements") < 1 && absl::Now() < started + absl::Seconds(60)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::printf("ctr %s: 5 more steps %.2f s after the SIGKILL; spare admitted %.2f s after it was started\n",
                name.c_str(), recovery, absl::ToDoubleSeconds(absl::Now() - started));
    // The survivors went on without the lost rank (SSP: past its bound,
    // once the shards' embedding tables were told it is vacant).
    EXPECT_LT(recovery, 20) << Logs();
    WaitForState(job, "SUCCEEDED", absl::Seconds(180));
    CliResult st = Cli({"status", job, "-o", "json"});
    EXPECT_EQ(Field(job, "restarts"), 0) << st.out;
    EXPECT_EQ(Field(job, "replacements"), 1) << st.out << Logs();
    EXPECT_NE(st.out.find("\"reason\": \"MemberLost\""), std::string::npos) << st.out;
    EXPECT_NE(st.out.find("worker-spare-" + name), std::string::npos) << st.out;
    // Chance is 0.5; the uninterrupted 2-worker example reaches ~0.72.
    EXPECT_GT(Field(job, "final_auc"), 0.65) << st.out;
    const std::string log = ReadFile(dir_ + "/coordinator.log").value_or("");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex(job + " rank 2 continues at step (\\d+)"))) << log;
    const int64_t continued = std::stoll(m[1]);
    EXPECT_GT(continued, 0);
    if (consistency.rfind("sync", 0) == 0) {
      // The others covered rank 2's batches while it was vacant, and the
      // spare joined the step in flight: every example of both epochs
      // once, less what rank 2 trained before it died (its steps 0..last,
      // the shards' least: 313 batches an epoch, the last of 64) and at
      // most two batches in flight: killed between its push to one shard
      // and to the other, its step last + 1 counts as neither its own nor
      // covered, and the shard that completed that step with it (holding
      // the first key, whose view the workers follow) saw no vacancy, so
      // its next batch was not covered either (seen once in 12 runs).
      ASSERT_TRUE(std::regex_search(log, m, std::regex(job + " rank 2 is vacant after its step (-?\\d+)"))) << log;
      int64_t own = 0;
      for (int64_t step = 0; step <= std::stoll(m[1]); ++step) own += step % 313 == 312 ? 64 : 128;
      const int64_t samples = static_cast<int64_t>(Field(job, "samples"));
      std::printf("ctr %s: rank 2 trained %lld examples before it died, the others %lld, of %lld\n",
                  name.c_str(), static_cast<long long>(own), static_cast<long long>(samples), static_cast<long long>(2 * kTrain));
      EXPECT_LE(samples + own, 2 * kTrain) << Logs();
      EXPECT_GE(samples + own, 2 * kTrain - 2 * 128) << Logs();
      std::printf("ctr %s: rank 2 continued at step %lld; final AUC %.4f\n", name.c_str(),
                  static_cast<long long>(continued), Field(job, "final_auc"));
      continue;
    }
    // Every example of both epochs once: the finishing workers trained the
    // whole data less what the lost worker trained (its steps
    // 0..continued-1 of its share: 313 batches an epoch, the last of 64).
    const int64_t per_epoch = 313, share = kTrain / 3;
    const int64_t lost = (continued / per_epoch) * share + (continued % per_epoch) * 128;
    EXPECT_EQ(Field(job, "samples"), 2 * kTrain - lost) << st.out;
    std::printf("ctr %s: rank 2 continued at step %lld; final AUC %.4f\n", name.c_str(),
                static_cast<long long>(continued), Field(job, "final_auc"));
  }
}

}  // namespace
}  // namespace pstrain
