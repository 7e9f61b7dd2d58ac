// `pstrain local` end to end: real shard and worker processes on 127.0.0.1
// training on real data; Ctrl-C and a failing worker stop everything.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "common/file_util.h"
#include "tests/child_process.h"
#include "tests/local_run_testing.h"
#include "tests/tensorboard_files.h"

namespace pstrain {
namespace {

// Processes whose command line mentions `needle` (to find orphans).
int CountProcessesMentioning(const std::string& needle) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos && std::to_string(getpid()) != pid) ++n;
  }
  return n;
}

// The log of the worker that held rank 0 (ranks follow the coordinator's
// random member order, not the names): its progress events carry no rank
// (proto3's JSON leaves a 0 out), the other ranks' do.
std::string Rank0Log(const std::string& logs) {
  for (const auto& entry : std::filesystem::directory_iterator(logs)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("worker-", 0) != 0) continue;
    std::istringstream log(ReadFile(entry.path().string()).value_or(""));
    bool progress = false, ranked = false;
    for (std::string line; std::getline(log, line);) {
      if (line.find("\"progress\"") == std::string::npos) continue;
      progress = true;
      ranked = ranked || line.find("\"rank\":") != std::string::npos;
    }
    if (progress && !ranked) return entry.path().string();
  }
  ADD_FAILURE() << "no worker log in " << logs << " has rank 0's progress";
  return logs + "/worker-0.log";
}

// The job's TensorBoard run (one attempt: one run of one file) read by the
// independent reader: every record's CRCs hold; the spec is there as text;
// each of rank 0's loss and learning-rate points is one its worker reported
// (its log prints every event), at the same step, and most of them arrived
// (progress may be dropped when the coordinator is slow, by design); the
// last evaluation is the final accuracy the CLI printed.
void ExpectEventFilesMatchTheRun(const std::string& logdir, const std::string& worker0_log, double final_accuracy) {
  if (!HaveEventReader()) {
    std::fprintf(stderr, "event files not checked: python3-crc32c or python3-protobuf is missing\n");
    return;
  }
  ASSERT_TRUE(std::filesystem::is_directory(logdir + "/attempt-1")) << logdir;
  std::vector<EventFile> files = ReadRun(logdir + "/attempt-1");
  ASSERT_EQ(files.size(), 1u);
  const EventFile& f = files[0];
  ASSERT_TRUE(f.read);
  EXPECT_EQ(f.file_version, "brain.Event:2");
  EXPECT_EQ(f.partial_tail_bytes, 0);
  EXPECT_NE(f.text.at("job/spec").find("name: e2e"), std::string::npos);
  std::map<int64_t, std::pair<float, float>> reported;  // step -> (loss, lr) from rank 0's log
  std::regex progress_re("\"step\":\"(\\d+)\".*\"loss\":([-0-9.e]+).*\"lr\":([-0-9.e]+)");
  std::istringstream log(ReadFile(worker0_log).value_or(""));
  for (std::string line; std::getline(log, line);) {
    std::smatch p;
    if (line.find("\"progress\"") != std::string::npos && std::regex_search(line, p, progress_re)) {
      reported[std::stoll(p[1])] = {std::stof(p[2]), std::stof(p[3])};
    }
  }
  ASSERT_GE(reported.size(), 10u) << worker0_log;
  const auto& loss = f.scalars.at("rank_0/loss");
  EXPECT_GE(loss.size(), reported.size() / 2);
  for (const auto& [step, value] : loss) {
    ASSERT_EQ(reported.count(step), 1u) << "step " << step << " was not reported by rank 0";
    EXPECT_FLOAT_EQ(value, reported[step].first) << "step " << step;
  }
  for (const auto& [step, value] : f.scalars.at("train/learning_rate")) {
    EXPECT_FLOAT_EQ(value, reported.at(step).second) << "step " << step;
  }
  for (const char* tag : {"train/loss", "train/samples_per_s", "train/step_time_ms", "train/exchange_wait_ms",
                          "rank_1/loss", "shard_0/call_ms", "shard_1/bytes_per_s"}) {
    EXPECT_EQ(f.scalars.count(tag), 1u) << tag;
  }
  const auto& accuracy = f.scalars.at("eval/accuracy");
  ASSERT_EQ(accuracy.size(), 2u);  // after epoch 1, and the final one
  EXPECT_NEAR(accuracy.back().second, final_accuracy, 1e-4);
}

