// Pipelined jobs (issue 35) as users run them: the examples through
// `pstrain local` (a coordinator, four worker processes, real data; on
// shards too), and
// two stages launched the torchrun way with one of them killed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "common/file_util.h"
#include "tests/child_process.h"
#include "tests/local_run_testing.h"

namespace pstrain {
namespace {

// Runs `example` through `pstrain local` on Fashion-MNIST: at least 0.86
// test accuracy, and PyTorch scores the model.pt it writes alike.
void ExpectExampleTrainsAndScoresAlike(const std::string& example, RunOutput* run) {
  const std::string dir = MakeTempDir("pipeline-example");
  const double accuracy = RunExampleAccuracy(example, dir, run);
  EXPECT_GE(accuracy, 0.86) << run->output;
  std::smatch w;
  ASSERT_TRUE(std::regex_search(run->output, w, std::regex("weights: (\\S+/model.pt)"))) << run->output;
  EXPECT_NEAR(PythonAccuracy(w[1], "lenet", 10000, dir), accuracy, 0.0006);
}

// The example as committed: LeNet in 2 stages x 2 replicas, 4 micro-batches,
// 1F1B, 2 epochs. Rank 0 reports the accuracy the last stage measured, and
// writes the whole model.
TEST(PipelineJobTest, TheExampleTrainsThroughTheStagesAndWritesTheWholeModel) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  RunOutput run;
  ExpectExampleTrainsAndScoresAlike("examples/fashion_mnist_pipeline.yaml", &run);
  EXPECT_NE(run.output.find("eval     epoch 1"), std::string::npos) << run.output;
  // Progress: the loss is the last stage's (the others compute none).
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(run.output, loss, std::regex("step 900/938  loss ([0-9.]+)"))) << run.output;
  EXPECT_GT(std::stod(loss[1]), 0.05) << run.output;
  EXPECT_LT(std::stod(loss[1]), 0.6) << run.output;
}

// The same on parameter servers: 2 shards hold the whole model, each rank
// pushes and pulls its stage's parameters (docs/pipeline.md).
TEST(PipelineJobTest, ThePsExampleTrainsItsStagesOnTheShards) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  RunOutput run;
  ExpectExampleTrainsAndScoresAlike("examples/fashion_mnist_pipeline_ps.yaml", &run);
}

// Launched the torchrun way: SIGKILL stage 1 mid-run, and stage 0, waiting on
// it for a gradient (also with fewer micro-batches than stages), fails
// within collective_timeout_s with an error that says a peer left; it never
// hangs.
void KillStageOne(int micro_batches) {
  SCOPED_TRACE(::testing::Message() << "micro_batches " << micro_batches);
  const std::string dir = MakeTempDir("pipeline-kill");
  const std::string log =
      KillRankOneMidRun(dir, "pipeline: {stages: 2, micro_batches: " + std::to_string(micro_batches) + "}\n");
  EXPECT_TRUE(log.find("a peer left") != std::string::npos || log.find("waited") != std::string::npos) << log;
}

TEST(PipelineJobTest, ALostStageFailsItsNeighbourInsteadOfHangingIt) {
  KillStageOne(1);  // fewer micro-batches than stages
  KillStageOne(4);
}

}  // namespace
}  // namespace pstrain
