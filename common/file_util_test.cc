#include "common/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

// One table from errno to the code that tells a caller what to do:
// permanent file errors are never UNAVAILABLE (which clients retry).
TEST(FileUtilTest, ErrnoMapsToCodesByWhatTheCallerShouldDo) {
  const std::vector<std::pair<int, absl::StatusCode>> table = {
      {ENOENT, absl::StatusCode::kNotFound},          {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied},   {EROFS, absl::StatusCode::kPermissionDenied},
      {ENOSPC, absl::StatusCode::kResourceExhausted}, {EDQUOT, absl::StatusCode::kResourceExhausted},
      {EMFILE, absl::StatusCode::kResourceExhausted}, {ENOMEM, absl::StatusCode::kResourceExhausted},
      {EEXIST, absl::StatusCode::kAlreadyExists},     {ENOTDIR, absl::StatusCode::kInvalidArgument},
      {EISDIR, absl::StatusCode::kInvalidArgument},   {ELOOP, absl::StatusCode::kInvalidArgument},
      {ENAMETOOLONG, absl::StatusCode::kInvalidArgument}, {EINTR, absl::StatusCode::kUnavailable},
      {EAGAIN, absl::StatusCode::kUnavailable},       {EIO, absl::StatusCode::kDataLoss},
      {EXDEV, absl::StatusCode::kInternal},
  };
  for (const auto& [err, code] : table) {
    absl::Status s = ErrnoToStatus(err, "cannot open", "/some/file");
    EXPECT_EQ(s.code(), code) << std::strerror(err);
    EXPECT_NE(s.message().find("cannot open /some/file: "), absl::string_view::npos) << s;
  }
  // A hostile path is quoted as a bounded prefix with control bytes escaped.
  absl::Status s = ErrnoToStatus(ENOENT, "cannot open", std::string(100000, 'x') + "\x1b[2J");
  EXPECT_LT(s.message().size(), 400u);
  EXPECT_EQ(s.message().find('\x1b'), std::string::npos);
}

TEST(FileUtilTest, ReadRegularFileIsBoundedAndNeverBlocks) {
  const std::string dir = ::testing::TempDir() + "/read_regular";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "12345").ok());
  EXPECT_EQ(*ReadRegularFile(dir + "/f", 5), "12345");
  EXPECT_EQ(ReadRegularFile(dir + "/f", 4).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string fifo = dir + "/fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ReadRegularFile(fifo, 100).status().code(), absl::StatusCode::kInvalidArgument);  // no writer: no wait
  EXPECT_EQ(ReadRegularFile("/dev/zero", 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile(dir, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile(dir + "/missing", 100).status().code(), absl::StatusCode::kNotFound);
}

TEST(FileUtilTest, ResolveUnderRootRefusesEveryWayOut) {
  const std::string root = *CanonicalRoot(::testing::TempDir() + "/resolve_root");
  EXPECT_EQ(*ResolveUnderRoot(root, "a/b.bin"), root + "/a/b.bin");
  for (const std::string& bad : {std::string(""), std::string("/etc/passwd"), std::string("../x"),
                                 std::string("a/../../x"), std::string("a/./b"), std::string("a\0b", 3),
                                 std::string("a\nb"), std::string(5000, 'a')}) {
    EXPECT_EQ(ResolveUnderRoot(root, bad).status().code(), absl::StatusCode::kInvalidArgument) << bad.substr(0, 20);
  }
  std::error_code ec;
  std::filesystem::remove(root + "/out", ec);
  std::filesystem::create_directory_symlink("/usr", root + "/out");
  EXPECT_EQ(ResolveUnderRoot(root, "out/lib/x").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(ResolveUnderRoot("/", "usr/lib/x").ok());  // "/" holds everything
}

}  // namespace
}  // namespace pstrain
