// The shard store's checkpoint files against hostile names, special files
// and crafted or mutated contents.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "common/file_util.h"
#include "common/quote.h"
#include "table/shard_store.h"
#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

class ShardStoreFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Init(store_, Config(ASYNC, 1)).ok()); }
  absl::Status Save(const std::string& path, SaveTableResponse* out = nullptr) {
    SaveTableRequest req;
    req.set_job("job");
    req.set_path(path);
    SaveTableResponse local;
    return WaitFor([&](StatusCallback d) { store_.SaveTableAsync(req, out ? out : &local, {}, d); });
  }
  absl::Status Load(const std::string& path, uint64_t bytes, uint32_t crc, const std::string& job = "restored") {
    LoadTableRequest req;
    req.set_job(job);
    *req.mutable_config() = Config(ASYNC, 1);
    auto* f = req.add_files();
    f->set_path(path);
    f->set_bytes(bytes);
    f->set_crc32(crc);
    req.add_keys("a");
    LoadTableResponse resp;
    return WaitFor([&](StatusCallback d) { store_.LoadTableAsync(req, &resp, {}, d); });
  }
  ShardStore store_{Options()};
};

TEST_F(ShardStoreFilesTest, NamesOutsideTheRootAreRefused) {
  const std::string outside = ::testing::TempDir() + "/outside-victim";
  ASSERT_TRUE(WriteFileAtomically(outside, "precious").ok());
  std::filesystem::create_directories(Root() + "/jobdir");
  std::error_code ec;
  std::filesystem::remove(Root() + "/jobdir/escape", ec);
  std::filesystem::create_directory_symlink(::testing::TempDir(), Root() + "/jobdir/escape");
  const std::vector<std::pair<std::string, absl::StatusCode>> names = {
      {"../outside-victim", absl::StatusCode::kInvalidArgument},
      {"a/../../outside-victim", absl::StatusCode::kInvalidArgument},
      {outside, absl::StatusCode::kInvalidArgument},  // absolute
      {std::string("ok\0/../../x", 11), absl::StatusCode::kInvalidArgument},
      {"", absl::StatusCode::kInvalidArgument},
      {"./x", absl::StatusCode::kInvalidArgument},
      {std::string(2000, 'n'), absl::StatusCode::kInvalidArgument},
      {"jobdir/escape/outside-victim", absl::StatusCode::kPermissionDenied},  // through a symlink
  };
  for (const auto& [name, code] : names) {
    absl::Status s = Save(name);
    EXPECT_EQ(s.code(), code) << Quote(name) << ": " << s;
    EXPECT_LT(s.message().size(), 400u);
    s = Load(name, 10, 0);
    EXPECT_EQ(s.code(), code) << Quote(name) << ": " << s;
  }
  EXPECT_EQ(*ReadFile(outside), "precious");
  SaveTableResponse saved;
  ASSERT_TRUE(Save("job-1/ckpt-5.tmp/shard-0.bin", &saved).ok());  // directories are made
  EXPECT_TRUE(std::filesystem::exists(Root() + "/job-1/ckpt-5.tmp/shard-0.bin"));
  EXPECT_TRUE(Load(saved.path(), saved.bytes(), saved.crc32()).ok());
}

