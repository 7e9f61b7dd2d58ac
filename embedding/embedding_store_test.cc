// A shard's embedding tables per job: attempts, consistency (ASYNC, SYNC,
// SSP), retries, routing, hostile requests and the memory budget.
#include "embedding/embedding_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "embedding/row_math.h"

namespace pstrain {
namespace {

constexpr int kDim = 2;

InitEmbeddingsRequest Init(Consistency consistency, uint32_t workers, uint64_t attempt = 1) {
  InitEmbeddingsRequest r;
  r.set_job("ctr");
  r.set_attempt(attempt);
  r.set_num_workers(workers);
  r.set_consistency(consistency);
  r.set_num_shards(1);
  EmbeddingTableConfig* t = r.add_tables();
  t->set_name("user");
  t->set_dim(kDim);
  t->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
  t->mutable_optimizer()->set_lr(1.0);
  t->mutable_initializer()->set_kind(EmbeddingInitializer::ZEROS);
  return r;
}

std::string Bytes(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}
std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A request of job "ctr" attempt 1 for table "user".
template <typename Request>
Request RequestOf(uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
  Request r;
  r.set_job("ctr");
  r.set_attempt(1);
  r.set_rank(rank);
  r.set_step(step);
  EmbeddingIds* e = r.add_tables();
  e->set_table("user");
  e->set_ids(Bytes(ids));
  return r;
}

EmbeddingLookupRequest LookupOf(uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
  return RequestOf<EmbeddingLookupRequest>(rank, step, ids);
}

EmbeddingUpdateRequest UpdateOf(uint32_t rank, int64_t step, const std::vector<int64_t>& ids,
                                const std::vector<float>& grads) {
  EmbeddingUpdateRequest r = RequestOf<EmbeddingUpdateRequest>(rank, step, ids);
  r.add_grads(Bytes(grads));
  return r;
}

std::vector<float> Values(const EmbeddingLookupResponse& r, int table = 0) {
  std::vector<float> v(r.values(table).size() / sizeof(float));
  std::memcpy(v.data(), r.values(table).data(), r.values(table).size());
  return v;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

void CreateJob(EmbeddingStore& store, Consistency c, uint32_t workers, uint32_t staleness = 0) {
  InitEmbeddingsRequest init = Init(c, workers);
  init.set_staleness(staleness);
  InitEmbeddingsResponse response;
  ASSERT_TRUE(store.Init(init, &response).ok());
  ASSERT_TRUE(response.created());
}

// Whether `rank`'s lookup for `step` is still held (50 ms).
bool Held(EmbeddingStore& store, uint32_t rank, int64_t step) {
  EmbeddingLookupResponse r;
  return store.Lookup(LookupOf(rank, step, {1}), absl::Now() + absl::Milliseconds(50), &r).code() ==
         absl::StatusCode::kDeadlineExceeded;
}

std::vector<float> Read(EmbeddingStore& store, const std::vector<int64_t>& ids, int64_t step = 0) {
  EmbeddingLookupResponse response;
  absl::Status s = store.Lookup(LookupOf(0, step, ids), Soon(), &response);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? Values(response) : std::vector<float>();
}

TEST(EmbeddingStoreTest, InitIsIdempotentAndAttemptsAreFenced) {
  EmbeddingStore store({});
  CreateJob(store, ASYNC, 1);
  InitEmbeddingsResponse response;
  ASSERT_TRUE(store.Init(Init(ASYNC, 1), &response).ok());
  EXPECT_FALSE(response.created());
  EXPECT_EQ(store.Init(Init(SYNC, 1), &response).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store.Init(Init(ASYNC, 1, 2), &response).ok());  // a restarted job
  EXPECT_TRUE(response.created());
  EmbeddingLookupResponse values;
  EXPECT_EQ(store.Lookup(LookupOf(0, 0, {1}), Soon(), &values).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.Init(Init(ASYNC, 1, 1), &response).code(), absl::StatusCode::kAborted);
}

TEST(EmbeddingStoreTest, AsyncUpdatesApplyOnArrivalScaledAndRetriesApplyOnce) {
  EmbeddingStore store({});
  CreateJob(store, ASYNC, 2);
  ASSERT_EQ(Read(store, {7}), std::vector<float>(2, 0.0f));
  ASSERT_TRUE(store.Update(UpdateOf(1, 0, {7}, {2, 4})).ok());
  EXPECT_EQ(Read(store, {7}), (std::vector<float>{-1, -2}));    // lr 1, 1/num_workers
  ASSERT_TRUE(store.Update(UpdateOf(1, 0, {7}, {2, 4})).ok());  // the same push again
  EXPECT_EQ(Read(store, {7}), (std::vector<float>{-1, -2}));
}

TEST(EmbeddingStoreTest, AReadOnlyLookupAnswersHeldRowsAndCreatesNone) {
  EmbeddingStore store({});
  CreateJob(store, ASYNC, 1);
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, {7}, {2, 4})).ok());  // no row yet: dropped
  Read(store, {7});
  ASSERT_TRUE(store.Update(UpdateOf(0, 1, {7}, {2, 4})).ok());
  EmbeddingLookupRequest r = LookupOf(0, 2, {9, 7});
  r.set_read_only(true);
  EmbeddingLookupResponse response;
  ASSERT_TRUE(store.Lookup(r, Soon(), &response).ok());
  EXPECT_EQ(Values(response), (std::vector<float>{0, 0, -2, -4}));
  EmbeddingStatsRequest sr;
  sr.set_job("ctr");
  EmbeddingStatsResponse stats;
  ASSERT_TRUE(store.Stats(sr, &stats).ok());
  EXPECT_EQ(stats.tables(0).rows(), 1);  // 9 was only read: no row
}

