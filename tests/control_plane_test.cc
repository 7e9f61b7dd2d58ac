// The control plane with real processes: a coordinator, a pool of shards and
// workers registered with it, and the pstrain CLI talking to it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "tests/child_process.h"

namespace pstrain {
namespace {

// GET /metrics over a plain socket.
std::string Scrape(const std::string& host_port) {
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

struct CliResult {
  int code;
  std::string out;
};

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
    coordinator_process_ = Start("coordinator", {"server/coordinator/pstrain-coordinator", "--host=127.0.0.1",
                                                 "--port=" + std::to_string(port), "--port_file=" + port_file,
                                                 "--db=" + dir_ + "/jobs.db", "--heartbeat_ms=100",
                                                 "--checkpoint_root=" + dir_,
                                                 "--missed_heartbeats=20", "--metrics_port=0",
                                                 "--metrics_port_file=" + dir_ + "/metrics.addr"});
    auto addr = WaitForAddressFile(port_file, absl::Seconds(30));
    ASSERT_TRUE(addr.ok()) << addr.status();
    coordinator_ = *addr;
  }

  std::unique_ptr<ChildProcess> Start(const std::string& name, const std::vector<std::string>& argv) {
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

  // A SYNC job of 2 workers and 1 shard, long enough to be drained mid-run.
  std::string DrainSpec() {
    const std::string path = dir_ + "/drain.yaml";
    EXPECT_TRUE(WriteFileAtomically(path, "name: drain\nmodel: mlp\nconsistency: sync\nworkers: 2\nshards: 1\n"
                                          "data: {format: synthetic, synthetic_train: 60000}\nepochs: 100\n"
                                          "max_steps: 600\nbatch_size: 16\nlog_every_steps: 5\n").ok());
    return path;
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
      if (std::regex_search(st.out, m, std::regex("\"step\": \"(\\d+)\"")) && std::stoll(m[1]) >= step) return;
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

  std::string dir_, coordinator_;
  std::unique_ptr<ChildProcess> coordinator_process_;
  std::vector<std::unique_ptr<ChildProcess>> pool_;
};

TEST_F(ControlPlaneTest, SubmitWatchStatusListAndCluster) {
  const std::string job = Submit(Spec("quick", 1, 40));
  CliResult watch = Cli({"watch", job});
  EXPECT_EQ(watch.code, 0) << watch.out;
  EXPECT_NE(watch.out.find("final test accuracy"), std::string::npos) << watch.out;
  CliResult status = Cli({"status", job, "-o", "json"});
  EXPECT_EQ(status.code, 0);
  EXPECT_NE(status.out.find("\"state\": \"SUCCEEDED\""), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("\"reason\": \"Scheduled\""), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("\"reason\": \"Completed\""), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("\"final_accuracy\""), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("\"samples_per_s\""), std::string::npos) << status.out;
  CliResult table = Cli({"status", job});
  EXPECT_NE(table.out.find("Succeeded"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("worker-1"), std::string::npos) << table.out;
  CliResult list = Cli({"list"});
  EXPECT_NE(list.out.find(job), std::string::npos) << list.out;
  CliResult cluster = Cli({"cluster"});
  EXPECT_NE(cluster.out.find("shard-0"), std::string::npos) << cluster.out;
  EXPECT_EQ(cluster.out.find("LOST"), std::string::npos) << cluster.out;
  // Prometheus metrics of the coordinator.
  auto metrics_addr = WaitForAddressFile(dir_ + "/metrics.addr", absl::Seconds(10));
  ASSERT_TRUE(metrics_addr.ok());
  const std::string metrics = Scrape(*metrics_addr);
  EXPECT_NE(metrics.find("pstrain_jobs{state=\"Succeeded\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("pstrain_member_up{role=\"worker\",name=\"worker-1\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("pstrain_job_final_accuracy{job=\"" + job + "\""), std::string::npos) << metrics;
  // ... and of a worker: 40 steps split over two workers.
  auto worker_addr = WaitForAddressFile(dir_ + "/worker-1.metrics", absl::Seconds(10));
  ASSERT_TRUE(worker_addr.ok());
  const std::string wm = Scrape(*worker_addr);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(wm, m, std::regex("pstrain_worker_steps_total\\{job=\"" + job +
                                                  "\",rank=\"\\d\"\\} (\\d+)"))) << wm;
  EXPECT_GE(std::stoi(m[1]), 10) << wm;
  EXPECT_NE(wm.find("pstrain_worker_step_seconds_count{job=\"" + job), std::string::npos) << wm;
  EXPECT_NE(wm.find("pstrain_worker_job_running{job=\"" + job + "\",rank=\""), std::string::npos) << wm;
}

// The protos are the public contract: a client generated for Python with
// grpc_python_plugin submits a job, watches it and reads its status.
TEST_F(ControlPlaneTest, PythonClientGeneratedFromTheProtos) {
  if (!std::filesystem::exists("/usr/bin/grpc_python_plugin") ||
      std::system("/usr/bin/python3 -c 'import grpc' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-grpcio or protobuf-compiler-grpc is missing (make setup installs them)";
  }
  const std::string out = dir_ + "/python_client.out";
  const std::string cmd = "/usr/bin/python3 tests/python_client.py . " + coordinator_ + " " +
                          Spec("from-python", 1, 30) + " > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string text = ReadFile(out).value_or("");
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("\"RUNNING\", \"SUCCEEDED\"]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"unknown_job\": \"NOT_FOUND\""), std::string::npos) << text;
}

// The coordinator stalls (SIGSTOP: a stalled node, swapping) for longer
// than a lease while a job runs: when it resumes, its members are not
// declared lost for the heartbeats it could not hear, and the job finishes
// without a restart. (Seen in make test under load: all four members of the
// pods test "lost" at once after a 2.2 s stall, and the job failed.)
TEST_F(ControlPlaneTest, AStalledCoordinatorDoesNotBlameItsMembers) {
  const std::string job = Submit(Spec("stall", 1000, 2000));
  WaitForState(job, "RUNNING", absl::Seconds(60));
  coordinator_process_->Signal(SIGSTOP);
  absl::SleepFor(absl::Seconds(5));  // the lease is 20 x 100 ms
  coordinator_process_->Signal(SIGCONT);
  CliResult watch = Cli({"watch", job});
  EXPECT_EQ(watch.code, 0) << watch.out;
  CliResult status = Cli({"status", job});
  EXPECT_EQ(status.out.find("MemberLost"), std::string::npos) << status.out;
  EXPECT_EQ(status.out.find("restarts:"), std::string::npos) << status.out;  // printed only when > 0
}

TEST_F(ControlPlaneTest, CancelStopsTheJobAndFreesItsMembersForTheNext) {
  const std::string long_job = Submit(Spec("long", 1000, 0));
  WaitForState(long_job, "RUNNING", absl::Seconds(60));
  // A second job waits: the pool is busy (all or nothing).
  const std::string next = Submit(Spec("next", 1, 20));
  EXPECT_EQ(State(next), "PENDING");
  CliResult cancel = Cli({"cancel", long_job});
  EXPECT_EQ(cancel.code, 0) << cancel.out;
  EXPECT_EQ(State(long_job), "CANCELLED");
  CliResult watch = Cli({"watch", next});
  EXPECT_EQ(watch.code, 0) << watch.out;
  // The cancelled job's watch exits non-zero.
  EXPECT_EQ(Cli({"watch", long_job}).code, 1);
}

TEST_F(ControlPlaneTest, JobCompletesAcrossACoordinatorRestart) {
  const std::string job = Submit(Spec("survivor", 1000, 300));
  WaitForState(job, "RUNNING", absl::Seconds(60));
  const int port = std::stoi(coordinator_.substr(coordinator_.rfind(':') + 1));
  coordinator_process_->Signal(SIGKILL);
  coordinator_process_->Wait();
  absl::SleepFor(absl::Milliseconds(500));
  StartCoordinator(port);  // same address: the members find it again
  CliResult watch = Cli({"watch", job}, absl::Seconds(180));
  EXPECT_EQ(watch.code, 0) << watch.out << ReadFile(dir_ + "/coordinator.log").value_or("");
  EXPECT_EQ(State(job), "SUCCEEDED");
}

TEST_F(ControlPlaneTest, ClearErrorsAndExitCodes) {
  CliResult unknown = Cli({"status", "job-424242"});
  EXPECT_EQ(unknown.code, 4) << unknown.out;
  EXPECT_NE(unknown.out.find("job-424242"), std::string::npos);
  const std::string bad = dir_ + "/bad.yaml";
  ASSERT_TRUE(WriteFileAtomically(bad, "workers: many\n").ok());
  CliResult invalid = Cli({"submit", bad});
  EXPECT_EQ(invalid.code, 2) << invalid.out;
  EXPECT_NE(invalid.out.find("workers"), std::string::npos) << invalid.out;
  // Each bad spec is refused with a message naming what is wrong.
  for (const auto& [yaml, words] : std::vector<std::pair<std::string, std::string>>{
           {"model: [unclosed\n", "YAML"},
           {"model: transformer-xxl\n", "transformer-xxl"},
           {"batch_size: -8\n", "batch_size"}}) {
    ASSERT_TRUE(WriteFileAtomically(bad, yaml).ok());
    CliResult r = Cli({"submit", bad});
    EXPECT_EQ(r.code, 2) << yaml << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << yaml << r.out;
  }
  // A job larger than the cluster waits, saying why, and can be cancelled.
  const std::string big = dir_ + "/big.yaml";
  ASSERT_TRUE(WriteFileAtomically(big, "name: big\nmodel: mlp\nworkers: 64\nshards: 1\n"
                                       "data: {format: synthetic}\n").ok());
  const std::string job = Submit(big);
  absl::SleepFor(absl::Milliseconds(500));
  CliResult st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("\"state\": \"PENDING\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("Unschedulable: needs 1 shard(s) and 64 worker(s)"), std::string::npos) << st.out;
  // A small job behind it waits too (strict FIFO), and says for what.
  const std::string small = Submit(Spec("small", 1, 10));
  CliResult behind = Cli({"status", small});
  EXPECT_NE(behind.out.find("Queued behind " + job), std::string::npos) << behind.out;
  EXPECT_EQ(Cli({"cancel", job}).code, 0);
  EXPECT_EQ(State(job), "CANCELLED");
  EXPECT_EQ(Cli({"watch", small}).code, 0);  // then it runs
  // Every member is still there.
  EXPECT_EQ(Cli({"cluster"}).out.find("LOST"), std::string::npos);
  std::vector<std::string> argv = {"client/pstrain", "--coordinator", "127.0.0.1:1", "list"};
  auto child = ChildProcess::Start(argv, dir_ + "/unreachable.out");
  EXPECT_EQ((*child)->Wait(absl::Seconds(60)), 3);
  EXPECT_NE(ReadFile(dir_ + "/unreachable.out")->find("cannot reach the coordinator"), std::string::npos);
}

double FinalAccuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("final test accuracy ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

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
      "name: fmnist\nmodel: mlp\ndata: {format: idx, limit_train: 8000, limit_test: 2000}\n"
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
// resumes from that checkpoint on it.
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
  // A replacement joins; the job resumes from the checkpoint and finishes.
  pool_.push_back(Start("worker-2", {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=worker-2"}));
  CliResult watch = Cli({"watch", job}, absl::Seconds(180));
  EXPECT_EQ(watch.code, 0) << watch.out << Cli({"status", job}).out << Cli({"cluster"}).out << Logs();
  st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("\"reason\": \"Restored\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("worker-2"), std::string::npos) << st.out;
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
  CliResult watch = Cli({"watch", job}, absl::Seconds(180));
  EXPECT_EQ(watch.code, 0) << watch.out << Cli({"status", job}).out << Cli({"cluster"}).out << Logs();
  EXPECT_NE(Cli({"status", job}).out.find("shard-9"), std::string::npos);
}

// All-reduce jobs in the pool: worker 0 writes the checkpoint in the shards'
// format, so it resumes in all-reduce mode and in ps mode (re-partitioned
// onto the shards) alike.
TEST_F(ControlPlaneTest, AllReduceCheckpointResumesInBothModes) {
  const std::string spec = dir_ + "/ar.yaml";
  const std::string yaml = "name: ar\nmode: allreduce\nmodel: mlp\nworkers: 2\n"
                           "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 512}\n"
                           "epochs: 1\nmax_steps: 400\nbatch_size: 16\nlog_every_steps: 5\n";
  ASSERT_TRUE(WriteFileAtomically(spec, yaml).ok());
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 30, absl::Seconds(60)));
  CliResult ck = Cli({"checkpoint", job});
  ASSERT_EQ(ck.code, 0) << ck.out << Cli({"status", job}).out;
  const std::string ckpt = ck.out.substr(0, ck.out.find(' '));
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/shard-0.bin")) << ck.out;
  ASSERT_EQ(Cli({"cancel", job}).code, 0);

  CliResult again = Cli({"restore", "--from", ckpt, "--output_dir", dir_ + "/ar2"});
  ASSERT_EQ(again.code, 0) << again.out;
  const std::string resumed = again.out.substr(0, again.out.find('\n'));
  CliResult w = Cli({"watch", resumed});
  EXPECT_EQ(w.code, 0) << w.out << Cli({"status", resumed}).out;
  CliResult st = Cli({"status", resumed, "-o", "json"});
  EXPECT_NE(st.out.find("loaded from " + ckpt + " by the workers"), std::string::npos) << st.out;

  const std::string ps_spec = dir_ + "/ps.yaml";
  ASSERT_TRUE(WriteFileAtomically(ps_spec, absl::StrReplaceAll(yaml, {{"mode: allreduce", "mode: ps\nshards: 1\n"
                                                                                           "consistency: sync"}}))
                  .ok());
  CliResult as_ps = Cli({"restore", "--from", ckpt, "--spec", ps_spec, "--output_dir", dir_ + "/ps"});
  ASSERT_EQ(as_ps.code, 0) << as_ps.out;
  const std::string ps_job = as_ps.out.substr(0, as_ps.out.find('\n'));
  CliResult w2 = Cli({"watch", ps_job});
  EXPECT_EQ(w2.code, 0) << w2.out << Cli({"status", ps_job}).out;
  st = Cli({"status", ps_job, "-o", "json"});
  EXPECT_NE(st.out.find("onto 1 shard(s)"), std::string::npos) << st.out;
}

// The workers agree on a pause step ahead of where they are; when the job
// ends before it, an all-reduce job has nobody left to write the model: the
// checkpoint is refused and the job still ends (it hung in CHECKPOINTING).
TEST_F(ControlPlaneTest, AllReduceCheckpointPastTheLastStepIsRefusedAndTheJobEnds) {
  const std::string spec = dir_ + "/short.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec, "name: short\nmode: allreduce\nmodel: mlp\nworkers: 2\n"
                                        "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 256}\n"
                                        "epochs: 1\nmax_steps: 60\nbatch_size: 16\nlog_every_steps: 1\n").ok());
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 2));
  CliResult ck = Cli({"checkpoint", job});  // the pause lands at least 20 steps ahead
  if (ck.code != 0) {
    EXPECT_NE(ck.out.find("finished its steps before the checkpoint"), std::string::npos) << ck.out;
  }
  CliResult watch = Cli({"watch", job}, absl::Seconds(60));
  EXPECT_EQ(watch.code, 0) << watch.out << Cli({"status", job}).out;
}

// A rank of a running all-reduce job dies: the other fails fast, and the
// coordinator restarts the job from its last checkpoint once two workers
// are free again.
TEST_F(ControlPlaneTest, AllReduceJobRestartsFromItsCheckpointWhenARankDies) {
  const std::string spec = dir_ + "/ar.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec, "name: ar\nmode: allreduce\nmodel: mlp\nworkers: 2\n"
                                        "data: {format: synthetic, synthetic_train: 60000, synthetic_test: 512}\n"
                                        "epochs: 1\nmax_steps: 600\nbatch_size: 16\nlog_every_steps: 5\n"
                                        "collective_timeout_s: 10\n").ok());
  const std::string job = Submit(spec);
  ASSERT_NO_FATAL_FAILURE(WaitForStep(job, 30));
  ASSERT_EQ(Cli({"checkpoint", job}).code, 0);
  pool_[2]->Signal(SIGKILL);  // worker-1
  pool_[2]->Wait();
  WaitForState(job, "PENDING", absl::Seconds(30));
  CliResult st = Cli({"status", job, "-o", "json"});
  EXPECT_NE(st.out.find("\"reason\": \"WorkerFailed\""), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("a peer left"), std::string::npos) << st.out;
  pool_.push_back(Start("worker-2", {"worker/pstrain-worker", "--coordinator=" + coordinator_, "--name=worker-2",
                                     "--gloo_hostname=127.0.0.1"}));
  CliResult watch = Cli({"watch", job}, absl::Seconds(120));
  EXPECT_EQ(watch.code, 0) << watch.out << Cli({"status", job}).out;
  EXPECT_NE(Cli({"status", job}).out.find("restarts:   1"), std::string::npos);
  auto metrics_addr = WaitForAddressFile(dir_ + "/metrics.addr", absl::Seconds(10));
  ASSERT_TRUE(metrics_addr.ok());
  EXPECT_NE(Scrape(*metrics_addr).find("pstrain_job_restarts{job=\"" + job + "\",name=\"ar\"} 1"),
            std::string::npos);
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
