// Quantization-aware training end to end (and each job's own int8 export,
// `quantization: {export: static}`): `pstrain local` trains the MLP on
// Fashion-MNIST twice, in fp32 and with `quantization: {mode: qat}`; the
// QAT job's final weights carry its quantizers, pstrain-quantize converts
// them to a static int8 module with the learned scales (no calibration),
// and Python's torch.jit.load scores it on the 10,000 test images within a
// point of the fp32 job (the target is 0.5; the margin is for other CPUs)
// and within 0.3 point of the accuracy the QAT job reported from its
// fake-quantized evaluation (int8 kernels round where fake quantization
// does).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/file_util.h"
#include "tests/child_process.h"

namespace pstrain {
namespace {

struct ChildRun {
  int code;
  std::string output;
};

ChildRun RunChild(const std::vector<std::string>& argv, const std::string& log) {
  auto child = ChildProcess::Start(argv, log);
  EXPECT_TRUE(child.ok());
  if (!child.ok()) return {-1, ""};
  const int code = (*child)->Wait(absl::Minutes(5));
  return {code, ReadFile(log).value_or("")};
}

std::string Spec(bool qat) {
  return std::string(R"(name: qat-test
model: mlp
data: {format: idx, dir: fashion-mnist}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
lr_schedule: {kind: cosine}
mode: ps
workers: 1
shards: 1
epochs: 2
batch_size: 64
seed: 42
)") + (qat ? "quantization: {mode: qat, start_step: 200, export: static}\n"
             : "quantization: {export: static, calibration: 256}\n");
}

TEST(QatJobTest, AQatJobExportsAnInt8ModelThatScoresLikeFp32) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is missing under /usr/share/datasets (make setup)";
  }
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is missing (make setup installs it)";
  }
  const std::string dir = ::testing::TempDir() + "/qat_job";
  std::filesystem::create_directories(dir);
  std::string weights[2];
  double reported[2];
  for (int qat = 0; qat < 2; ++qat) {
    const std::string name = qat ? "qat" : "fp32";
    ASSERT_TRUE(WriteFileAtomically(dir + "/" + name + ".yaml", Spec(qat)).ok());
    ChildRun run = RunChild({"client/pstrain", "local", dir + "/" + name + ".yaml", "--output_dir", dir + "/" + name,
                             "--data_root", "/usr/share/datasets"},
                            dir + "/" + name + ".log");
    ASSERT_EQ(run.code, 0) << run.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.output, m, std::regex("final test accuracy ([0-9.]+)"))) << run.output;
    reported[qat] = std::stod(m[1]);
    ASSERT_TRUE(std::regex_search(run.output, m, std::regex("weights: (\\S+/model.pt)"))) << run.output;
    weights[qat] = m[1];
  }
  const std::string int8 = dir + "/qat-int8.pt";
  ChildRun convert = RunChild({"quantize/pstrain-quantize", "auto", weights[1], int8, "static"}, dir + "/convert.log");
  ASSERT_EQ(convert.code, 0) << convert.output;
  EXPECT_NE(convert.output.find("\"qat_scales\": true"), std::string::npos) << convert.output;
  // The fp32 job's weights have no quantizers: static mode needs calibration.
  ChildRun refused =
      RunChild({"quantize/pstrain-quantize", "auto", weights[0], dir + "/x.pt", "static"}, dir + "/r.log");
  EXPECT_EQ(refused.code, 1) << refused.output;
  EXPECT_NE(refused.output.find("--calibration"), std::string::npos) << refused.output;
  // Each job's own int8 model (quantization.export: static): the fp32
  // job's calibrated on its first 256 training images, the QAT job's with
  // its learned scales, beside its weights.
  std::string job_int8[2];
  for (int qat = 0; qat < 2; ++qat) {
    job_int8[qat] = std::filesystem::path(weights[qat]).parent_path().string() + "/model-int8.pt";
    ASSERT_TRUE(std::filesystem::exists(job_int8[qat])) << job_int8[qat];
  }
  ChildRun score = RunChild({"/usr/bin/python3", "tests/quantize_models.py", "score", "mlp", weights[0], "1.0", int8,
                             job_int8[0], job_int8[1]},
                            dir + "/score.log");
  EXPECT_EQ(score.code, 0) << score.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(score.output, m, std::regex("qat-int8.pt\": ([0-9.]+)"))) << score.output;
  const double int8_accuracy = std::stod(m[1]);
  EXPECT_NEAR(int8_accuracy, reported[1], 0.003) << score.output;
  std::printf("fp32 job %.4f, QAT job (fake-quantized) %.4f, its int8 module %.4f\n", reported[0], reported[1],
              int8_accuracy);
  // The QAT job converted itself with the same scales pstrain-quantize used.
  ASSERT_TRUE(std::regex_search(score.output, m, std::regex("qat/[^\"]*model-int8.pt\": ([0-9.]+)"))) << score.output;
  EXPECT_EQ(std::stod(m[1]), int8_accuracy) << score.output;
  std::printf("%s\n", score.output.c_str());
}

// Two workers (processes, Gloo over sockets), in all-reduce mode and as
// SYNC parameter-server workers: their observers take the range of both
// ranks' batches (worker/qat_model.h; in ps mode over a group of their own;
// the trainer tests check that both ranks' quantizers are equal), the job
// trains to an fp32-like accuracy, and its quantizers convert to int8.
TEST(QatJobTest, TwoWorkerQatJobsTrainAndConvertInBothModes) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is missing under /usr/share/datasets (make setup)";
  }
  for (const std::string mode : {"mode: allreduce\nconsistency: sync\nworkers: 2\nshards: 0\n",
                                 "mode: ps\nconsistency: sync\nworkers: 2\nshards: 1\n"}) {
    const bool allreduce = mode.find("allreduce") != std::string::npos;
    SCOPED_TRACE(allreduce ? "all-reduce" : "ps, sync");
    const std::string dir = ::testing::TempDir() + (allreduce ? "/qat_allreduce" : "/qat_ps_sync");
    std::filesystem::create_directories(dir);
    std::string spec = Spec(true);
    spec = std::regex_replace(spec, std::regex("mode: ps\nworkers: 1\nshards: 1\nepochs: 2\n"), mode + "epochs: 1\n");
    ASSERT_NE(spec.find("workers: 2"), std::string::npos) << spec;
    ASSERT_TRUE(WriteFileAtomically(dir + "/job.yaml", spec).ok());
    ChildRun run = RunChild({"client/pstrain", "local", dir + "/job.yaml", "--output_dir", dir + "/out",
                             "--data_root", "/usr/share/datasets"},
                            dir + "/job.log");
    ASSERT_EQ(run.code, 0) << run.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.output, m, std::regex("final test accuracy ([0-9.]+)"))) << run.output;
    EXPECT_GT(std::stod(m[1]), 0.82) << run.output;  // one epoch of the MLP in fp32: ~0.85
    std::printf("2-worker %s QAT job: final test accuracy %s\n", allreduce ? "all-reduce" : "ps sync",
                m[1].str().c_str());
    ASSERT_TRUE(std::regex_search(run.output, m, std::regex("weights: (\\S+/model.pt)"))) << run.output;
    ChildRun convert =
        RunChild({"quantize/pstrain-quantize", "auto", m[1], dir + "/int8.pt", "static"}, dir + "/convert.log");
    ASSERT_EQ(convert.code, 0) << convert.output;
    EXPECT_NE(convert.output.find("\"qat_scales\": true"), std::string::npos) << convert.output;
  }
}

}  // namespace
}  // namespace pstrain