TEST(EmbeddingStoreTest, SyncAppliesTheMeanOnceEveryRankSentItsStep) {
  EmbeddingStore store({});
  CreateJob(store, SYNC, 2);
  ASSERT_EQ(Read(store, {1, 2}), std::vector<float>(4, 0.0f));
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, {1}, {2, 2})).ok());
  EmbeddingLookupResponse r;
  // Step 1 waits for rank 1's step 0.
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(store.Update(UpdateOf(1, 0, {1, 2}, {4, 4, 6, 6})).ok());
  });
  ASSERT_TRUE(store.Lookup(LookupOf(0, 1, {1, 2}), Soon(), &r).ok());
  late.join();
  EXPECT_EQ(Values(r), (std::vector<float>{-3, -3, -3, -3}));       // (2 + 4) / 2 and 6 / 2
  ASSERT_TRUE(store.Update(UpdateOf(1, 0, {1}, {100, 100})).ok());  // a late retry: ignored
  EXPECT_EQ(store.Update(UpdateOf(0, 5, {1}, {1, 1})).code(), absl::StatusCode::kFailedPrecondition);
  EmbeddingStatsResponse stats;
  ASSERT_TRUE(store.Stats({}, &stats).code() == absl::StatusCode::kNotFound);
  EmbeddingStatsRequest sr;
  sr.set_job("ctr");
  ASSERT_TRUE(store.Stats(sr, &stats).ok());
  EXPECT_EQ(stats.applied_steps(), 1);
  EXPECT_EQ(stats.tables(0).updates(), 2);
}

TEST(EmbeddingStoreTest, ASyncLookupPastItsDeadlineNamesTheLateRank) {
  EmbeddingStore store({});
  CreateJob(store, SYNC, 3);
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, {1}, {1, 1})).ok());
  ASSERT_TRUE(store.Update(UpdateOf(2, 0, {1}, {1, 1})).ok());
  EmbeddingLookupResponse r;
  absl::Status s = store.Lookup(LookupOf(0, 1, {1}), absl::Now() + absl::Milliseconds(100), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("rank(s) 1"), std::string::npos) << s;
}

TEST(EmbeddingStoreTest, SspWaitsOnlyForRanksPastTheBound) {
  EmbeddingStore store({});
  CreateJob(store, SSP, 2, /*staleness=*/1);
  EmbeddingLookupResponse r;
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, {1}, {1, 1})).ok());
  ASSERT_TRUE(store.Update(UpdateOf(0, 1, {1}, {1, 1})).ok());
  // Step 1 may run one step ahead of rank 1 (which sent nothing yet).
  ASSERT_TRUE(store.Lookup(LookupOf(0, 1, {1}), Soon(), &r).ok());
  EXPECT_TRUE(Held(store, 0, 2));  // step 2 needs rank 1's step 0
  ASSERT_TRUE(store.Update(UpdateOf(1, 0, {1}, {1, 1})).ok());
  ASSERT_TRUE(store.Lookup(LookupOf(0, 2, {1}), Soon(), &r).ok());
}

