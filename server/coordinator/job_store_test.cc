#include "server/coordinator/job_store.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace pstrain {
namespace {

TEST(JobStoreTest, JobsSurviveReopeningTheDatabase) {
  const std::string path = ::testing::TempDir() + "/jobs.db";
  std::filesystem::remove(path);
  std::string id;
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobStatus status;
    status.set_name("first");
    status.set_state(PENDING);
    auto job = (*store)->Create("name: first\n", "/out", status);
    ASSERT_TRUE(job.ok()) << job.status();
    id = job->id;
    EXPECT_EQ(id, "job-000001");
    EXPECT_EQ(job->status.job_id(), id);
    auto second = (*store)->Create("name: second\n", "", JobStatus());
    EXPECT_EQ(second->id, "job-000002");
    job->status.set_state(RUNNING);
    ASSERT_TRUE((*store)->Update(job->status).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto job = (*store)->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->status.state(), RUNNING);
  EXPECT_EQ(job->spec_yaml, "name: first\n");
  EXPECT_EQ(job->output_dir, "/out");
  auto all = (*store)->List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].id, "job-000002");
  // Ids are never reused.
  EXPECT_EQ((*store)->Create("x", "", JobStatus())->id, "job-000003");
}

TEST(JobStoreTest, UnknownJobsAreNotFound) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Get("job-000009").status().code(), absl::StatusCode::kNotFound);
  JobStatus s;
  s.set_job_id("job-000009");
  EXPECT_EQ((*store)->Update(s).code(), absl::StatusCode::kNotFound);
  // A missing directory is not worth retrying: fix the path first.
  EXPECT_EQ(JobStore::Open("/nonexistent-dir/jobs.db").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The coordinator's lives are counted durably: a reopened store goes on
// from the last number drawn.
TEST(JobStoreTest, IncarnationsAreNeverDrawnTwice) {
  const std::string path = ::testing::TempDir() + "/incarnations.db";
  std::filesystem::remove(path);
  for (int64_t expected : {1, 2, 3}) {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto n = (*store)->NextIncarnation();
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, expected);
  }
}

// Ended jobs past the retention go for good; ids are still never reused.
TEST(JobStoreTest, DeletedJobsAreGoneAndTheirIdsNotReused) {
  const std::string path = ::testing::TempDir() + "/deleted.db";
  std::filesystem::remove(path);
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*store)->Create("x", "", JobStatus()).ok());
    ASSERT_TRUE((*store)->Delete({"job-000001", "job-000003", "job-000042"}).ok());
    EXPECT_EQ((*store)->Get("job-000001").status().code(), absl::StatusCode::kNotFound);
  }
  auto store = JobStore::Open(path);
  auto all = (*store)->List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].id, "job-000002");
  EXPECT_EQ((*store)->Create("x", "", JobStatus())->id, "job-000004");
}

}  // namespace
}  // namespace pstrain
