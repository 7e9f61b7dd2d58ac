// Quotas, retention and background threads (issue 31, "Quotas and bounded
// threads"), on the transport-neutral Coordinator; the same over real gRPC
// with tokens is tests/coordinator_flood_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <system_error>

#include "common/clock.h"
#include "common/file_util.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_testing.h"

namespace pstrain {
namespace {

const char kSpec[] = "name: t\nworkers: 1\nshards: 1\ndata: {format: synthetic}\n";

CoordinatorOptions Options() { return TestCoordinatorOptions(); }

std::unique_ptr<Coordinator> Make(const CoordinatorOptions& o, const std::string& db = ":memory:") {
  return MakeTestCoordinator(o, db);
}

Caller User(const std::string& name) { return Caller{CallerRole::kUser, name}; }

absl::StatusOr<std::string> SubmitAs(Coordinator& c, const Caller& caller) {
  SubmitJobRequest req;
  req.set_spec_yaml(kSpec);
  req.set_output_dir(::testing::TempDir() + "/out");
  return c.SubmitJob(req, caller);
}

std::string Join(Coordinator& c, MemberRole role, const std::string& name) {
  RegisterRequest r;
  r.set_role(role);
  r.set_name(name);
  if (role == MEMBER_ROLE_SHARD) r.set_address("127.0.0.1:1");
  auto resp = c.Register(r);
  EXPECT_TRUE(resp.ok()) << resp.status();
  return resp.ok() ? resp->member_id() : "";
}

void ExpectExhausted(const absl::Status& s, const std::string& flag) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(flag), absl::string_view::npos) << s;
}

TEST(CoordinatorQuotaTest, QueuedJobsAreBoundedPerUser) {
  CoordinatorOptions o = Options();
  o.max_queued_jobs_per_user = 3;
  auto c = Make(o);  // no members: every job stays pending
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(SubmitAs(*c, User("alice")).ok());
  for (int i = 0; i < 10; ++i) ExpectExhausted(SubmitAs(*c, User("alice")).status(), "--max_queued_jobs_per_user");
  // An admin is a user like any other: by name.
  auto admin = SubmitAs(*c, Caller{CallerRole::kAdmin, "root"});
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE(SubmitAs(*c, User("bob")).ok());
  EXPECT_EQ(c->ListJobs().size(), 5u);
  // A cancelled job no longer counts.
  ASSERT_TRUE(c->CancelJob("job-000001").ok());
  EXPECT_TRUE(SubmitAs(*c, User("alice")).ok());
}

TEST(CoordinatorQuotaTest, AUserAtTheRunningLimitDoesNotHoldUpOthers) {
  CoordinatorOptions o = Options();
  o.max_running_jobs_per_user = 1;
  auto c = Make(o);
  for (const char* name : {"shard-0", "shard-1"}) Join(*c, MEMBER_ROLE_SHARD, name);
  for (const char* name : {"worker-0", "worker-1"}) Join(*c, MEMBER_ROLE_WORKER, name);
  const std::string a1 = *SubmitAs(*c, User("alice"));
  const std::string a2 = *SubmitAs(*c, User("alice"));
  const std::string b1 = *SubmitAs(*c, User("bob"));
  EXPECT_EQ(c->GetJob(a1)->state(), RUNNING);
  EXPECT_EQ(c->GetJob(a2)->state(), PENDING);
  EXPECT_NE(c->GetJob(a2)->pending_reason().find("--max_running_jobs_per_user"), std::string::npos)
      << c->GetJob(a2)->pending_reason();
  EXPECT_EQ(c->GetJob(b1)->state(), RUNNING);
}

TEST(CoordinatorQuotaTest, WatchesAndWaitsAreBounded) {
  CoordinatorOptions o = Options();
  o.max_watches_per_user = 2;
  o.max_waiting_calls = 3;
  auto c = Make(o);
  Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  const std::string worker = Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  const std::string job = *SubmitAs(*c, User("alice"));
  ASSERT_EQ(c->GetJob(job)->state(), RUNNING);
  ASSERT_EQ(c->GetAssignment(worker, absl::Now() + absl::Seconds(30))->job_id(), job);  // the attempt is on disk
  auto w1 = c->OpenWatch(User("alice"));
  auto w2 = c->OpenWatch(User("alice"));
  ASSERT_TRUE(w1.ok() && w2.ok());
  ExpectExhausted(c->OpenWatch(User("alice")).status(), "--max_watches_per_user");
  auto b = c->OpenWatch(User("bob"));  // the third and last waiting place
  ASSERT_TRUE(b.ok());
  ExpectExhausted(c->OpenWatch(User("carol")).status(), "--max_waiting_calls");
  // A wait is refused, but what is there already is still answered.
  ExpectExhausted(c->KvGet(worker, job, 1, "k", absl::Now() + absl::Seconds(30)).status(), "--max_waiting_calls");
  ASSERT_TRUE(c->KvSet(worker, job, 1, "k", "v").ok());
  EXPECT_EQ(*c->KvGet(worker, job, 1, "k", absl::Now() + absl::Seconds(30)), "v");
  EXPECT_EQ(c->GetAssignment(worker, absl::Now() + absl::Seconds(30))->job_id(), job);
  const std::string idle = Join(*c, MEMBER_ROLE_WORKER, "worker-1");
  ExpectExhausted(c->GetAssignment(idle, absl::Now() + absl::Seconds(30)).status(), "--max_waiting_calls");
  // Places come back when their holders go.
  *w1 = WaitLimits::Slot();
  EXPECT_TRUE(c->OpenWatch(User("alice")).ok());
  EXPECT_EQ(c->GetAssignment(idle, absl::Now() + absl::Milliseconds(20))->job_id(), "");
}

