// Helpers of the coordinator's tests.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_TESTING_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_TESTING_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "common/file_util.h"
#include "server/coordinator/coordinator.h"

namespace pstrain {

// A coordinator for tests: 50 ms heartbeats, 3 missed ones lose a member,
// no background tick (the test calls Tick()), the test's temporary
// directory as the checkpoint root.
inline CoordinatorOptions TestCoordinatorOptions() {
  CoordinatorOptions o;
  o.heartbeat_interval = absl::Milliseconds(50);
  o.missed_heartbeats = 3;
  o.background_tick = false;
  o.checkpoint_root = *CanonicalRoot(::testing::TempDir());
  return o;
}

// A coordinator over the job store `db` (":memory:" or a file).
inline std::unique_ptr<Coordinator> MakeTestCoordinator(const CoordinatorOptions& o = TestCoordinatorOptions(),
                                                        const std::string& db = ":memory:") {
  auto store = JobStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  auto c = Coordinator::Create(o, std::move(*store));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// Submits `spec` (output under the test's temporary directory); its id.
inline std::string SubmitSpec(Coordinator& c, const std::string& spec) {
  SubmitJobRequest req;
  req.set_spec_yaml(spec);
  req.set_output_dir(::testing::TempDir() + "/out");
  auto id = c.SubmitJob(req);
  EXPECT_TRUE(id.ok()) << id.status();
  return id.value_or("");
}

// A checkpoint of job-1 at `step` in `dir` (one shard file of 10 bytes,
// which nothing in the coordinator's tests reads); returns `dir`.
inline std::string WriteFakeCheckpoint(const std::string& dir, int64_t step, const std::string& spec_yaml,
                                       std::vector<CheckpointManifest::Worker> workers = {}) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/shard-0.bin") << "0123456789";
  CheckpointManifest m;
  m.job = "job-1";
  m.name = "t";
  m.step = step;
  m.spec_yaml = spec_yaml;
  m.chunk_bytes = 4 << 20;
  m.params.push_back({"w", {2}, DT_FLOAT32});
  m.workers = std::move(workers);
  m.shards.push_back({0, "shard-0.bin", 10, 0});
  EXPECT_TRUE(WriteManifest(dir, m).ok());
  return dir;
}

// The member ids of `job`'s workers in rank order: ranks follow the
// members' random order (scheduler.h), not their names or when they joined.
inline std::vector<std::string> WorkersByRank(Coordinator& c, const std::string& job) {
  std::vector<std::string> out;
  auto st = c.GetJob(job);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return out;
  for (const MemberStatus& m : st->members()) {
    if (m.role() != MEMBER_ROLE_WORKER || m.rank() < 0) continue;
    if (out.size() <= static_cast<size_t>(m.rank())) out.resize(m.rank() + 1);
    out[m.rank()] = m.member_id();
  }
  return out;
}

// A job submitted to resume from `dir`.
inline absl::StatusOr<std::string> SubmitResume(Coordinator& c, const std::string& dir) {
  SubmitJobRequest req;
  req.set_resume_from(dir);
  req.set_output_dir(::testing::TempDir() + "/out");
  return c.SubmitJob(req);
}

// A gate a hook (CoordinatorOptions' fault-injection points) waits at: the
// test learns it was reached, then opens it. Opened first, it only tells.
class Gate {
 public:
  void Arrive() {
    absl::MutexLock lock(&mu_);
    reached_ = true;
    mu_.Await(absl::Condition(&open_));
  }
  bool AwaitReached() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&reached_), absl::Seconds(30));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  absl::Mutex mu_;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_TESTING_H_
