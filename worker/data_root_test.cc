#include "worker/data_root.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "common/file_util.h"
#include "worker/model.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

void WriteGzip(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A root with a file in it, and a file beside the root that it must not reach.
class DataRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(::testing::TempDir()) / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(base_);
    fs::create_directories(base_ / "root" / "sub");
    fs::create_directories(base_ / "outside");
    root_.dir = (base_ / "root").string();
    ASSERT_TRUE(WriteFileAtomically(root_.dir + "/sub/ok.txt", "hello").ok());
    ASSERT_TRUE(WriteFileAtomically((base_ / "outside" / "secret").string(), "token").ok());
  }
  absl::StatusCode Code(const std::string& name, bool gzip = true) {
    return ReadDataFile(root_, name, gzip).status().code();
  }
  fs::path base_;
  DataRoot root_;
};

TEST_F(DataRootTest, ReadsAFileUnderTheRootAndALinkThatStaysInIt) {
  auto ok = ReadDataFile(root_, "sub/ok.txt", true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "hello");
  fs::create_symlink("sub/ok.txt", fs::path(root_.dir) / "alias.txt");
  auto alias = ReadDataFile(root_, "alias.txt", true);
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_EQ(*alias, "hello");
  WriteGzip(root_.dir + "/sub/z.gz", "compressed");
  EXPECT_EQ(*ReadDataFile(root_, "sub/z.gz", true), "compressed");
}

TEST_F(DataRootTest, RefusesAbsoluteAndDotDotNames) {
  const std::string secret = (base_ / "outside" / "secret").string();
  EXPECT_EQ(Code(secret), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code("../outside/secret"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code("sub/../../outside/secret"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(std::string("sub/ok.txt\0x", 12)), absl::StatusCode::kInvalidArgument);
  absl::Status s = ReadDataFile(root_, secret, true).status();
  EXPECT_NE(s.message().find("--data_root"), absl::string_view::npos) << s;
}

TEST_F(DataRootTest, RefusesSymbolicLinksThatLeaveTheRoot) {
  fs::create_symlink(base_ / "outside", fs::path(root_.dir) / "escape");
  fs::create_symlink(base_ / "outside" / "secret", fs::path(root_.dir) / "secret");
  EXPECT_EQ(Code("escape/secret"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Code("secret"), absl::StatusCode::kPermissionDenied);
  // A link to a device leaves the root too.
  fs::create_symlink("/dev/zero", fs::path(root_.dir) / "zero");
  EXPECT_EQ(Code("zero"), absl::StatusCode::kPermissionDenied);
}

TEST_F(DataRootTest, RefusesWhatIsNotARegularFileWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root_.dir + "/fifo").c_str(), 0600), 0);
  absl::Status s = ReadDataFile(root_, "fifo", true).status();  // no writer: would block forever
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not a regular file"), absl::string_view::npos) << s;
  EXPECT_EQ(Code("sub"), absl::StatusCode::kInvalidArgument);
}

TEST_F(DataRootTest, RootIsTheDevices) {
  // Even an operator's --data_root=/dev reads no device.
  DataRoot dev{"/dev", 1 << 20};
  EXPECT_EQ(ReadDataFile(dev, "zero", true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadDataFile(dev, "null", false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DataRootTest, RefusesAFileOverTheBound) {
  root_.max_file_bytes = 100;
  ASSERT_TRUE(WriteFileAtomically(root_.dir + "/big", std::string(101, 'x')).ok());
  ASSERT_TRUE(WriteFileAtomically(root_.dir + "/fits", std::string(100, 'x')).ok());
  absl::Status s = ReadDataFile(root_, "big", true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--max_data_file_bytes"), absl::string_view::npos) << s;
  EXPECT_TRUE(ReadDataFile(root_, "fits", true).ok());
}

TEST_F(DataRootTest, RefusesAGzipBomb) {
  // 64 MiB of zeros: about 64 KiB compressed, far below the bound on disk.
  WriteGzip(root_.dir + "/bomb.gz", std::string(64 << 20, '\0'));
  ASSERT_LT(fs::file_size(fs::path(root_.dir) / "bomb.gz"), 1u << 20);
  root_.max_file_bytes = 1 << 20;
  absl::Status s = ReadDataFile(root_, "bomb.gz", true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("decompresses"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--max_data_file_bytes"), absl::string_view::npos) << s;
  // Exactly at the bound is fine.
  WriteGzip(root_.dir + "/exact.gz", std::string(1 << 20, '\0'));
  auto exact = ReadDataFile(root_, "exact.gz", true);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->size(), 1u << 20);
}

TEST_F(DataRootTest, NoRootOrAMissingRootReadsNothing) {
  EXPECT_EQ(ReadDataFile(DataRoot{}, "sub/ok.txt", true).status().code(), absl::StatusCode::kFailedPrecondition);
  DataRoot missing{(base_ / "nowhere").string(), 1 << 20};
  absl::Status s = ReadDataFile(missing, "sub/ok.txt", true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--data_root"), absl::string_view::npos) << s;
}

// worker/testdata/small_net.pt, a scripted module (Bazel runs tests in the
// runfiles tree).
TEST_F(DataRootTest, TorchScriptModelsComeFromTheRootOnly) {
  const fs::path net = fs::current_path() / "worker/testdata/small_net.pt";
  ASSERT_TRUE(fs::exists(net)) << net;
  fs::copy_file(net, base_ / "outside" / "net.pt");
  fs::copy_file(net, fs::path(root_.dir) / "sub" / "net.pt");
  auto inside = CreateModel("torchscript:sub/net.pt", {1, 28, 28}, 10, 1, root_);
  ASSERT_TRUE(inside.ok()) << inside.status();
  const std::string outside = (base_ / "outside" / "net.pt").string();
  EXPECT_EQ(CreateModel("torchscript:" + outside, {1, 28, 28}, 10, 1, root_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateModel("torchscript:../outside/net.pt", {1, 28, 28}, 10, 1, root_).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::create_symlink(outside, fs::path(root_.dir) / "linked.pt");
  EXPECT_EQ(CreateModel("torchscript:linked.pt", {1, 28, 28}, 10, 1, root_).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Bounded like data.
  root_.max_file_bytes = 64;
  EXPECT_EQ(CreateModel("torchscript:sub/net.pt", {1, 28, 28}, 10, 1, root_).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pstrain