// A lost worker's rank, made inactive by the coordinator's SetWorkers (the
// shard's dense one, passed on), no longer holds the others' SSP lookups;
// the spare that takes it over waits for nobody on its own account.
TEST(EmbeddingStoreTest, SspWaitsOnlyForActiveRanks) {
  EmbeddingStore store({});
  CreateJob(store, SSP, 3, /*staleness=*/1);
  EmbeddingLookupResponse r;
  for (uint32_t rank : {0, 1}) {
    for (int64_t step : {0, 1}) ASSERT_TRUE(store.Update(UpdateOf(rank, step, {1}, {1, 1})).ok());
  }
  ASSERT_TRUE(store.Update(UpdateOf(2, 0, {1}, {1, 1})).ok());  // rank 2 dies after its step 0
  EXPECT_TRUE(Held(store, 0, 3));  // step 3 needs every rank's step 1
  SetWorkersRequest seats;
  seats.set_job("ctr");
  seats.set_attempt(2);  // another attempt's: nothing changes
  for (bool active : {true, true, false}) seats.add_seats()->set_active(active);
  store.SetWorkers(seats);
  EXPECT_TRUE(Held(store, 0, 3));
  seats.set_attempt(1);
  store.SetWorkers(seats);
  ASSERT_TRUE(store.Lookup(LookupOf(0, 3, {1}), Soon(), &r).ok());
  // A spare takes rank 2 over at step 2 (its step 1 was lost): active
  // again, it holds the others, but not itself.
  seats.mutable_seats(2)->set_active(true);
  store.SetWorkers(seats);
  EXPECT_TRUE(Held(store, 0, 3));
  ASSERT_TRUE(store.Lookup(LookupOf(2, 2, {1}), Soon(), &r).ok());
  ASSERT_TRUE(store.Update(UpdateOf(2, 2, {1}, {1, 1})).ok());
  ASSERT_TRUE(store.Lookup(LookupOf(0, 3, {1}), Soon(), &r).ok());
}

