// Pipelined jobs (issue 35) as users run them: the example through
// `pstrain local` (a coordinator, four worker processes, real data), and
// two stages launched the torchrun way with one of them killed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "common/file_util.h"
#include "tests/child_process.h"
#include "tests/local_run_testing.h"

namespace pstrain {
namespace {

// The example as committed: LeNet in 2 stages x 2 replicas, 4 micro-batches,
// 1F1B, 2 epochs. Rank 0 reports the accuracy the last stage measured, and
// writes the whole model, which PyTorch loads and scores alike.
TEST(PipelineJobTest, TheExampleTrainsThroughTheStagesAndWritesTheWholeModel) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  const std::string dir = MakeTempDir("pipeline-example");
  RunOutput run = RunPstrain(
      {"local", "examples/fashion_mnist_pipeline.yaml", "--output_dir", dir + "/out", "--data_root", kDataRoot}, dir);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.output, m, std::regex("final test accuracy ([0-9.]+)"))) << run.output;
  std::printf("pipeline example: final test accuracy %s\n", m[1].str().c_str());
  EXPECT_GE(std::stod(m[1]), 0.86) << run.output;
  EXPECT_NE(run.output.find("eval     epoch 1"), std::string::npos) << run.output;
  // Progress: the loss is the last stage's (the others compute none).
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(run.output, loss, std::regex("step 900/938  loss ([0-9.]+)"))) << run.output;
  EXPECT_GT(std::stod(loss[1]), 0.05) << run.output;
  EXPECT_LT(std::stod(loss[1]), 0.6) << run.output;
  std::smatch w;
  ASSERT_TRUE(std::regex_search(run.output, w, std::regex("weights: (\\S+/model.pt)"))) << run.output;
  const std::string cmd =
      "/usr/bin/python3 tests/eval_exported.py " + w[1].str() + " lenet 10000 > " + dir + "/py.out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadFile(dir + "/py.out").value_or("");
  const std::string py_out = ReadFile(dir + "/py.out").value_or("");
  std::smatch py;
  ASSERT_TRUE(std::regex_search(py_out, py, std::regex("accuracy ([0-9.]+)"))) << py_out;
  EXPECT_NEAR(std::stod(py[1]), std::stod(m[1]), 0.0006) << py_out;
}

// Launched the torchrun way: SIGKILL stage 1 mid-run, and stage 0, waiting on
// it for a gradient (also with fewer micro-batches than stages), fails
// within collective_timeout_s with an error that says a peer left; it never
// hangs.
void KillStageOne(int micro_batches) {
  SCOPED_TRACE(::testing::Message() << "micro_batches " << micro_batches);
  const std::string dir = MakeTempDir("pipeline-kill");
  const std::string spec = WriteSpec(dir, R"(
name: kill
mode: allreduce
model: mlp
data: {format: synthetic, synthetic_train: 60000, synthetic_test: 100}
workers: 2
pipeline: {stages: 2, micro_batches: )" + std::to_string(micro_batches) + R"(}
epochs: 100
batch_size: 16
collective_timeout_s: 10
log_every_steps: 10
)");
  const int port = 20000 + (getpid() + micro_batches) % 20000;
  const std::string log = KillRankOneMidRun(spec, dir, port);
  EXPECT_TRUE(log.find("a peer left") != std::string::npos || log.find("waited") != std::string::npos) << log;
}

TEST(PipelineJobTest, ALostStageFailsItsNeighbourInsteadOfHangingIt) {
  KillStageOne(1);  // fewer micro-batches than stages
  KillStageOne(4);
}

}  // namespace
}  // namespace pstrain
