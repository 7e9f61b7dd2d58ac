// The control-plane tests' cluster: a coordinator, a pool of shards and
// workers registered with it (real processes), and the pstrain CLI.
#ifndef PSTRAIN_TESTS_CONTROL_PLANE_TESTING_H_
#define PSTRAIN_TESTS_CONTROL_PLANE_TESTING_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "tests/child_process.h"

namespace pstrain {

// GET /metrics over a plain socket.
inline std::string Scrape(const std::string& host_port) {
  const int port = std::stoi(host_port.substr(host_port.rfind(':') + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// What `pstrain watch` printed last: "final test accuracy X" (-1: none).
inline double FinalAccuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("final test accuracy ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

// What `pstrain checkpoint` printed: "<dir> (step N)".
struct Checkpointed {
  std::string path;
  int64_t step = -1;
};
inline Checkpointed ParseCheckpoint(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("^(\\S+) \\(step (\\d+)\\)"))) return {};
  return {m[1], std::stoll(m[2])};
}

struct CliResult {
  int code;
  std::string out;
};

// Where the workers of these tests read data: Debian's datasets, so that a
// spec's default data.dir (fashion-mnist) is Debian's dataset-fashion-mnist.
inline constexpr char kTestDataRoot[] = "/usr/share/datasets";

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("control");
    StartCoordinator(0);
    StartPool(1, 2);
  }

  void StartPool(int shards, int workers, int first_shard = 0) {
    for (int i = first_shard; i < first_shard + shards; ++i) {
      pool_.push_back(Start("shard-" + std::to_string(i),
                            {"server/ps/pstrain-ps", "--host=127.0.0.1", "--port=0", "--advertise_host=127.0.0.1",
                             "--coordinator=" + coordinator_, "--name=shard-" + std::to_string(i),
                             "--checkpoint_root=" + dir_}));
    }
    for (int r = 0; r < workers; ++r) {
      const std::string name = "worker-" + std::to_string(r);
      pool_.push_back(Start(name, {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=" + name,
                                   "--gloo_hostname=127.0.0.1", "--metrics_host=127.0.0.1", "--metrics_port=0",
                                   "--metrics_port_file=" + dir_ + "/" + name + ".metrics"}));
    }
    // Wait until the pool has registered.
    const std::string last = workers > 0 ? "worker-" + std::to_string(workers - 1)
                                          : "shard-" + std::to_string(first_shard + shards - 1);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Cli({"cluster"}).out.find(last) == std::string::npos) {
      ASSERT_LT(absl::Now(), deadline) << Cli({"cluster"}).out;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  // SIGKILL the coordinator and every member.
  void KillEverything() {
    coordinator_process_->Signal(SIGKILL);
    coordinator_process_->Wait();
    for (auto& p : pool_) {
      p->Signal(SIGKILL);
      p->Wait();
    }
    pool_.clear();
  }

  void StartCoordinator(int port) {
    const std::string port_file = dir_ + "/coordinator.addr";
    std::filesystem::remove(port_file);
    std::vector<std::string> argv = {"server/coordinator/pstrain-coordinator", "--host=127.0.0.1",
                                     "--port=" + std::to_string(port), "--port_file=" + port_file,
                                     "--db=" + dir_ + "/jobs.db", "--heartbeat_ms=" + std::to_string(heartbeat_ms_),
                                     "--checkpoint_root=" + dir_,
                                     "--missed_heartbeats=" + std::to_string(missed_heartbeats_),
                                     "--metrics_port=0", "--metrics_port_file=" + dir_ + "/metrics.addr"};
    argv.insert(argv.end(), coordinator_flags_.begin(), coordinator_flags_.end());
    coordinator_process_ = Start("coordinator", argv);
    auto addr = WaitForAddressFile(port_file, absl::Seconds(30));
    ASSERT_TRUE(addr.ok()) << addr.status();
    coordinator_ = *addr;
  }

  // A worker reads its jobs' data under kTestDataRoot unless argv names
  // another --data_root.
  std::unique_ptr<ChildProcess> Start(const std::string& name, std::vector<std::string> argv) {
    if (!argv.empty() && argv[0] == "worker/pstrain-worker" &&
        std::none_of(argv.begin(), argv.end(), [](const std::string& a) { return a.rfind("--data_root", 0) == 0; })) {
      argv.push_back(std::string("--data_root=") + kTestDataRoot);
    }
    auto child = ChildProcess::Start(argv, dir_ + "/" + name + ".log");
    EXPECT_TRUE(child.ok());
    return std::move(*child);
  }

  CliResult Cli(std::vector<std::string> args, absl::Duration timeout = absl::Seconds(120)) {
    std::vector<std::string> argv = {"client/pstrain", "--coordinator", coordinator_};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = dir_ + "/cli.out";
    auto child = ChildProcess::Start(argv, log);
    int code = (*child)->Wait(timeout);
    return {code, ReadFile(log).value_or("")};
  }

  std::string Spec(const std::string& name, int epochs, int64_t max_steps) {
    const std::string path = dir_ + "/" + name + ".yaml";
    EXPECT_TRUE(WriteFileAtomically(path, "name: " + name + "\nmodel: mlp\n"
                                          "data: {format: synthetic, synthetic_train: 4096, synthetic_test: 512}\n"
                                          "workers: 2\nshards: 1\nbatch_size: 32\nlog_every_steps: 5\n"
                                          "output_dir: " + dir_ + "/out\n"
                                          "epochs: " + std::to_string(epochs) +
                                          "\nmax_steps: " + std::to_string(max_steps) + "\n").ok());
    return path;
  }

  std::string Submit(const std::string& spec) {
    CliResult r = Cli({"submit", spec, "--output_dir", dir_ + "/out"});
    EXPECT_EQ(r.code, 0) << r.out;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.out, m, std::regex("job-\\d+"))) << r.out;
    return m.str();
  }

