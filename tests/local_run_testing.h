// Helpers of the tests that run the binaries as a user does: `pstrain local`
// (coordinator, shards and workers as processes), or workers launched the
// torchrun way.
#ifndef PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_
#define PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "tests/child_process.h"

namespace pstrain {

inline constexpr char kPstrain[] = "client/pstrain";
// The workers' --data_root: Debian's datasets (the spec's default data.dir,
// fashion-mnist, is dataset-fashion-mnist).
inline constexpr char kDataRoot[] = "/usr/share/datasets";

inline bool HaveFashionMnist() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

struct RunOutput {
  int exit_code;
  std::string output;
};

// `pstrain args...`, its stdout and stderr in <dir>/pstrain.out.
inline RunOutput RunPstrain(const std::vector<std::string>& args, const std::string& dir,
                            absl::Duration timeout = absl::Minutes(4)) {
  std::vector<std::string> argv = {kPstrain};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = ChildProcess::Start(argv, dir + "/pstrain.out");
  EXPECT_TRUE(child.ok());
  int code = (*child)->Wait(timeout);
  return {code, ReadFile(dir + "/pstrain.out").value_or("")};
}

inline std::string WriteSpec(const std::string& dir, const std::string& yaml) {
  const std::string path = dir + "/job.yaml";
  EXPECT_TRUE(WriteFileAtomically(path, yaml).ok());
  return path;
}

// Ranks 0 and 1 of `spec` launched the torchrun way (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT=`port`; no coordinator), their output in
// <dir>/rank<r>.log. Once rank 0 has reported step 50, rank 1 is SIGKILLed.
// Checks that rank 0 then exits 1 within 12 s (for specs whose
// collective_timeout_s is 10), and returns its log.
inline std::string KillRankOneMidRun(const std::string& spec, const std::string& dir, int port) {
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = {"/usr/bin/env", "RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=0",
                                     "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                     "worker/pstrain-worker", "--spec=" + spec, "--output_dir=" + dir + "/out",
                                     "--gloo_hostname=127.0.0.1"};
    auto child = ChildProcess::Start(argv, dir + "/rank" + std::to_string(r) + ".log");
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return "";
    }
    ranks.push_back(std::move(*child));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  // (protobuf's JSON mapping prints int64 fields as strings)
  while (ReadFile(dir + "/rank0.log").value_or("").find("\"step\":\"50\"") == std::string::npos) {
    if (absl::Now() > deadline) {
      ADD_FAILURE() << "rank 0 did not reach step 50: " << ReadFile(dir + "/rank0.log").value_or("");
      return "";
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ranks[1]->Signal(SIGKILL);
  ranks[1]->Wait();
  const absl::Time killed = absl::Now();
  const int code = ranks[0]->Wait(absl::Seconds(30));
  const std::string log = ReadFile(dir + "/rank0.log").value_or("");
  EXPECT_EQ(code, 1) << log;
  EXPECT_LT(absl::Now() - killed, absl::Seconds(12)) << log;  // the 10 s timeout at most
  return log;
}

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_
