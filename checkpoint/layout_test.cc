#include "checkpoint/layout.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint/manifest.h"
#include "common/file_util.h"

namespace pstrain {
namespace {

TEST(CheckpointLayoutTest, EachJobHasItsOwnDirectory) {
  EXPECT_EQ(JobDir("/data/out", "job-000007"), "/data/out/job-000007");
  EXPECT_EQ(CheckpointDir("/data/out/job-000007", 1041), "/data/out/job-000007/ckpt-1041");
  EXPECT_EQ(PendingCheckpointDir("/d/ckpt-5"), "/d/ckpt-5.tmp");
}

// A checkpoint directory with a manifest that says `created` (to tell the
// old one from the new).
void WriteCheckpointDir(const std::string& dir, int64_t created) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/shard-0.bin") << "0123456789";
  CheckpointManifest m;
  m.job = "job-1";
  m.name = "t";
  m.step = 7;
  m.created_unix_ms = created;
  m.chunk_bytes = 1024;
  m.params.push_back({"w", {2}, DT_FLOAT32});
  m.shards.push_back({0, "shard-0.bin", 10, 0});
  ASSERT_TRUE(WriteManifest(dir, m).ok());
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
    WriteCheckpointDir(pending, step);
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

std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Committing a checkpoint again at a step that already has one (after a
// restore, the first checkpoint can land on the restored step) never loses
// that step: a process killed (SIGKILL, in a child) after each step of the
// commit in turn leaves ckpt-<step> whole, old or new -- at once where the
// file system has RENAME_EXCHANGE, after RecoverCheckpoints where it has
// not -- and nothing else once recovered. (The commit used to remove the
// old directory and then rename: a kill in between left no ckpt-<step>.)
class CommitCrashTest : public ::testing::TestWithParam<bool> {};

TEST_P(CommitCrashTest, AKillAtAnyStepLeavesTheStepWhole) {
  const bool exchange = GetParam();
  const std::string job = ::testing::TempDir() + (exchange ? "/crash-exchange" : "/crash-aside") + "/job-1";
  const std::string dir = CheckpointDir(job, 7), pending = PendingCheckpointDir(dir);
  int crashes = 0;
  for (int kill_at = 1; kill_at < 20; ++kill_at) {
    std::filesystem::remove_all(job);
    WriteCheckpointDir(dir, /*created=*/1);
    WriteCheckpointDir(pending, /*created=*/2);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: commits, killed at its kill_at-th step.
      int steps = 0;
      CommitCheckpointTesting t;
      t.no_exchange = !exchange;
      t.after_step = [&](const char*) {
        if (++steps == kill_at) raise(SIGKILL);
      };
      SetCommitCheckpointTestingForTesting(t);
      _exit(CommitCheckpoint(pending, dir, /*keep=*/2).ok() ? 0 : 1);
    }
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    const bool killed = WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL;
    ASSERT_TRUE(killed || (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)) << "kill_at " << kill_at;
    if (exchange) {
      auto now = ReadManifest(dir);
      EXPECT_TRUE(now.ok()) << "killed after step " << kill_at << ": " << now.status();
    }
    RecoverCheckpoints(job);
    auto m = ReadManifest(dir);
    ASSERT_TRUE(m.ok()) << "killed after step " << kill_at << " (then recovered): " << m.status();
    EXPECT_TRUE(m->created_unix_ms == 1 || m->created_unix_ms == 2);
    EXPECT_EQ(Names(job), std::set<std::string>{"ckpt-7"}) << "killed after step " << kill_at;
    if (!killed) {
      EXPECT_EQ(m->created_unix_ms, 2) << "the commit finished: the new one is in";
      break;
    }
    ++crashes;
  }
  EXPECT_GE(crashes, exchange ? 3 : 4);  // staged, (moved aside,) swapped/renamed, removed old
  // A commit after a crash tidies up too.
  std::filesystem::remove_all(job);
  WriteCheckpointDir(dir, 1);
  std::filesystem::create_directories(dir + ".new");
  std::filesystem::create_directories(CheckpointDir(job, 3) + ".old");  // its ckpt-3 is gone: it comes back
  WriteCheckpointDir(CheckpointDir(job, 9) + ".tmp", 2);
  ASSERT_TRUE(CommitCheckpoint(CheckpointDir(job, 9) + ".tmp", CheckpointDir(job, 9), 5).ok());
  EXPECT_EQ(Names(job), (std::set<std::string>{"ckpt-3", "ckpt-7", "ckpt-9"}));
}

INSTANTIATE_TEST_SUITE_P(ExchangeOrAside, CommitCrashTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Exchange" : "Aside"; });

// checkpoint_keep 1 with incremental embedding checkpoints: the checkpoints
// the newest is incremental on stay (its chain restores it); once a whole
// one is the newest, they go.
TEST(CheckpointLayoutTest, RetentionKeepsTheBasesOfAKeptCheckpoint) {
  const std::string job = JobDir(::testing::TempDir() + "/layout-chain", "job-1");
  std::filesystem::remove_all(job);
  auto commit = [&job](int64_t step, const std::string& base) {
    const std::string dir = CheckpointDir(job, step), pending = PendingCheckpointDir(dir);
    std::filesystem::create_directories(pending);
    std::ofstream(pending + "/shard-0.bin") << "0123456789";
    std::ofstream(pending + "/emb-0.bin") << "rows";
    CheckpointManifest m;
    m.job = "job-1";
    m.name = "t";
    m.id = static_cast<uint64_t>(step);
    m.step = step;
    m.chunk_bytes = 1024;
    m.params.push_back({"w", {2}, DT_FLOAT32});
    m.shards.push_back({0, "shard-0.bin", 10, 0});
    m.embeddings.push_back({0, "emb-0.bin", 4, 0});
    if (!base.empty()) {
      m.embeddings_base = base;
      m.embeddings_base_id = static_cast<uint64_t>(std::stoll(base.substr(5)));
      m.embeddings_chain = 1;
    }
    ASSERT_TRUE(WriteManifest(pending, m).ok());
    ASSERT_TRUE(CommitCheckpoint(pending, dir, /*keep=*/1).ok());
  };
  commit(10, "");
  commit(20, "ckpt-10");
  commit(30, "ckpt-20");
  EXPECT_EQ(Names(job), (std::set<std::string>{"ckpt-10", "ckpt-20", "ckpt-30"}));
  commit(40, "");
  EXPECT_EQ(Names(job), (std::set<std::string>{"ckpt-40"}));
  // A kept checkpoint whose manifest cannot be read: its bases are not
  // known, so nothing goes.
  commit(50, "ckpt-40");
  commit(60, "ckpt-50");
  std::filesystem::remove(CheckpointDir(job, 50) + "/manifest.json");
  commit(70, "ckpt-60");
  EXPECT_EQ(Names(job), (std::set<std::string>{"ckpt-40", "ckpt-50", "ckpt-60", "ckpt-70"}));
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
