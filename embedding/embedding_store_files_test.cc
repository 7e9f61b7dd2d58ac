// A shard's checkpoints of a job's embedding tables (EmbeddingStore::Save
// and Load): a restore onto another shard count, incremental saves racing
// updates, the bases a shard can vouch for, and a load that fails.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "embedding/embedding_files.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_store_testing.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

using namespace embedding_store_testing;  // NOLINT: the tests' vocabulary

TEST(EmbeddingStoreTest, ACheckpointRestoresOntoAnotherShardCountAndContinues) {
  // One shard trains SYNC for two steps and saves; two shards load the file
  // as attempt 2 at step 2, each keeping its own rows.
  EmbeddingStore one({});
  CreateJob(one, SYNC, 1);
  std::vector<int64_t> ids(200);
  for (int i = 0; i < 200; ++i) ids[i] = i * 7919;
  for (int step = 0; step < 2; ++step) {
    EmbeddingLookupResponse r;
    ASSERT_TRUE(one.Lookup(LookupOf(0, step, ids), Soon(), &r).ok());
    ASSERT_TRUE(one.Update(UpdateOf(0, step, ids, std::vector<float>(400, 1.0f + step))).ok());
  }
  const std::vector<float> saved = Read(one, ids, 2);
  const std::string path = ::testing::TempDir() + "/store.emb";
  auto info = one.Save("ctr", 1, path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rows, 200);
  std::vector<float> restored(400, -99.0f);
  for (uint32_t shard = 0; shard < 2; ++shard) {
    EmbeddingStore s({});
    InitEmbeddingsRequest init = Init(SYNC, 1, 2);
    init.set_num_shards(2);
    init.set_shard_index(shard);
    ASSERT_TRUE(s.Load(init, {{path}}, 2).ok());
    std::vector<int64_t> mine;
    std::vector<size_t> at;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ShardOfId(ids[i], 1024, 2) == shard) mine.push_back(ids[i]), at.push_back(i);
    }
    EmbeddingLookupRequest l = LookupOf(0, 2, mine);
    l.set_attempt(2);
    EmbeddingLookupResponse r;
    ASSERT_TRUE(s.Lookup(l, absl::Now() + absl::Seconds(1), &r).ok());  // step 2: no wait
    const std::vector<float> v = Values(r);
    for (size_t k = 0; k < at.size(); ++k) {
      restored[at[k] * 2] = v[k * 2];
      restored[at[k] * 2 + 1] = v[k * 2 + 1];
    }
    EmbeddingStatsRequest sr;
    sr.set_job("ctr");
    EmbeddingStatsResponse st;
    ASSERT_TRUE(s.Stats(sr, &st).ok());
    EXPECT_EQ(st.applied_steps(), 2);
    EXPECT_EQ(st.tables(0).rows(), static_cast<int64_t>(mine.size()));
  }
  EXPECT_EQ(restored, saved);
}

