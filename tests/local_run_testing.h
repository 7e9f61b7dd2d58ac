// Helpers of the tests that run the binaries as a user does: `pstrain local`
// (coordinator, shards and workers as processes), or workers launched the
// torchrun way.
#ifndef PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_
#define PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
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

// `pstrain local EXAMPLE` (a committed spec) on Debian's Fashion-MNIST,
// with its output_dir under `dir`; checks that it succeeded and returns the
// final test accuracy it printed (-1 where it printed none), printing it
// for the test log.
inline double RunExampleAccuracy(const std::string& example, const std::string& dir, RunOutput* run) {
  *run = RunPstrain({"local", example, "--output_dir", dir + "/out", "--data_root", kDataRoot}, dir);
  EXPECT_EQ(run->exit_code, 0) << run->output;
  std::smatch m;
  if (!std::regex_search(run->output, m, std::regex("final test accuracy ([0-9.]+)"))) {
    ADD_FAILURE() << "no final accuracy in:\n" << run->output;
    return -1;
  }
  std::printf("%s: final test accuracy %s\n", example.c_str(), m[1].str().c_str());
  return std::stod(m[1]);
}

// The accuracy PyTorch gets on the first `n` Fashion-MNIST test examples
// with the weights file `weights` of built-in model `model`
// (tests/eval_exported.py), or -1 (a failure recorded).
inline double PythonAccuracy(const std::string& weights, const std::string& model, int n, const std::string& dir) {
  const std::string cmd = "/usr/bin/python3 tests/eval_exported.py " + weights + " " + model + " " +
                          std::to_string(n) + " > " + dir + "/py.out 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = ReadFile(dir + "/py.out").value_or("");
  std::smatch py;
  if (rc != 0 || !std::regex_search(out, py, std::regex("accuracy ([0-9.]+)"))) {
    ADD_FAILURE() << cmd << ":\n" << out;
    return -1;
  }
  return std::stod(py[1]);
}

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick).
inline int FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  EXPECT_GT(port, 0);
  return port;
}

// Ranks 0 and 1 of a long all-reduce job (an mlp on synthetic data, a
// collective_timeout_s of 10, and the spec lines `extra`) launched the
// torchrun way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a free port; no
// coordinator), their output in <dir>/rank<r>.log. Once rank 0 has
// reported step 50, rank 1 is SIGKILLed. Checks that rank 0 then exits 1
// within 12 s, and returns its log.
inline std::string KillRankOneMidRun(const std::string& dir, const std::string& extra = "") {
  const int port = FreeLocalPort();
  const std::string spec = WriteSpec(dir, R"(
name: kill
mode: allreduce
model: mlp
data: {format: synthetic, synthetic_train: 60000, synthetic_test: 100}
workers: 2
epochs: 100
batch_size: 16
collective_timeout_s: 10
log_every_steps: 10
)" + extra);
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