// std::thread throws std::system_error when the process is out of threads.
// Background() runs under the coordinator's mutex, on the tick thread and
// on request threads: the work waits for the next tick instead of the
// exception ending the coordinator.
TEST(CoordinatorQuotaTest, BackgroundWorkWithoutAThreadIsDeferredNotFatal) {
  std::atomic<int> starts{0};
  std::atomic<int> failures_left{2};
  CoordinatorOptions o = Options();
  o.before_thread_start = [&] {
    ++starts;
    if (failures_left.fetch_sub(1) > 0) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  };
  auto c = Make(o);
  Join(*c, MEMBER_ROLE_SHARD, "shard-0");
  Join(*c, MEMBER_ROLE_WORKER, "worker-0");
  const std::string job = *SubmitAs(*c, User("alice"));
  ASSERT_EQ(c->GetJob(job)->state(), RUNNING);
  // Ending the job drops the shards' table in the background: no thread.
  ASSERT_TRUE(c->CancelJob(job).ok());
  EXPECT_EQ(starts.load(), 1);
  c->Tick();  // tried again: fails once more
  EXPECT_EQ(starts.load(), 2);
  c->Tick();  // and now starts
  EXPECT_EQ(starts.load(), 3);
  c->Tick();
  EXPECT_EQ(starts.load(), 3);  // nothing left over
  EXPECT_TRUE(SubmitAs(*c, User("alice")).ok());  // still serving
}

class CoordinatorRetentionTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options() {
    CoordinatorOptions o = ::pstrain::Options();
    o.clock = &clock_;
    return o;
  }
  std::string Db() {
    const std::string db = ::testing::TempDir() + "/retention.db";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
    return db;
  }
  static std::vector<std::string> Ids(Coordinator& c) {
    std::vector<std::string> ids;
    for (const JobStatus& st : c.ListJobs()) ids.push_back(st.job_id());
    return ids;
  }
  static std::vector<std::string> Stored(const std::string& db) {
    auto store = JobStore::Open(db);
    EXPECT_TRUE(store.ok());
    std::vector<std::string> ids;
    auto jobs = (*store)->List();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    for (const StoredJob& j : jobs.value_or(std::vector<StoredJob>{})) ids.push_back(j.id);
    return ids;
  }
  ManualClock clock_;
};

// Ended jobs past the retention go from memory and the store; the ones
// kept are those that ended last (not those submitted last); jobs not ended
// are never touched; a restart prunes the same way (or by its new flags).
TEST_F(CoordinatorRetentionTest, EndedJobsPastTheRetentionAreDeletedAcrossRestarts) {
  const std::string db = Db();
  CoordinatorOptions o = Options();
  o.job_retention = 2;
  {
    auto c = Make(o, db);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(SubmitAs(*c, User("alice")).ok());  // job-000001..5, pending
    // Ended in the order 4, 1, 2, 3; job 5 stays pending.
    for (const char* id : {"job-000004", "job-000001", "job-000002", "job-000003"}) {
      clock_.Advance(absl::Seconds(1));
      ASSERT_TRUE(c->CancelJob(id).ok());
    }
    c->Tick();
    EXPECT_EQ(Ids(*c), (std::vector<std::string>{"job-000002", "job-000003", "job-000005"}));
    EXPECT_EQ(c->GetJob("job-000004").status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(c->GetJob("job-000002")->state(), CANCELLED);
    c->Shutdown();
  }
  EXPECT_EQ(Stored(db), (std::vector<std::string>{"job-000002", "job-000003", "job-000005"}));
  {
    // The same retention: nothing more goes.
    auto c = Make(o, db);
    EXPECT_EQ(Ids(*c), (std::vector<std::string>{"job-000002", "job-000003", "job-000005"}));
    c->Shutdown();
  }
  EXPECT_EQ(Stored(db), (std::vector<std::string>{"job-000002", "job-000003", "job-000005"}));
  {
    // A smaller one: the job that ended first goes at start.
    o.job_retention = 1;
    auto c = Make(o, db);
    EXPECT_EQ(Ids(*c), (std::vector<std::string>{"job-000003", "job-000005"}));
    c->Shutdown();
  }
  EXPECT_EQ(Stored(db), (std::vector<std::string>{"job-000003", "job-000005"}));
  {
    // By age: an hour after it ended.
    o.job_retention = 100;
    o.job_retention_age = absl::Hours(1);
    auto c = Make(o, db);
    EXPECT_EQ(Ids(*c), (std::vector<std::string>{"job-000003", "job-000005"}));
    clock_.Advance(absl::Minutes(61));
    c->Tick();
    EXPECT_EQ(Ids(*c), (std::vector<std::string>{"job-000005"}));
    // Ids are not reused.
    EXPECT_EQ(*SubmitAs(*c, User("bob")), "job-000006");
    c->Shutdown();
  }
  EXPECT_EQ(Stored(db), (std::vector<std::string>{"job-000005", "job-000006"}));
}

}  // namespace
}  // namespace pstrain