TEST(LocalRunTest, TrainsLeNetOnAFashionMnistSubsetWithTwoShardsAndTwoWorkers) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  const std::string dir = MakeTempDir("local-run");
  const std::string spec = WriteSpec(dir, R"(
name: e2e
model: lenet
data: {format: idx, limit_train: 16000, limit_test: 2000}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
consistency: async
workers: 2
shards: 2
epochs: 2
batch_size: 32
log_every_steps: 25
)");
  RunOutput run = RunPstrain({"local", spec, "--output_dir", dir + "/out", "--data_root", kDataRoot}, dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Plain progress lines (stdout is not a terminal): the loss falls.
  std::regex loss_re("step (\\d+)/(\\d+)  loss ([0-9.]+)");
  std::vector<double> losses;
  for (std::sregex_iterator it(run.output.begin(), run.output.end(), loss_re), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[3]));
  }
  ASSERT_GE(losses.size(), 2u) << run.output;
  EXPECT_LT(losses.back(), 0.7 * losses.front()) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.output, m, std::regex("final test accuracy ([0-9.]+)"))) << run.output;
  EXPECT_GT(std::stod(m[1]), 0.6) << "chance is 0.1\n" << run.output;  // 500 steps of 32
  EXPECT_NE(run.output.find("eval     epoch 1"), std::string::npos) << run.output;
  // The weights lie in the job's own directory under the output_dir.
  std::smatch w;
  ASSERT_TRUE(std::regex_search(run.output, w, std::regex("weights: (\\S+/out/job-[0-9]+/model.pt)"))) << run.output;
  const std::string weights = w[1];
  ASSERT_TRUE(std::filesystem::exists(weights)) << weights;
  // The weights are a file Python's torch.load reads, with the model's
  // parameter names; the model rebuilt in Python from them scores the
  // accuracy the job reported.
  EXPECT_NEAR(PythonAccuracy(weights, "lenet", 2000, dir), std::stod(m[1]), 0.0006) << run.output;

  // The dashboard was announced, and where the curves are.
  EXPECT_TRUE(std::regex_search(run.output, std::regex("dashboard: http://127\\.0\\.0\\.1:[0-9]+/"))) << run.output;
  std::smatch tb;
  ASSERT_TRUE(std::regex_search(run.output, tb, std::regex("curves: tensorboard --logdir (\\S+)"))) << run.output;
  ExpectEventFilesMatchTheRun(tb[1], Rank0Log(dir + "/out/logs"), std::stod(m[1]));
}

// `pstrain local --secure`: every process speaks TLS and sends its token;
// a sync job (the shards' barrier, the coordinator's calls to the shards)
// trains as it does in the clear.
TEST(LocalRunTest, SecureRunTrainsOverTlsWithTokens) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  const std::string dir = MakeTempDir("local-secure");
  const std::string spec = WriteSpec(dir, R"(
name: secure
model: lenet
data: {format: idx, limit_train: 6400, limit_test: 1000}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
consistency: sync
workers: 2
shards: 1
epochs: 1
batch_size: 32
log_every_steps: 25
)");
  RunOutput run =
      RunPstrain({"local", "--secure", spec, "--output_dir", dir + "/out", "--data_root", kDataRoot}, dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.output, m, std::regex("final test accuracy ([0-9.]+)"))) << run.output;
  EXPECT_GT(std::stod(m[1]), 0.5) << run.output;
  const std::string coordinator_log = ReadFile(dir + "/out/logs/coordinator.log").value_or("");
  EXPECT_NE(coordinator_log.find("TLS, 6 tokens"), std::string::npos) << coordinator_log;
  const std::string shard_log = ReadFile(dir + "/out/logs/shard-0.log").value_or("");
  EXPECT_NE(shard_log.find("TLS, 6 tokens"), std::string::npos) << shard_log;
  // The shard checks the coordinator's grants: it has the public key.
  EXPECT_EQ(shard_log.find("no --table_grant_public_key_file"), std::string::npos) << shard_log;
  // Keys and tokens readable by their owner only.
  struct stat st {};
  ASSERT_EQ(stat((dir + "/out/credentials/member-key.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  ASSERT_EQ(stat((dir + "/out/credentials/tokens.csv").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  // No token in any log.
  for (const char* token : {"cluster.token", "user.token", "admin.token", "shard.token", "worker.token",
                            "coordinator.token"}) {
    const std::string t(absl::StripAsciiWhitespace(ReadFile(dir + "/out/credentials/" + token).value_or("")));
    ASSERT_FALSE(t.empty());
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/out/logs")) {
      EXPECT_EQ(ReadFile(entry.path().string()).value_or("").find(t), std::string::npos) << entry.path();
    }
    EXPECT_EQ(run.output.find(t), std::string::npos);
  }
}

// The all-reduce example as committed: LeNet, 2 workers, 3 epochs, Gloo.
TEST(LocalRunTest, AllReduceExampleReachesItsAccuracyAndCheckpoints) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  const std::string dir = MakeTempDir("local-allreduce");
  RunOutput run;
  EXPECT_GE(RunExampleAccuracy("examples/fashion_mnist_allreduce.yaml", dir, &run), 0.88) << run.output;
  std::smatch m;
  // Periodic checkpoints, written by worker 0 in the shards' format.
  ASSERT_TRUE(std::regex_search(run.output, m, std::regex("saved in (\\S+)"))) << run.output;
  EXPECT_TRUE(std::filesystem::exists(m[1].str() + "/manifest.json")) << m[1];
  EXPECT_TRUE(std::filesystem::exists(m[1].str() + "/shard-0.bin")) << m[1];
}

