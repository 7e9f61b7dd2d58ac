// The replication tests' cluster (tests/replication_test.cc,
// tests/unresponsive_shard_test.cc): a coordinator with leases of 0.5 s,
// shard-0 and two workers, shard-1 and shard-2 (real processes), and the
// helpers that run a replicated job whole, watch its steps and compare its
// weights.
#ifndef PSTRAIN_TESTS_REPLICATION_TESTING_H_
#define PSTRAIN_TESTS_REPLICATION_TESTING_H_

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "tests/checkpoint_values.h"
#include "tests/control_plane_testing.h"

namespace pstrain {

// Small chunks, so that every shard leads some and backs up others; SGD
// with momentum, so that a promoted backup must hold the optimizer state.
inline std::string ReplicatedYaml(const std::string& name, const std::string& consistency, int64_t max_steps) {
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

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_REPLICATION_TESTING_H_