  std::string State(const std::string& job) {
    CliResult r = Cli({"status", job, "-o", "json"});
    std::smatch m;
    if (!std::regex_search(r.out, m, std::regex("\"state\": \"([A-Z]+)\""))) return r.out;
    return m[1];
  }

  // A SYNC job of 2 workers and 1 shard that runs until cancelled (a job of
  // a few hundred steps can end, at ~250 steps/s, before a drain's pause).
  std::string DrainSpec() {
    const std::string path = dir_ + "/drain.yaml";
    EXPECT_TRUE(WriteFileAtomically(path, "name: drain\nmodel: mlp\nconsistency: sync\nworkers: 2\nshards: 1\n"
                                          "data: {format: synthetic, synthetic_train: 60000}\nepochs: 1000\n"
                                          "batch_size: 16\nlog_every_steps: 5\n").ok());
    return path;
  }

  // Until `job` runs again, restored from a checkpoint, and its slowest
  // worker is 20 steps past the restored step (the status's step is the
  // checkpoint's once restored); returns that step, -1 after `timeout`.
  int64_t WaitUntilRestoredAndTraining(const std::string& job, absl::Duration timeout = absl::Seconds(120)) {
    const absl::Time deadline = absl::Now() + timeout;
    const std::regex restored("step (\\d+) of job-\\d+ loaded from");
    while (true) {
      CliResult st = Cli({"status", job, "-o", "json"});
      std::smatch m;
      if (st.out.find("\"state\": \"RUNNING\"") != std::string::npos && std::regex_search(st.out, m, restored)) {
        const int64_t step = std::stoll(m[1]);
        WaitForStep(job, step + 20, deadline - absl::Now());
        return step;
      }
      if (absl::Now() >= deadline) {
        ADD_FAILURE() << "not restored and running: " << st.out << Logs();
        return -1;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  // The last lines of every process's log, for failure messages.
  std::string Logs() {
    std::string out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      if (entry.path().extension() != ".log") continue;
      const std::string text = ReadFile(entry.path().string()).value_or("");
      size_t start = text.size();
      for (int lines = 0; start > 0 && lines < 12; --start) lines += text[start - 1] == '\n' ? 1 : 0;
      out += "--- " + entry.path().filename().string() + "\n" + text.substr(start);
    }
    return out;
  }

  // Until the job's slowest worker has reached `step`.
  void WaitForStep(const std::string& job, int64_t step, absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      CliResult st = Cli({"status", job, "-o", "json"});
      std::smatch m;
      // The job's own step (a top-level field, one space in), not a member's
      // activity, which may still be its last job's.
      if (std::regex_search(st.out, m, std::regex("\n \"step\": \"(\\d+)\"")) && std::stoll(m[1]) >= step) return;
      ASSERT_LT(absl::Now(), deadline) << st.out;
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  void WaitForState(const std::string& job, const std::string& state, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (State(job) != state) {
      ASSERT_LT(absl::Now(), deadline) << Cli({"status", job}).out;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  // Leases of 100 ms heartbeats: 2 s by default.
  int heartbeat_ms_ = 100;
  int missed_heartbeats_ = 20;
  std::vector<std::string> coordinator_flags_;  // more of them
  std::string dir_, coordinator_;
  std::unique_ptr<ChildProcess> coordinator_process_;
  std::vector<std::unique_ptr<ChildProcess>> pool_;
};

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_CONTROL_PLANE_TESTING_H_