TEST_F(ShardStoreFilesTest, SpecialFilesNeverBlockOrFillTheShard) {
  const std::string fifo = Root() + "/fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::error_code ec;
  std::filesystem::remove(Root() + "/zero", ec);
  std::filesystem::create_symlink("/dev/zero", Root() + "/zero");
  std::filesystem::create_directories(Root() + "/dir");
  for (const std::string name : {"fifo", "zero", "dir", "missing"}) {
    const absl::Time start = absl::Now();
    absl::Status s = Load(name, 1 << 20, 0);
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << name;
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << name << ": " << s;
    EXPECT_FALSE(s.message().empty());
  }
  // A file larger than the manifest says is not read whole.
  ASSERT_TRUE(WriteFileAtomically(Root() + "/large", std::string(1 << 20, 'x')).ok());
  absl::Status s = Load("large", 100, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(Load("large", 0, 0).code(), absl::StatusCode::kInvalidArgument);  // a size is required
}

// Checkpoint files whose size and CRC match but whose contents are absurd
// are refused field by field, naming what is wrong.
TEST_F(ShardStoreFilesTest, CraftedCheckpointContentsAreRefusedFieldByField) {
  SaveTableResponse saved;
  ASSERT_TRUE(Save("good.bin", &saved).ok());
  TableSnapshot good;
  ASSERT_TRUE(good.ParseFromString(*ReadFile(Root() + "/good.bin")));
  struct Case {
    const char* what;
    std::function<void(TableSnapshot*)> mutate;
  };
  const std::vector<Case> cases = {
      {"version", [](TableSnapshot* t) { t->mutable_chunks(0)->set_version(-5); }},
      {"worker step", [](TableSnapshot* t) { t->mutable_chunks(0)->set_last_step(0, INT64_MAX); }},
      {"optimizer step", [](TableSnapshot* t) { t->mutable_chunks(0)->mutable_state(0)->set_optimizer_step(-1); }},
      {"state slot", [](TableSnapshot* t) { t->mutable_chunks(0)->mutable_state(0)->add_slots("xyz"); }},
      {"state sets", [](TableSnapshot* t) { t->mutable_chunks(0)->add_state(); }},
      {"value bytes", [](TableSnapshot* t) { t->mutable_chunks(0)->set_value("abc"); }},
      {"NaN", [](TableSnapshot* t) {
         float nan = std::nanf("");
         std::string v = t->chunks(0).value();
         std::memcpy(&v[0], &nan, 4);
         t->mutable_chunks(0)->set_value(v);
       }},
      {"twice", [](TableSnapshot* t) { *t->add_chunks() = t->chunks(0); }},
      {"shape", [](TableSnapshot* t) { t->mutable_chunks(0)->set_shape(0, -3); }},
      {"float", [](TableSnapshot* t) { t->mutable_chunks(0)->set_dtype(DT_INT32); }},
      {"worker steps", [](TableSnapshot* t) { t->mutable_chunks(0)->add_last_step(1); }},
      {"config", [](TableSnapshot* t) { t->mutable_config()->set_num_workers(0); }},
  };
  for (const Case& c : cases) {
    TableSnapshot bad = good;
    c.mutate(&bad);
    const std::string bytes = bad.SerializeAsString();
    ASSERT_TRUE(WriteFileAtomically(Root() + "/bad.bin", bytes).ok());
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
    absl::Status s = Load("bad.bin", bytes.size(), crc);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.what << ": " << s;
  }
  EXPECT_TRUE(Load("good.bin", saved.bytes(), saved.crc32()).ok());
}

// A seeded mutation loop over a valid checkpoint file (bounded in time): the
// loader refuses or loads, never crashes, and what it loads is finite.
TEST_F(ShardStoreFilesTest, MutatedCheckpointFilesAreRefusedOrLoadCleanly) {
  SaveTableResponse saved;
  ASSERT_TRUE(Save("seed.bin", &saved).ok());
  const std::string seed = *ReadFile(Root() + "/seed.bin");
  std::mt19937 rng(7);
  const absl::Time end = absl::Now() + absl::Seconds(3);
  int loaded = 0, refused = 0;
  for (int iter = 0; absl::Now() < end && iter < 20000; ++iter) {
    std::string m = seed;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
      const size_t at = rng() % m.size();
      if (rng() % 3 == 0) {
        m.insert(at, 1, static_cast<char>(rng()));
      } else {
        m[at] = static_cast<char>(rng());
      }
    }
    ASSERT_TRUE(WriteFileAtomically(Root() + "/mut.bin", m).ok());
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(m.data()), m.size()));
    const std::string job = "m" + std::to_string(iter);
    absl::Status s = Load("mut.bin", m.size(), crc, job);
    if (!s.ok()) {
      ++refused;
      EXPECT_TRUE(absl::IsDataLoss(s) || absl::IsInvalidArgument(s)) << s;
      continue;
    }
    ++loaded;
    PullRequest pull;
    pull.set_job(job);
    pull.add_keys("a");
    PullResponse pr;
    std::vector<TensorBuffer> values;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { store_.PullAsync(pull, &pr, &values, {}, d); }).ok());
    EXPECT_TRUE(AllFinite(values[0].dtype, values[0].data, values[0].nbytes));
    DropTableRequest drop;
    drop.set_job(job);
    DropTableResponse dropped;
    (void)WaitFor([&](StatusCallback d) { store_.DropTableAsync(drop, &dropped, {}, d); });
  }
  std::printf("checkpoint fuzz: %d loaded, %d refused\n", loaded, refused);
  EXPECT_GT(loaded + refused, 100);
}

}  // namespace
}  // namespace pstrain