// Saves incremental on the one before, taken while three ranks push ASYNC
// updates, then one more after they stop: the chain read back is the store
// as it is, bit for bit. A change made while a save copies the stripes is
// either in that save or tagged for the next one, never lost between them.
TEST(EmbeddingStoreTest, IncrementalSavesRacingUpdatesLoseNoChange) {
  EmbeddingStore store({});
  CreateJob(store, ASYNC, 3);
  std::atomic<int> running{3};
  std::vector<std::thread> pushers;
  for (uint32_t rank = 0; rank < 3; ++rank) {
    pushers.emplace_back([&, rank] {
      for (int64_t step = 0; step < 2000; ++step) {
        std::vector<int64_t> ids;
        for (int k = 0; k < 64; ++k) ids.push_back((step * 131 + k * 17 + rank * 7) % 5000);
        EmbeddingLookupResponse r;
        ASSERT_TRUE(store.Lookup(LookupOf(rank, step, ids), Soon(), &r).ok());
        ASSERT_TRUE(store.Update(UpdateOf(rank, step, ids, std::vector<float>(64 * kDim, 0.01f * (rank + 1)))).ok());
      }
      --running;
    });
  }
  std::vector<std::vector<std::string>> chain;
  int during = 0;
  for (uint64_t id = 1; running > 0 || chain.size() < 3; ++id) {
    during += running > 0;
    chain.push_back({::testing::TempDir() + "/race-" + std::to_string(id) + ".emb"});
    auto info = store.Save("ctr", 1, chain.back()[0], id, id - 1);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->incremental, id > 1);
  }
  for (auto& p : pushers) p.join();
  chain.push_back({::testing::TempDir() + "/race-last.emb"});
  ASSERT_TRUE(store.Save("ctr", 1, chain.back()[0], 1000, chain.size() - 1).ok());
  const std::string now = ::testing::TempDir() + "/race-whole.emb";
  ASSERT_TRUE(store.Save("ctr", 1, now, 1001, 0).ok());
  auto read = [](const std::vector<std::vector<std::string>>& c) {
    auto tables = ReadEmbeddingFiles(c);
    EXPECT_TRUE(tables.ok()) << tables.status();
    std::map<int64_t, std::string> rows;
    if (!tables.ok()) return rows;
    EXPECT_TRUE((*tables)[0]->ForEachRow([&](const EmbeddingRowView& r) {
      std::string& b = rows[r.id];
      b.assign(reinterpret_cast<const char*>(r.value), sizeof(float) * (kDim + (*tables)[0]->slot_floats()));
      b.append(reinterpret_cast<const char*>(&r.last_step), sizeof(r.last_step));
      b.append(reinterpret_cast<const char*>(&r.count), sizeof(r.count));
      return absl::OkStatus();
    }).ok());
    return rows;
  };
  const auto whole = read({{now}});
  EXPECT_GT(whole.size(), 1000u);
  EXPECT_TRUE(read(chain) == whole) << "a chain of " << chain.size() << " saves, " << during << " during the pushes";
  EXPECT_GT(during, 0);
}

// A shard writes whole rows for a base it has no record of (another
// shard's, or a checkpoint before it loaded), and a store loaded from a
// chain can save incremental on the checkpoint it loaded.
TEST(EmbeddingStoreTest, IncrementalOnlyOnABaseTheShardWroteOrLoaded) {
  EmbeddingStore one({});
  CreateJob(one, ASYNC, 1);
  std::vector<int64_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = i * 104729;
  EmbeddingLookupResponse r;
  ASSERT_TRUE(one.Lookup(LookupOf(0, 0, ids), Soon(), &r).ok());
  const std::string dir = ::testing::TempDir();
  auto unknown = one.Save("ctr", 1, dir + "/vouch-0.emb", 7, 99);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_FALSE(unknown->incremental);
  EXPECT_EQ(unknown->rows, 100);
  ASSERT_TRUE(one.Update(UpdateOf(0, 0, {ids[0], ids[1]}, std::vector<float>(4, 1.0f))).ok());
  auto next = one.Save("ctr", 1, dir + "/vouch-1.emb", 8, 7);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->incremental);
  EXPECT_EQ(next->rows, 2);
  EXPECT_EQ(next->unchanged_rows, 98);

  EmbeddingStore two({});
  ASSERT_TRUE(two.Load(Init(ASYNC, 1, 2), {{dir + "/vouch-0.emb"}, {dir + "/vouch-1.emb"}}, 2).ok());
  auto after = two.Save("ctr", 2, dir + "/vouch-2.emb", 9, 8);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->incremental);
  EXPECT_EQ(after->rows, 0);
  EXPECT_EQ(after->unchanged_rows, 100);
}

TEST(EmbeddingStoreTest, ALoadThatFailsLeavesTheRunningJobAlone) {
  EmbeddingStore store({});
  CreateJob(store, ASYNC, 1);
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, {5}, {1, 1})).ok());
  const std::string bad = ::testing::TempDir() + "/not-a-checkpoint.emb";
  std::ofstream(bad) << "PSEMB01\n garbage";
  absl::Status s = store.Load(Init(ASYNC, 1, 2), {{bad}}, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(Read(store, {5}), std::vector<float>(2, 0.0f));  // attempt 1 still serves (no row yet: zeros)
  EXPECT_EQ(store.Load(Init(ASYNC, 1, 1), {}, 0).code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace pstrain
