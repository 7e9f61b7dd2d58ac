// Helpers of the tests that run the binaries as a user does: `pstrain local`
// (coordinator, shards and workers as processes), or workers launched the
// torchrun way.
#ifndef PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_
#define PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

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

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_LOCAL_RUN_TESTING_H_
