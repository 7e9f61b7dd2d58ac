#include "common/file_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace pstrain {
namespace {

TEST(FileUtilTest, WritesWholeFileAndLeavesNoTemporary) {
  const std::string dir = ::testing::TempDir() + "/file_util_test";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/out";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second, longer").ok());
  EXPECT_EQ(*ReadFile(path), "second, longer");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(FileUtilTest, ReportsUnwritableDirectory) {
  absl::Status s = WriteFileAtomically("/nonexistent-dir/x", "data");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir"), absl::string_view::npos);
  EXPECT_EQ(ReadFile("/nonexistent-dir/x").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pstrain