// Launched the torchrun way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no
// coordinator): SIGKILL one rank mid-run and the other fails fast with a
// clear error instead of hanging.
TEST(LocalRunTest, AllReduceRankKilledTheOtherFailsFast) {
  const std::string dir = MakeTempDir("allreduce-kill");
  const std::string log = KillRankOneMidRun(dir);
  EXPECT_NE(log.find("a peer left"), std::string::npos) << log;
}

// backend: nccl needs CUDA tensors; without a GPU the worker trains on the CPU, so
// the job is refused before training starts, saying why.
TEST(LocalRunTest, AllReduceNcclOnTheCpuTrainerIsAClearError) {
  const std::string dir = MakeTempDir("allreduce-nccl");
  const std::string spec = WriteSpec(dir, "name: n\nmode: allreduce\nbackend: nccl\nmodel: mlp\nworkers: 1\n"
                                          "data: {format: synthetic}\n");
  const int port = 20000 + (getpid() + 7) % 20000;
  auto child = ChildProcess::Start({"/usr/bin/env", "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port), "worker/pstrain-worker",
                                    "--spec=" + spec, "--gloo_hostname=127.0.0.1"},
                                   dir + "/worker.log");
  ASSERT_TRUE(child.ok());
  EXPECT_EQ((*child)->Wait(absl::Seconds(60)), 1);
  const std::string log = ReadFile(dir + "/worker.log").value_or("");
  EXPECT_NE(log.find("backend nccl reduces CUDA tensors, but this worker trains on cpu"), std::string::npos) << log;
}

TEST(LocalRunTest, CtrlCStopsEveryChildAndExits130) {
  const std::string dir = MakeTempDir("local-interrupt");
  const std::string spec = WriteSpec(dir, R"(
name: long
model: mlp
data: {format: synthetic, synthetic_train: 60000, synthetic_test: 100}
workers: 2
shards: 2
epochs: 100
log_every_steps: 10
)");
  auto child = ChildProcess::Start({kPstrain, "local", spec, "--output_dir", dir + "/out"},
                                   dir + "/pstrain.out");
  ASSERT_TRUE(child.ok());
  // Wait for training to be under way.
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (ReadFile(dir + "/pstrain.out").value_or("").find("step ") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << ReadFile(dir + "/pstrain.out").value_or("");
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Every shard and worker points at the run's coordinator.
  auto coordinator = ReadFile(dir + "/out/logs/coordinator.addr");
  ASSERT_TRUE(coordinator.ok());
  const std::string needle = "--coordinator=" + coordinator->substr(0, coordinator->find('\n'));
  EXPECT_EQ(CountProcessesMentioning(needle), 4);  // 2 shards + 2 workers
  (*child)->Signal(SIGINT);
  EXPECT_EQ((*child)->Wait(absl::Seconds(20)), 130);
  EXPECT_EQ(CountProcessesMentioning(needle), 0) << "orphaned shard or worker processes";
  EXPECT_EQ(CountProcessesMentioning(dir), 0) << "orphaned coordinator";
}

TEST(LocalRunTest, AFailingWorkerStopsTheJobAndShowsItsLog) {
  const std::string dir = MakeTempDir("local-fail");
  const std::string spec = WriteSpec(dir, R"(
name: broken
model: "torchscript:nonexistent/model.pt"
data: {format: synthetic}
workers: 2
shards: 1
)");
  RunOutput run = RunPstrain({"local", spec, "--output_dir", dir + "/out", "--data_root", dir}, dir);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("worker-"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("nonexistent/model.pt"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("--data_root"), std::string::npos) << run.output;
  EXPECT_EQ(CountProcessesMentioning(dir), 0);
}

TEST(LocalRunTest, BadSpecIsRefusedBeforeAnythingStarts) {
  const std::string dir = MakeTempDir("local-badspec");
  const std::string spec = WriteSpec(dir, "model: lenet\nepochs: 3\nbatchsize: 64\n");
  RunOutput run = RunPstrain({"local", spec, "--output_dir", dir + "/out"}, dir);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("batchsize"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/out/logs"));
}

// A spec naming a file no worker may read (absolute, or out of the data
// root with ..) is refused before anything starts, saying what to do.
TEST(LocalRunTest, FilesOutsideTheDataRootAreRefusedBeforeAnythingStarts) {
  const std::string dir = MakeTempDir("local-outside");
  for (const char* yaml : {"data: {format: idx, dir: /usr/share/datasets/fashion-mnist}\n",
                           "data: {format: idx, train_images: ../../etc/passwd}\n",
                           "model: torchscript:/var/run/secrets/pstrain/token\ndata: {format: synthetic}\n"}) {
    const std::string spec = WriteSpec(dir, yaml);
    RunOutput run = RunPstrain({"local", spec, "--output_dir", dir + "/out"}, dir);
    EXPECT_EQ(run.exit_code, 2) << yaml << run.output;
    EXPECT_NE(run.output.find("--data_root"), std::string::npos) << run.output;
    EXPECT_FALSE(std::filesystem::exists(dir + "/out/logs"));
  }
}

}  // namespace
}  // namespace pstrain
