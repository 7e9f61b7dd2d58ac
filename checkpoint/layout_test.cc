#include "checkpoint/layout.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/file_util.h"

namespace pstrain {
namespace {

TEST(CheckpointLayoutTest, EachJobHasItsOwnDirectory) {
  EXPECT_EQ(JobDir("/data/out", "job-000007"), "/data/out/job-000007");
  EXPECT_EQ(CheckpointDir("/data/out/job-000007", 1041), "/data/out/job-000007/ckpt-1041");
  EXPECT_EQ(PendingCheckpointDir("/d/ckpt-5"), "/d/ckpt-5.tmp");
}

// A commit renames the pending directory whole and keeps the newest `keep`
// checkpoints of the job -- never another job's, never one in progress.
TEST(CheckpointLayoutTest, CommitRenamesWholeAndKeepsOnlyTheNewestOfThisJob) {
  const std::string out = ::testing::TempDir() + "/layout";
  std::filesystem::remove_all(out);
  const std::string job = JobDir(out, "job-1"), other = JobDir(out, "job-2");
  for (int64_t step : {100, 200}) std::filesystem::create_directories(CheckpointDir(other, step));
  std::filesystem::create_directories(PendingCheckpointDir(CheckpointDir(job, 999)));  // in progress elsewhere
  for (int64_t step : {10, 20, 30, 40}) {
    const std::string dir = CheckpointDir(job, step);
    const std::string pending = PendingCheckpointDir(dir);
    std::filesystem::create_directories(pending);
    ASSERT_TRUE(WriteFileAtomically(pending + "/manifest.json", "{}").ok());
    ASSERT_TRUE(CommitCheckpoint(pending, dir, /*keep=*/2).ok());
    EXPECT_TRUE(std::filesystem::exists(dir + "/manifest.json"));
    EXPECT_FALSE(std::filesystem::exists(pending));
  }
  EXPECT_FALSE(std::filesystem::exists(CheckpointDir(job, 10)));
  EXPECT_FALSE(std::filesystem::exists(CheckpointDir(job, 20)));
  EXPECT_TRUE(std::filesystem::exists(CheckpointDir(job, 30)));
  EXPECT_TRUE(std::filesystem::exists(CheckpointDir(job, 40)));
  EXPECT_TRUE(std::filesystem::exists(PendingCheckpointDir(CheckpointDir(job, 999))));
  EXPECT_TRUE(std::filesystem::exists(CheckpointDir(other, 100)));  // another job's: untouched
  EXPECT_TRUE(std::filesystem::exists(CheckpointDir(other, 200)));
  // A pending directory that is missing is an error naming it, not a throw.
  absl::Status s = CommitCheckpoint(out + "/nope.tmp", CheckpointDir(job, 50), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

TEST(CheckpointLayoutTest, RestoreRequestNamesTheFilesRelativeToTheStoresRoot) {
  CheckpointManifest m;
  m.shards.push_back({0, "shard-0.bin", 10, 7});
  m.shards.push_back({1, "shard-1.bin", 20, 8});
  TableConfig config;
  config.set_num_workers(2);
  const LoadTableRequest req = RestoreRequest(m, "out/job-1/ckpt-5", "job-3", 4, config, {"a", "b#1"});
  EXPECT_EQ(req.job(), "job-3");
  EXPECT_EQ(req.attempt(), 4u);
  EXPECT_EQ(req.config().num_workers(), 2u);
  ASSERT_EQ(req.files_size(), 2);
  EXPECT_EQ(req.files(1).path(), "out/job-1/ckpt-5/shard-1.bin");
  EXPECT_EQ(req.files(1).bytes(), 20u);
  EXPECT_EQ(req.files(1).crc32(), 8u);
  EXPECT_EQ(req.keys_size(), 2);
}

}  // namespace
}  // namespace pstrain
