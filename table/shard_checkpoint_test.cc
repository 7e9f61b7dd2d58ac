// Checkpoint files of the shard store: save on two shards, restore onto
// three; corrupt or incomplete checkpoints refused.
#include "table/shard_store.h"
#include "table/shard_store_testing.h"

#include "common/file_util.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT


TEST(ShardCheckpointTest, SaveTwoShardsRestoreOntoThree) {
  TableConfig config = SharedConfig(ASYNC, 1, 0.1);
  config.mutable_optimizer()->set_momentum(0.9);
  const std::vector<std::string> keys = {"a", "b", "c", "d", "e"};
  std::vector<std::unique_ptr<ShardStore>> old;
  std::vector<LoadTableRequest::File> files;
  for (int s = 0; s < 2; ++s) {
    old.push_back(std::make_unique<ShardStore>(Rooted(static_cast<uint32_t>(s), 2)));
    InitTableRequest init;
    init.set_job("job");
    *init.mutable_config() = config;
    std::vector<TensorBuffer> values;
    for (size_t k = s; k < keys.size(); k += 2) {
      init.add_keys(keys[k]);
      values.push_back(Floats({float(k), float(k) + 0.5f}));
    }
    InitTableResponse ir;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { old[s]->InitTableAsync(init, values, &ir, {}, d); }).ok());
    for (int step = 0; step < 3; ++step) {
      PushRequest push;
      push.set_job("job");
      push.set_step(step);
      std::vector<TensorBuffer> grads;
      for (const auto& k : init.keys()) {
        push.add_keys(k);
        grads.push_back(Floats({1, -1}));
      }
      PushResponse pr;
      ASSERT_TRUE(WaitFor([&](StatusCallback d) { old[s]->PushAsync(push, grads, &pr, {}, d); }).ok());
    }
    SaveTableRequest save;
    save.set_job("job");
    save.set_path("ckpt-1/shard-" + std::to_string(s));
    SaveTableResponse saved;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { old[s]->SaveTableAsync(save, &saved, {}, d); }).ok());
    EXPECT_EQ(saved.min_version(), 3);
    LoadTableRequest::File f;
    f.set_path(saved.path());
    f.set_crc32(saved.crc32());
    f.set_bytes(saved.bytes());
    files.push_back(f);
  }
  auto pull = [](ShardStore& store, const std::string& key) {
    PullRequest req;
    req.set_job("job");
    req.add_keys(key);
    PullResponse resp;
    std::vector<TensorBuffer> values;
    EXPECT_TRUE(WaitFor([&](StatusCallback d) { store.PullAsync(req, &resp, &values, {}, d); }).ok());
    return values.empty() ? std::vector<float>{} : ToFloats(values[0]);
  };
  std::vector<std::unique_ptr<ShardStore>> fresh;
  for (int s = 0; s < 3; ++s) {
    fresh.push_back(std::make_unique<ShardStore>(Rooted(static_cast<uint32_t>(s), 3)));
    LoadTableRequest load;
    load.set_job("job");
    *load.mutable_config() = config;
    for (const auto& f : files) *load.add_files() = f;
    for (size_t k = s; k < keys.size(); k += 3) load.add_keys(keys[k]);
    LoadTableResponse lr;
    absl::Status st = WaitFor([&](StatusCallback d) { fresh[s]->LoadTableAsync(load, &lr, {}, d); });
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(lr.min_version(), 3);
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    ShardStore& before = *old[k % 2];
    ShardStore& after = *fresh[k % 3];
    EXPECT_EQ(pull(before, keys[k]), pull(after, keys[k])) << keys[k];
    // The same next push gives the same result: momentum carried over.
    for (ShardStore* store : {&before, &after}) {
      PushRequest push;
      push.set_job("job");
      push.set_step(3);
      push.add_keys(keys[k]);
      PushResponse pr;
      ASSERT_TRUE(WaitFor([&](StatusCallback d) { store->PushAsync(push, {Floats({2, 2})}, &pr, {}, d); }).ok());
      EXPECT_EQ(pr.applied(), 1u);
    }
    EXPECT_EQ(pull(before, keys[k]), pull(after, keys[k])) << keys[k];
  }
}

TEST(ShardCheckpointTest, CorruptOrIncompleteCheckpointsAreRefused) {
  ShardStore store{Rooted()};
  InitTableRequest init;
  init.set_job("job");
  *init.mutable_config() = SharedConfig(ASYNC, 1);
  init.add_keys("a");
  InitTableResponse ir;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.InitTableAsync(init, {Floats({1, 2})}, &ir, {}, d); }).ok());
  SaveTableRequest save;
  save.set_job("job");
  save.set_path("ckpt-corrupt");
  SaveTableResponse saved;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.SaveTableAsync(save, &saved, {}, d); }).ok());
  auto load = [&](const std::string& job, std::vector<std::string> keys, uint32_t crc) {
    ShardStore target{Rooted()};
    LoadTableRequest req;
    req.set_job(job);
    *req.mutable_config() = SharedConfig(ASYNC, 1);
    auto* f = req.add_files();
    f->set_path(saved.path());
    f->set_crc32(crc);
    f->set_bytes(saved.bytes());
    for (auto& k : keys) req.add_keys(k);
    LoadTableResponse lr;
    return WaitFor([&](StatusCallback d) { target.LoadTableAsync(req, &lr, {}, d); });
  };
  EXPECT_TRUE(load("job", {"a"}, saved.crc32()).ok());
  absl::Status s = load("job", {"a"}, saved.crc32() ^ 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("ckpt-corrupt"), absl::string_view::npos) << s;
  // Nothing about the file itself: its real crc32 stays in the shard's log.
  EXPECT_EQ(s.message().find(std::to_string(saved.crc32())), absl::string_view::npos) << s;
  s = load("job", {"a", "zzz"}, saved.crc32());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("zzz"), absl::string_view::npos) << s;
  // A truncated file.
  const std::string file = Rooted().checkpoint_root + "/" + saved.path();
  std::string bytes = *ReadFile(file);
  ASSERT_TRUE(WriteFileAtomically(file, bytes.substr(0, bytes.size() / 2)).ok());
  s = load("job", {"a"}, saved.crc32());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find(std::to_string(bytes.size() / 2)), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace pstrain
