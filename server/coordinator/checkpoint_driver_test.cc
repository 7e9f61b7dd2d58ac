#include "server/coordinator/checkpoint_driver.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/pause_keys.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"

namespace pstrain {
namespace {

std::string Report(uint64_t bytes, uint32_t crc32) {
  WorkerSaveReport r;
  r.mutable_saved()->set_bytes(bytes);
  r.mutable_saved()->set_crc32(crc32);
  return r.SerializeAsString();
}

TEST(ParseWorkerSaveReportTest, ASavedFile) {
  auto saved = ParseWorkerSaveReport(Report(1234, 0xdeadbeef));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->bytes(), 1234u);
  EXPECT_EQ(saved->crc32(), 0xdeadbeefu);
}

TEST(ParseWorkerSaveReportTest, TheWorkersErrorIsPassedOn) {
  WorkerSaveReport r;
  r.set_error("disk full");
  auto saved = ParseWorkerSaveReport(r.SerializeAsString());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(saved.status().message().find("worker 0: "), std::string::npos) << saved.status();
  EXPECT_NE(saved.status().message().find("disk full"), std::string::npos) << saved.status();
}

TEST(ParseWorkerSaveReportTest, NeitherFileNorError) {
  for (const std::string& value : {std::string(), WorkerSaveReport().SerializeAsString()}) {
    auto saved = ParseWorkerSaveReport(value);
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(saved.status().message().find("neither"), std::string::npos) << saved.status();
  }
}

TEST(ParseWorkerSaveReportTest, NotAReport) {
  // The old JSON form, a truncated report, a field of the wrong wire type.
  const std::string full = Report(1234, 5);
  for (const std::string& value : {std::string(R"({"bytes": 1, "crc32": 2})"), full.substr(0, full.size() - 1),
                                   std::string("\x0b\x01", 2), std::string("\xff\xff\xff\xff\xff", 5)}) {
    auto saved = ParseWorkerSaveReport(value);
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kInternal) << saved.status();
    EXPECT_NE(saved.status().message().find("worker 0: "), std::string::npos) << saved.status();
  }
}

TEST(ParseWorkerSaveReportTest, AnyBytesGiveAStatus) {
  std::mt19937 rng(32);
  for (int i = 0; i < 20000; ++i) {
    std::string value(rng() % 64, '\0');
    for (char& c : value) c = static_cast<char>(rng());
    auto saved = ParseWorkerSaveReport(value);
    if (!saved.ok()) {
      EXPECT_EQ(saved.status().code(), absl::StatusCode::kInternal);
    }
  }
}

// A hostile or corrupt answer fails the checkpoint cleanly: an error that
// says so, and no directory left behind.
// An all-reduce checkpoint of "job" (attempt 1, pause `pause_id`) at step
// 7 under a fresh `root` named `name` in the test's directory.
CheckpointWrite AllReduceWrite(const std::string& name, int64_t pause_id, absl::Duration save_timeout,
                               std::string* root) {
  *root = std::filesystem::canonical(testing::TempDir()).string() + "/" + name;
  std::filesystem::remove_all(*root);
  std::filesystem::create_directories(*root);
  CheckpointWrite w;
  w.job_id = "job";
  w.attempt = 1;
  w.pause_id = pause_id;
  w.allreduce = true;
  w.dir = *root + "/job/ckpt-7";
  w.save_timeout = save_timeout;
  return w;
}

TEST(WriteCheckpointTest, AllReduceWorkerWithACorruptReport) {
  std::string root;
  const CheckpointWrite w = AllReduceWrite("corrupt_report", 42, absl::Seconds(5), &root);
  Rendezvous rendezvous(RendezvousLimits{});
  rendezvous.Open("job", 1);
  ASSERT_TRUE(rendezvous.Set("job", 1, CheckpointSavedKey(42), "{\"bytes\": 1}").ok());
  absl::Status s = WriteCheckpoint(w, root, rendezvous);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("not a saved-file report"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(w.dir));
  EXPECT_FALSE(std::filesystem::exists(PendingCheckpointDir(w.dir)));
  // The path went to worker 0 under the shared key name.
  auto path = rendezvous.Get("job", 1, CheckpointPathKey(42), absl::Now());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, PendingCheckpointDir(w.dir) + "/shard-0.bin");
}

TEST(WriteCheckpointTest, AllReduceWorkerThatNeverAnswers) {
  std::string root;
  const CheckpointWrite w = AllReduceWrite("no_report", 43, absl::Milliseconds(100), &root);
  Rendezvous rendezvous(RendezvousLimits{});
  rendezvous.Open("job", 1);
  absl::Status s = WriteCheckpoint(w, root, rendezvous);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("worker 0 did not save"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(PendingCheckpointDir(w.dir)));
}

