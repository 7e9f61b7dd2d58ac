// A recommendation job end to end: `pstrain local` runs the committed
// examples/criteo_synth.yaml -- DLRM, 26 embedding tables on 2 real shard
// processes, 2 worker processes, ASYNC -- on Criteo-format data that
// criteo_gen plants, and the job reports a test AUC near the data's best.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "tests/child_process.h"

namespace pstrain {
namespace {

int RunChild(const std::vector<std::string>& argv, const std::string& log, absl::Duration timeout) {
  auto child = ChildProcess::Start(argv, log);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? (*child)->Wait(timeout) : -1;
}

TEST(CtrLocalTest, TheCriteoExampleLearnsThePlantedModel) {
  const std::string dir = MakeTempDir("ctr-local");
  std::filesystem::create_directories(dir + "/data/criteo");
  ASSERT_EQ(RunChild({"worker/criteo_gen", "--id_space", "50", "--train_examples", "100000", "--test_examples", "5000",
                 "--out_train", dir + "/data/criteo/train.tsv", "--out_test", dir + "/data/criteo/test.tsv",
                 "--out_meta", dir + "/data/criteo/meta.txt"},
                dir + "/gen.out", absl::Minutes(2)),
            0)
      << ReadFile(dir + "/gen.out").value_or("");
  const int code = RunChild({"client/pstrain", "local", "examples/criteo_synth.yaml", "--output_dir", dir + "/out",
                        "--data_root", dir + "/data"},
                       dir + "/pstrain.out", absl::Minutes(6));
  const std::string out = ReadFile(dir + "/pstrain.out").value_or("");
  ASSERT_EQ(code, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test AUC ([0-9.]+)"))) << out;
  std::printf("criteo example: final test AUC %s (the planted model's Bayes AUC: see %s/data/criteo/meta.txt)\n",
              m[1].str().c_str(), dir.c_str());
  EXPECT_GT(std::stod(m[1]), 0.68) << out;  // chance 0.5; Bayes about 0.78
}

}  // namespace
}  // namespace pstrain