// SYNC with a rank lost: SetWorkers completes the step that waited only for
// it (the mean over the batches that arrived); then a rank covering its
// batch sends the sum of two (extra_batches 1), a replacement whose batch
// was covered an empty arrival, and each step moves the rows by the mean
// over every batch of the step.
TEST(EmbeddingStoreTest, SyncCompletesWithTheActiveRanksOverTheirBatches) {
  EmbeddingStore store({});
  CreateJob(store, SYNC, 3);
  ASSERT_EQ(Read(store, {1}), std::vector<float>(2, 0.0f));
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, {1}, {3, 3})).ok());
  ASSERT_TRUE(store.Update(UpdateOf(1, 0, {1}, {6, 6})).ok());
  EXPECT_TRUE(Held(store, 0, 1));  // rank 2 is lost before its step 0
  SetWorkersRequest seats;
  seats.set_job("ctr");
  seats.set_attempt(1);
  for (bool active : {true, true, false}) seats.add_seats()->set_active(active);
  ASSERT_TRUE(store.SetWorkers(seats).ok());
  EXPECT_EQ(Read(store, {1}, 1), std::vector<float>(2, -4.5f));  // (3 + 6) / 2
  EmbeddingUpdateRequest covering = UpdateOf(0, 1, {1}, {3, 3});
  covering.set_extra_batches(1);
  ASSERT_TRUE(store.Update(covering).ok());
  ASSERT_TRUE(store.Update(UpdateOf(1, 1, {1}, {3, 3})).ok());
  EXPECT_EQ(Read(store, {1}, 2), std::vector<float>(2, -6.5f));  // (3 + 3) / 3 batches
  seats.mutable_seats(2)->set_active(true);  // a spare takes rank 2 over at step 2
  ASSERT_TRUE(store.SetWorkers(seats).ok());
  EmbeddingUpdateRequest empty = UpdateOf(2, 2, {}, {});
  empty.set_empty(true);
  ASSERT_TRUE(store.Update(empty).ok());
  covering = UpdateOf(0, 2, {1}, {2, 2});
  covering.set_extra_batches(1);
  ASSERT_TRUE(store.Update(covering).ok());
  EXPECT_TRUE(Held(store, 0, 3));  // rank 1 still owes step 2
  ASSERT_TRUE(store.Update(UpdateOf(1, 2, {1}, {1, 1})).ok());
  EXPECT_EQ(Read(store, {1}, 3), std::vector<float>(2, -7.5f));  // (2 + 1) / 3
  covering.set_extra_batches(3);  // more batches than ranks
  EXPECT_EQ(store.Update(covering).code(), absl::StatusCode::kInvalidArgument);
  EmbeddingStore async({});
  CreateJob(async, ASYNC, 3);
  covering.set_extra_batches(1);
  EXPECT_EQ(async.Update(covering).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingStoreTest, HostileRequestsChangeNothing) {
  EmbeddingStore store({});
  CreateJob(store, ASYNC, 1);
  EmbeddingUpdateRequest u = UpdateOf(0, 0, {1}, {1, 1});
  u.mutable_tables(0)->set_ids("1234567");  // not a whole int64
  EXPECT_EQ(store.Update(u).code(), absl::StatusCode::kInvalidArgument);
  u = UpdateOf(0, 0, {1, 2}, {1, 1});  // gradients for one id of two
  EXPECT_EQ(store.Update(u).code(), absl::StatusCode::kInvalidArgument);
  u = UpdateOf(0, 0, {1}, {1, std::nanf("")});
  absl::Status s = store.Update(u);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NaN"), std::string::npos);
  u = UpdateOf(5, 0, {1}, {1, 1});
  EXPECT_EQ(store.Update(u).code(), absl::StatusCode::kInvalidArgument);  // no rank 5
  EmbeddingLookupRequest l = LookupOf(0, 0, {1});
  l.mutable_tables(0)->set_table("nope");
  EmbeddingLookupResponse r;
  EXPECT_EQ(store.Lookup(l, Soon(), &r).code(), absl::StatusCode::kInvalidArgument);
  l = LookupOf(0, 0, {1});
  *l.add_tables() = l.tables(0);  // the same table twice
  EXPECT_EQ(store.Lookup(l, Soon(), &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read(store, {1}), std::vector<float>(2, 0.0f));  // nothing was applied
}

TEST(EmbeddingStoreTest, IdsOfAnotherShardAreRefusedNamingTheirShard) {
  EmbeddingStore store({});
  InitEmbeddingsRequest init = Init(ASYNC, 1);
  init.set_num_shards(2);
  init.set_shard_index(1);
  InitEmbeddingsResponse created;
  ASSERT_TRUE(store.Init(init, &created).ok());
  int64_t mine = 0, theirs = 0;
  while (ShardOfId(mine, 1024, 2) != 1) ++mine;
  while (ShardOfId(theirs, 1024, 2) != 0) ++theirs;
  EmbeddingLookupResponse r;
  ASSERT_TRUE(store.Lookup(LookupOf(0, 0, {mine}), Soon(), &r).ok());
  absl::Status s = store.Lookup(LookupOf(0, 0, {mine, theirs}), Soon(), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("belongs to shard 0"), std::string::npos) << s;
}

TEST(EmbeddingStoreTest, DropGivesTheMemoryBackAndWakesWaiters) {
  ByteBudget budget(64 << 20);
  EmbeddingStore store({&budget});
  CreateJob(store, SYNC, 2);
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = i;
  Read(store, ids);
  ASSERT_TRUE(store.Update(UpdateOf(0, 0, ids, std::vector<float>(2000, 1.0f))).ok());
  EXPECT_GT(budget.used(), 0u);
  absl::Status waited;
  std::thread waiter([&] {
    EmbeddingLookupResponse r;
    waited = store.Lookup(LookupOf(0, 1, {1}), Soon(), &r);
  });
  absl::SleepFor(absl::Milliseconds(100));
  DropEmbeddingsRequest drop;
  drop.set_job("ctr");
  drop.set_attempt(1);
  ASSERT_TRUE(store.Drop(drop).ok());
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(budget.used(), 0u);
}

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

TEST(EmbeddingStoreTest, ALookupWhoseAnswerWouldBeTooLargeIsRefusedBeforeAnyRow) {
  EmbeddingStoreOptions options;
  options.max_response_bytes = 1000 * kDim * sizeof(float);
  EmbeddingStore store(options);
  CreateJob(store, ASYNC, 1);
  std::vector<int64_t> ids(1001);
  for (int i = 0; i < 1001; ++i) ids[i] = i;
  EmbeddingLookupResponse r;
  absl::Status s = store.Lookup(LookupOf(0, 0, ids), Soon(), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("fewer ids"), std::string::npos) << s;
  ids.pop_back();
  EXPECT_TRUE(store.Lookup(LookupOf(0, 0, ids), Soon(), &r).ok());
  EmbeddingStatsRequest sr;
  sr.set_job("ctr");
  EmbeddingStatsResponse st;
  ASSERT_TRUE(store.Stats(sr, &st).ok());
  EXPECT_EQ(st.tables(0).lookups(), 1000);  // the refused one looked nothing up
}

}  // namespace
}  // namespace pstrain