// A QAT job: worker 0 writes its table and then its buffers, each where
// its key says; the manifest lists both files.
TEST(WriteCheckpointTest, AQatJobsCheckpointListsWorker0sBuffers) {
  std::string root;
  CheckpointWrite w = AllReduceWrite("qat", 44, absl::Seconds(20), &root);
  w.buffers = true;
  w.manifest.params.push_back({"w", {2}, DT_FLOAT32});
  Rendezvous rendezvous(RendezvousLimits{});
  rendezvous.Open("job", 1);
  std::vector<std::string> written;
  std::thread worker0([&] {
    const std::pair<std::string, std::string> keys[] = {{CheckpointPathKey(44), CheckpointSavedKey(44)},
                                                         {CheckpointBuffersPathKey(44), CheckpointBuffersSavedKey(44)}};
    for (const auto& [path_key, saved_key] : keys) {
      auto path = rendezvous.Get("job", 1, path_key, absl::Now() + absl::Seconds(20));
      if (!path.ok()) return;
      std::ofstream(*path) << "1234567";
      written.push_back(std::filesystem::path(*path).filename().string());
      (void)rendezvous.Set("job", 1, saved_key, Report(7, 99));
    }
  });
  absl::Status s = WriteCheckpoint(w, root, rendezvous);
  worker0.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(written, (std::vector<std::string>{"shard-0.bin", "buffers.pt"}));
  auto m = ReadManifest(w.dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->buffers.size(), 1u);
  EXPECT_EQ(m->buffers[0].file, "buffers.pt");
  EXPECT_EQ(m->buffers[0].bytes, 7u);
  EXPECT_EQ(m->buffers[0].crc32, 99u);
}

// Worker 0 saved its table but never its buffers: no checkpoint.
TEST(WriteCheckpointTest, AQatWorkerThatNeverSavesItsBuffersLeavesNothing) {
  std::string root;
  CheckpointWrite w = AllReduceWrite("qat_no_buffers", 45, absl::Milliseconds(300), &root);
  w.buffers = true;
  w.manifest.params.push_back({"w", {2}, DT_FLOAT32});
  Rendezvous rendezvous(RendezvousLimits{});
  rendezvous.Open("job", 1);
  ASSERT_TRUE(rendezvous.Set("job", 1, CheckpointSavedKey(45), Report(7, 99)).ok());
  absl::Status s = WriteCheckpoint(w, root, rendezvous);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("did not save its buffers"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(w.dir));
  EXPECT_FALSE(std::filesystem::exists(PendingCheckpointDir(w.dir)));
}

// A shard that hangs: its port takes connections (the kernel's backlog)
// and nobody ever answers on them, as a SIGSTOPped pstrain-ps.
class HungPort {
 public:
  HungPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "no listening socket: " << std::strerror(errno);
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  }
  ~HungPort() {
    if (fd_ >= 0) close(fd_);
  }
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

// A shard that hangs while the shards write (and is then declared lost:
// abandon says so) fails the checkpoint at once, with no directory left
// behind, instead of holding the paused workers until save_timeout.
TEST(WriteCheckpointTest, AHungShardsSaveIsAbandoned) {
  HungPort dense_and_rows, other;
  std::string root = std::filesystem::canonical(testing::TempDir()).string() + "/abandoned";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  CheckpointWrite w;
  w.job_id = "job";
  w.attempt = 1;
  w.pause_id = 44;
  w.shards = {dense_and_rows.address(), other.address()};
  w.embeddings = true;
  w.dir = root + "/job/ckpt-7";
  w.save_timeout = absl::Minutes(5);
  const absl::Time start = absl::Now();
  std::atomic<int> asked{0};
  w.abandon = [&]() -> std::string {
    ++asked;
    return absl::Now() - start > absl::Milliseconds(300) ? "shard 0 was declared lost" : "";
  };
  Rendezvous rendezvous(RendezvousLimits{});
  absl::Status s = WriteCheckpoint(w, root, rendezvous);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("shard 0 was declared lost"), std::string::npos) << s;
  EXPECT_LT(took, absl::Seconds(10)) << "the hung calls were not cancelled";
  EXPECT_GE(asked.load(), 2);
  EXPECT_FALSE(std::filesystem::exists(w.dir));
  EXPECT_FALSE(std::filesystem::exists(PendingCheckpointDir(w.dir)));
}

}  // namespace
}  // namespace pstrain
