// A shard's embedding tables per job: attempts, consistency (ASYNC, SYNC,
// SSP; SYNC with vacant ranks covered), retries, routing, hostile requests
// and the memory budget. Checkpoints: embedding_store_files_test.cc.
#include "embedding/embedding_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "embedding/embedding_store_testing.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

using namespace embedding_store_testing;  // NOLINT: the tests' vocabulary

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
  // Rank 2 lost again; its spare made active mid-step, after a survivor's
  // covering arrival: the step waits for the spare, whose empty arrival
  // (sent before its first step, for the step before it) completes it.
  seats.mutable_seats(2)->set_active(false);
  ASSERT_TRUE(store.SetWorkers(seats).ok());
  covering = UpdateOf(0, 3, {1}, {3, 3});
  covering.set_extra_batches(1);
  ASSERT_TRUE(store.Update(covering).ok());
  seats.mutable_seats(2)->set_active(true);
  ASSERT_TRUE(store.SetWorkers(seats).ok());
  ASSERT_TRUE(store.Update(UpdateOf(1, 3, {1}, {3, 3})).ok());
  EXPECT_TRUE(Held(store, 0, 4));
  empty = UpdateOf(2, 3, {}, {});
  empty.set_empty(true);
  ASSERT_TRUE(store.Update(empty).ok());
  EXPECT_EQ(Read(store, {1}, 4), std::vector<float>(2, -9.5f));  // (3 + 3) / 3
  ASSERT_TRUE(store.Update(empty).ok());  // again (the step is done): a retry
  covering.set_extra_batches(3);  // more batches than ranks
  EXPECT_EQ(store.Update(covering).code(), absl::StatusCode::kInvalidArgument);
  EmbeddingUpdateRequest empty_with_ids = UpdateOf(2, 4, {1}, {1, 1});
  empty_with_ids.set_empty(true);
  EXPECT_EQ(store.Update(empty_with_ids).code(), absl::StatusCode::kInvalidArgument);
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
