// The fixture of the coordinator's restart and attempt tests
// (coordinator_restart_test.cc, coordinator_attempt_test.cc): a coordinator
// over a database file and a manual clock, what a SIGKILL leaves of that
// file, and the calls a member makes.
#ifndef PSTRAIN_SERVER_COORDINATOR_COORDINATOR_RESTART_TESTING_H_
#define PSTRAIN_SERVER_COORDINATOR_COORDINATOR_RESTART_TESTING_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "common/clock.h"
#include "google/protobuf/util/json_util.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_testing.h"

namespace pstrain {

inline constexpr char kAllReduce1[] = "name: t\nmode: allreduce\nworkers: 1\ndata: {format: synthetic}\n";
inline constexpr char kAllReduce2[] =
    "name: t\nmode: allreduce\nworkers: 2\nmax_restarts: 3\ndata: {format: synthetic}\n";

class CoordinatorRestartTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options() {
    CoordinatorOptions o = TestCoordinatorOptions();
    o.clock = &clock_;  // leases move only when the test says
    return o;
  }
  // A fresh database file.
  std::string Db(const std::string& name) {
    const std::string db = ::testing::TempDir() + "/" + name + ".db";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
    return db;
  }
  std::unique_ptr<Coordinator> Make(const std::string& db, CoordinatorOptions o) { return MakeTestCoordinator(o, db); }
  // What a SIGKILL now leaves on disk: the database and its WAL, copied
  // (SQLite recovers the committed transactions from the WAL when the copy
  // is opened; a torn last frame is dropped, as after a crash).
  std::string CrashImage(const std::string& db) {
    const std::string image = db + ".crash";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(image + suffix);
    std::filesystem::copy_file(db, image);
    if (std::filesystem::exists(db + "-wal")) std::filesystem::copy_file(db + "-wal", image + "-wal");
    return image;
  }
  // The job's status as the store holds it now.
  JobStatus Stored(const std::string& db, const std::string& job) {
    auto store = JobStore::Open(db);
    EXPECT_TRUE(store.ok()) << store.status();
    auto stored = (*store)->Get(job);
    EXPECT_TRUE(stored.ok()) << stored.status();
    return stored.ok() ? stored->status : JobStatus();
  }
  // Polls the store until the job is in `state` (the persister writes
  // behind the coordinator's back).
  bool AwaitStored(const std::string& db, const std::string& job, JobState state) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (Stored(db, job).state() == state) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  std::string Join(Coordinator& c, MemberRole role, const std::string& name, const std::string& job = "",
                   uint64_t attempt = 0) {
    RegisterRequest r;
    r.set_role(role);
    r.set_name(name);
    if (role == MEMBER_ROLE_SHARD) r.set_address("127.0.0.1:1" + name.substr(name.size() - 1));
    r.set_job_id(job);
    r.set_attempt(attempt);
    // As a member does: it names the id it had (its credential for its seat).
    r.set_previous_member_id(ids_[name]);
    auto resp = c.Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return ids_[name] = resp.ok() ? resp->member_id() : "";
  }
  std::map<std::string, std::string> ids_;  // member name -> the id Join got last
  absl::Status Event(Coordinator& c, const std::string& member, const std::string& job, uint64_t attempt,
                     const std::string& json) {
    ReportProgressRequest r;
    r.set_member_id(member);
    r.set_job_id(job);
    r.set_attempt(attempt);
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, r.mutable_event()).ok()) << json;
    return c.ReportProgress(r).status();
  }
  HeartbeatResponse Beat(Coordinator& c, const std::string& member, const std::string& job = "",
                         uint64_t attempt = 0) {
    HeartbeatRequest hb;
    hb.set_member_id(member);
    hb.set_running_job_id(job);
    hb.set_running_attempt(attempt);
    auto r = c.Heartbeat(hb);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.value_or(HeartbeatResponse());
  }
  // The pause id a worker running `attempt` is asked to pause for; -1 if
  // none within 30 s.
  int64_t AwaitPause(Coordinator& c, const std::string& member, const std::string& job, uint64_t attempt) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      HeartbeatResponse r = Beat(c, member, job, attempt);
      if (r.pause()) return r.pause_id();
      absl::SleepFor(absl::Milliseconds(2));
    }
    return -1;
  }
  // Waits until the worker's assignment for the job is out (the attempt is
  // durable and restored); its attempt, 0 if none within 30 s.
  uint64_t AwaitAssignment(Coordinator& c, const std::string& member) {
    auto a = c.GetAssignment(member, absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() && !a->job_id().empty() ? a->attempt() : 0;
  }
  // Workers that run nothing say so: a requeued attempt's are freed.
  void BeatIdle(Coordinator& c, std::initializer_list<std::string> members) {
    for (const std::string& m : members) Beat(c, m);
  }
  // A checkpoint of an all-reduce job at `step` to resume from.
  std::string WriteCheckpointAt(int64_t step, const std::string& spec_yaml, int workers) {
    std::vector<CheckpointManifest::Worker> positions;
    for (int r = 0; r < workers; ++r) positions.push_back({r, step, 1, 0, 0});
    return WriteFakeCheckpoint(::testing::TempDir() + "/restart-ckpt-" + std::to_string(step), step, spec_yaml,
                               positions);
  }
  std::string Resume(Coordinator& c, const std::string& dir) {
    auto id = SubmitResume(c, dir);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }
  int Conditions(const JobStatus& st, const std::string& reason) {
    int n = 0;
    for (const auto& cond : st.conditions()) n += cond.reason() == reason;
    return n;
  }

  ManualClock clock_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_COORDINATOR_RESTART_TESTING_H_
