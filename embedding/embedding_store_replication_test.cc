// Replicated embedding tables on the shards' side (issue 34): three
// EmbeddingStores in one process, forwarding to one another as pstrain-ps
// does over gRPC. A promoted backup must answer exactly what its leader
// would have (forwarding after aggregation, idempotent retries), a replaced
// leader must never write again (fencing), and a backup one forward behind
// is mended by the new leader's first round.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "embedding/embedding_store_replication_testing.h"

namespace pstrain {
namespace {

TEST_F(ReplicatedShards, APromotedBackupAnswersTheRowsItsLeaderHeldSync) {
  CreateJob(SYNC, 2, 1);
  const std::vector<int64_t> ids = IdsOf(0, 20);
  for (int64_t step = 0; step < 5; ++step) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      std::vector<int64_t> some(ids.begin() + rank * 5, ids.end() - (1 - rank) * 5);  // overlapping, not equal
      ASSERT_TRUE(Lookup(0, 0, rank, step, some).ok());
      ASSERT_TRUE(Update(0, 0, rank, step, some).ok());
    }
  }
  EXPECT_EQ(forwards_.load(), 5);  // one per step, to shard 1 (slot 0's backup)
  std::vector<float> leader, promoted;
  ASSERT_TRUE(Lookup(0, 0, 0, 5, ids, &leader, /*read_only=*/true).ok());
  // A backup serves nothing while its leader leads.
  absl::Status s = Lookup(1, 0, 0, 5, ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  Route(1, {0}, {1, 2});
  ASSERT_TRUE(Lookup(1, 0, 0, 5, ids, &promoted, /*read_only=*/true).ok());
  EXPECT_EQ(promoted, leader);  // bit for bit: values and Adam's moments went with them
  // The promoted copy trains on, and leads its own slot and the lost one's.
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Update(1, 0, rank, 5, ids).ok());
  std::vector<float> after;
  ASSERT_TRUE(Lookup(1, 0, 0, 6, ids, &after, /*read_only=*/true).ok());
  EXPECT_NE(after, promoted);
  EmbeddingStatsResponse stats;
  EmbeddingStatsRequest sr;
  sr.set_job("ctr");
  ASSERT_TRUE(shards_[1]->Stats(sr, &stats).ok());
  EXPECT_EQ(std::vector<uint32_t>(stats.led_slots().begin(), stats.led_slots().end()), (std::vector<uint32_t>{0, 1}));
}

TEST_F(ReplicatedShards, ConcurrentAsyncUpdatesReachTheBackupInTheOrderTheyWereApplied) {
  CreateJob(ASYNC, 4, 1);
  const std::vector<int64_t> ids = IdsOf(2, 8);  // slot 2, backed up on shard 0
  std::vector<std::thread> ranks;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    ranks.emplace_back([&, rank] {
      for (int64_t step = 0; step < 25; ++step) {
        ASSERT_TRUE(Lookup(2, 2, rank, step, ids).ok());
        ASSERT_TRUE(Update(2, 2, rank, step, ids).ok());  // every rank updates every row: they race
      }
    });
  }
  for (auto& t : ranks) t.join();
  std::vector<float> leader, promoted;
  ASSERT_TRUE(Lookup(2, 2, 0, 25, ids, &leader, true).ok());
  Route(1, {2}, {0, 1});
  ASSERT_TRUE(Lookup(0, 2, 0, 25, ids, &promoted, true).ok());
  EXPECT_EQ(promoted, leader);
  // A rank's retry of an update the old leader applied is recognised on the
  // promoted copy (its step travelled with the rows): nothing changes.
  ASSERT_TRUE(Update(0, 2, 3, 24, ids).ok());
  ASSERT_TRUE(Lookup(0, 2, 0, 25, ids, &promoted, true).ok());
  EXPECT_EQ(promoted, leader);
}

TEST_F(ReplicatedShards, AStepTheLeaderDiedInIsTrainedOnceFromTheRetriedUpdates) {
  // The reference: the same updates on one unreplicated slot.
  EmbeddingStore reference(EmbeddingStoreOptions{});
  InitEmbeddingsRequest one = Init(SYNC, 2, 0, 0);
  one.set_num_shards(1);
  one.clear_routing();
  one.mutable_tables(0)->set_virtual_shards(kVirtualShards);
  InitEmbeddingsResponse created;
  ASSERT_TRUE(reference.Init(one, &created).ok());
  CreateJob(SYNC, 2, 1);
  const std::vector<int64_t> ids = IdsOf(1, 10);
  const std::vector<int64_t> more = IdsOf(1, 14);  // and 4 ids first looked up in step 3
  auto ref_lookup = [&](uint32_t rank, int64_t step, const std::vector<int64_t>& of) {
    auto r = RequestOf<EmbeddingLookupRequest>(0, rank, step, of);
    r.clear_slot();
    EmbeddingLookupResponse ignored;
    return reference.Lookup(r, absl::Now() + absl::Seconds(5), &ignored);
  };
  auto ref_update = [&](uint32_t rank, int64_t step, const std::vector<int64_t>& ids) {
    auto r = RequestOf<EmbeddingUpdateRequest>(0, rank, step, ids);
    r.clear_slot();
    const std::vector<float> grads = GradsOf(rank, step, ids.size());
    r.add_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
    return reference.Update(r);
  };
  for (int64_t step = 0; step < 3; ++step) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(Lookup(1, 1, rank, step, ids).ok());
      ASSERT_TRUE(Update(1, 1, rank, step, ids).ok());
      ASSERT_TRUE(ref_lookup(rank, step, ids).ok());
      ASSERT_TRUE(ref_update(rank, step, ids).ok());
    }
  }
  // Step 3: both ranks look up, 4 of the ids for the first time (their rows
  // are made on the leader only); rank 0's update reaches the leader, which
  // dies before rank 1's.
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(Lookup(1, 1, rank, 3, more).ok());
    ASSERT_TRUE(ref_lookup(rank, 3, more).ok());
  }
  ASSERT_TRUE(Update(1, 1, 0, 3, more).ok());
  Route(1, {1}, {0, 2});
  // Both ranks send step 3 again, to slot 1's backup (shard 2); rank 1 twice.
  // The rows the leader made are made again there, not left without their
  // updates.
  ASSERT_TRUE(Update(2, 1, 0, 3, more).ok());
  ASSERT_TRUE(Update(2, 1, 1, 3, more).ok());
  ASSERT_TRUE(Update(2, 1, 1, 3, more).ok());
  ASSERT_TRUE(ref_update(0, 3, more).ok());
  ASSERT_TRUE(ref_update(1, 3, more).ok());
  std::vector<float> got, want;
  ASSERT_TRUE(Lookup(2, 1, 0, 4, more, &got, true).ok());
  auto r = RequestOf<EmbeddingLookupRequest>(0, 0, 4, more);
  r.clear_slot();
  r.set_read_only(true);
  EmbeddingLookupResponse response;
  ASSERT_TRUE(reference.Lookup(r, absl::Now() + absl::Seconds(5), &response).ok());
  want.resize(response.values(0).size() / sizeof(float));
  std::memcpy(want.data(), response.values(0).data(), response.values(0).size());
  EXPECT_EQ(got, want);  // every step once, no update lost, bit for bit
}

TEST_F(ReplicatedShards, AReplacedLeaderThatWritesAgainIsFenced) {
  CreateJob(ASYNC, 1, 1);
  const std::vector<int64_t> ids = IdsOf(0, 4);
  ASSERT_TRUE(Lookup(0, 0, 0, 0, ids).ok());
  ASSERT_TRUE(Update(0, 0, 0, 0, ids).ok());
  std::vector<float> before;
  Route(1, {0}, {1, 2});  // shard 0 (paused, say) is not told
  ASSERT_TRUE(Lookup(1, 0, 0, 1, ids, &before, true).ok());
  // The old leader applies a push and forwards it: refused, so it cannot answer.
  absl::Status s = Update(0, 0, 0, 1, ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("refused"), std::string::npos) << s;
  // From then on it leads nothing.
  s = Lookup(0, 0, 0, 2, ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  std::vector<float> after;
  ASSERT_TRUE(Lookup(1, 0, 0, 2, ids, &after, true).ok());
  EXPECT_EQ(after, before);  // the fenced write never reached the promoted copy
  // A forward from a shard that does not lead, straight to a backup: refused.
  ReplicateEmbeddingsRequest forged;
  forged.set_job("ctr");
  forged.set_attempt(1);
  forged.set_slot(0);
  forged.set_sender(2);
  ReplicateEmbeddingsResponse ignored;
  EXPECT_EQ(shards_[1]->Replicate(forged, &ignored).code(), absl::StatusCode::kAborted);  // shard 1 leads slot 0
  EXPECT_EQ(shards_[2]->Replicate(forged, &ignored).code(), absl::StatusCode::kFailedPrecondition);  // holds no copy
}

TEST_F(ReplicatedShards, ABackupOneForwardBehindIsMendedByTheNewLeadersFirstRound) {
  for (auto& s : shards_) s.reset();
  Start(absl::Seconds(1));  // the old leader gives up on an unreachable backup quickly
  CreateJob(SYNC, 1, 2);    // slot 0 on shards 0, 1 and 2
  const std::vector<int64_t> ids = IdsOf(0, 6);
  ASSERT_TRUE(Lookup(0, 0, 0, 0, ids).ok());
  ASSERT_TRUE(Update(0, 0, 0, 0, ids).ok());
  // Step 1 reaches shard 1, not shard 2; then the leader is gone.
  unreachable_[2] = true;
  ASSERT_TRUE(Lookup(0, 0, 0, 1, ids).ok());
  absl::Status s = Update(0, 0, 0, 1, ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  unreachable_[2] = false;
  Route(1, {0}, {1, 2});
  // The worker's retry finds step 1 applied on the new leader.
  ASSERT_TRUE(Update(1, 0, 0, 1, ids).ok());
  ASSERT_TRUE(Lookup(1, 0, 0, 2, ids).ok());
  ASSERT_TRUE(Update(1, 0, 0, 2, ids).ok());  // its round sends step 1's forward first
  std::vector<float> leader, last_copy;
  ASSERT_TRUE(Lookup(1, 0, 0, 3, ids, &leader, true).ok());
  Route(2, {0, 1}, {2});
  ASSERT_TRUE(Lookup(2, 0, 0, 3, ids, &last_copy, true).ok());
  EXPECT_EQ(last_copy, leader);
}

// A spare in lost shard 1's place: the leaders of the slots it backs up (0
// and 1) copy them to it whole while training goes on; once caught up it
// leads its own slot again, continuing bit for bit, backed up by shard 2.
// A backup further behind than the last forward (which the rounds' order
// should prevent) gets the whole slot from its new leader, as a spare does.
TEST_F(ReplicatedShards, ABackupFurtherBehindGetsTheWholeSlot) {
  CreateJob(SYNC, 1, 2);
  const std::vector<int64_t> ids = IdsOf(0, 6);
  ASSERT_TRUE(Lookup(0, 0, 0, 0, ids).ok());
  ASSERT_TRUE(Update(0, 0, 0, 0, ids).ok());  // forward 1, to shards 1 and 2
  // Forwards 2 and 3 of leader 0 reach shard 1 only.
  ReplicateEmbeddingsRequest r;
  r.set_job("ctr");
  r.set_attempt(1);
  r.set_slot(0);
  r.set_sender(0);
  for (int64_t seq : {2, 3}) {
    EmbeddingForward* f = r.add_forwards();
    f->set_seq(seq);
    f->set_steps(seq);
  }
  ReplicateEmbeddingsResponse response;
  ASSERT_TRUE(shards_[1]->Replicate(r, &response).ok());
  ASSERT_EQ(response.seq(), 3);
  Route(1, {0}, {1, 2});
  ASSERT_TRUE(Lookup(1, 0, 0, 3, ids).ok());
  ASSERT_TRUE(Update(1, 0, 0, 3, ids).ok());  // shard 2 holds forward 1: the whole slot first
  std::vector<float> leader, last_copy;
  ASSERT_TRUE(Lookup(1, 0, 0, 4, ids, &leader, true).ok());
  Route(2, {0, 1}, {2});
  ASSERT_TRUE(Lookup(2, 0, 0, 4, ids, &last_copy, true).ok());
  EXPECT_EQ(last_copy, leader);
}

TEST_F(ReplicatedShards, ASpareGetsAFullCopyAndLeadsItsSlotOnceCaughtUp) {
  EmbeddingStore reference(EmbeddingStoreOptions{});  // slot 1's updates on one unreplicated table
  InitEmbeddingsRequest one = Init(SYNC, 1, 0, 0);
  one.set_num_shards(1);
  one.clear_routing();
  InitEmbeddingsResponse created;
  ASSERT_TRUE(reference.Init(one, &created).ok());
  CreateJob(SYNC, 1, 1);
  const std::vector<int64_t> ids0 = IdsOf(0, 12), ids1 = IdsOf(1, 12);
  auto step = [&](int64_t s, uint32_t leader0, uint32_t leader1) {
    ASSERT_TRUE(Lookup(leader0, 0, 0, s, ids0).ok());
    ASSERT_TRUE(Update(leader0, 0, 0, s, ids0).ok());
    ASSERT_TRUE(Lookup(leader1, 1, 0, s, ids1).ok());
    ASSERT_TRUE(Update(leader1, 1, 0, s, ids1).ok());
    auto l = RequestOf<EmbeddingLookupRequest>(0, 0, s, ids1);
    l.clear_slot();
    EmbeddingLookupResponse ignored;
    ASSERT_TRUE(reference.Lookup(l, absl::Now() + absl::Seconds(5), &ignored).ok());
    auto u = RequestOf<EmbeddingUpdateRequest>(0, 0, s, ids1);
    u.clear_slot();
    std::vector<float> grads;
    for (size_t i = 0; i < ids1.size(); ++i) {
      for (int j = 0; j < kDim; ++j) grads.push_back(0.01f * (s + 1) + 0.001f * i - 0.002f * j);
    }
    u.add_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
    ASSERT_TRUE(reference.Update(u).ok());
  };
  for (int64_t s = 0; s < 3; ++s) ASSERT_NO_FATAL_FAILURE(step(s, 0, 1));
  Route(1, {1}, {0, 2});  // shard 1 lost: slot 1 led by shard 2
  ASSERT_NO_FATAL_FAILURE(step(3, 0, 2));
  Route(2, {}, {0, 2}, {1}, /*spare=*/true);  // the spare in its place, catching up
  EmbeddingStatsRequest sr;
  sr.set_job("ctr");
  EmbeddingStatsResponse stats;
  ASSERT_TRUE(shards_[2]->Stats(sr, &stats).ok());
  EXPECT_EQ(std::vector<uint32_t>(stats.copying_to().begin(), stats.copying_to().end()), std::vector<uint32_t>{1});
  ASSERT_NO_FATAL_FAILURE(step(4, 0, 2));  // each leader's round copies its slot to the spare first
  for (uint32_t leader : {0u, 2u}) {
    stats.Clear();
    ASSERT_TRUE(shards_[leader]->Stats(sr, &stats).ok());
    EXPECT_TRUE(stats.copying_to().empty()) << leader;
    EXPECT_EQ(stats.generation(), 2u);
  }
  std::vector<float> before, after;
  ASSERT_TRUE(Lookup(2, 1, 0, 5, ids1, &before, true).ok());
  Route(3, {}, {0, 2, kShards}, {}, /*spare=*/true);  // caught up: it leads slot 1 again
  absl::Status s = Lookup(2, 1, 0, 5, ids1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_TRUE(Lookup(kShards, 1, 0, 5, ids1, &after, true).ok());
  EXPECT_EQ(after, before);
  ASSERT_NO_FATAL_FAILURE(step(5, 0, kShards));  // forwarded to shard 2, which backs slot 1 up again
  ASSERT_TRUE(Lookup(kShards, 1, 0, 6, ids1, &after, true).ok());
  auto r = RequestOf<EmbeddingLookupRequest>(0, 0, 6, ids1);
  r.clear_slot();
  r.set_read_only(true);
  EmbeddingLookupResponse response;
  ASSERT_TRUE(reference.Lookup(r, absl::Now() + absl::Seconds(5), &response).ok());
  std::vector<float> want(response.values(0).size() / sizeof(float));
  std::memcpy(want.data(), response.values(0).data(), response.values(0).size());
  EXPECT_EQ(after, want);
  // And the spare's copy of slot 0, which it backs up, counts: with shard 0
  // lost, it leads slot 0 from the rows it was copied and sent since.
  std::vector<float> slot0, promoted;
  ASSERT_TRUE(Lookup(0, 0, 0, 6, ids0, &slot0, true).ok());
  Route(4, {0}, {2, kShards}, {}, /*spare=*/true);
  ASSERT_TRUE(Lookup(kShards, 0, 0, 6, ids0, &promoted, true).ok());
  EXPECT_EQ(promoted, slot0);
  ASSERT_NO_FATAL_FAILURE(step(6, kShards, kShards));  // it trains on, slot 0's step 6 included
}

TEST_F(ReplicatedShards, ReplicationIsRefusedWithoutAForwarderAndForBadLayouts) {
  EmbeddingStore alone(EmbeddingStoreOptions{});
  InitEmbeddingsResponse response;
  absl::Status s = alone.Init(Init(SYNC, 1, 1, 0), &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  InitEmbeddingsRequest r = Init(SYNC, 1, 3, 0);  // as many replicas as shards
  EXPECT_EQ(shards_[0]->Init(r, &response).code(), absl::StatusCode::kInvalidArgument);
  r = Init(SYNC, 1, 1, 0);
  r.mutable_routing()->clear_targets();
  EXPECT_EQ(shards_[0]->Init(r, &response).code(), absl::StatusCode::kInvalidArgument);
  r = Init(SYNC, 1, 1, 0);
  r.mutable_routing()->add_lost_shards(9);
  EXPECT_EQ(shards_[0]->Init(r, &response).code(), absl::StatusCode::kInvalidArgument);
}

// SetWorkers' routing is checked as InitEmbeddings' (a hybrid job's comes
// with no dense table to check it first): a 300-byte target changes nothing.
TEST_F(ReplicatedShards, ARoutingWithAnOversizedTargetIsNotApplied) {
  CreateJob(ASYNC, 1, 1);
  SetWorkersRequest r;
  r.set_job("ctr");
  r.set_attempt(1);
  r.mutable_routing()->set_generation(1);
  for (uint32_t i = 0; i < kShards; ++i) r.mutable_routing()->add_targets(i == 2 ? std::string(300, 'h') : "s0");
  auto generation = [&] {
    EXPECT_TRUE(shards_[0]->SetWorkers(r).ok());  // the job is held: its seats are taken
    EmbeddingStatsRequest sr;
    EmbeddingStatsResponse stats;
    sr.set_job("ctr");
    EXPECT_TRUE(shards_[0]->Stats(sr, &stats).ok());
    return stats.generation();
  };
  EXPECT_EQ(generation(), 0u);
  r.mutable_routing()->set_targets(2, "s2");
  EXPECT_EQ(generation(), 1u);
}

TEST_F(ReplicatedShards, MalformedForwardsAreRefusedWholeAndChangeNothing) {
  CreateJob(SYNC, 1, 1);
  ReplicateEmbeddingsRequest r;
  r.set_job("ctr");
  r.set_attempt(1);
  r.set_slot(0);
  r.set_sender(0);
  EmbeddingForward* f = r.add_forwards();
  f->set_seq(1);
  f->set_steps(1);
  EmbeddingRowsProto* rows = f->add_tables();
  rows->set_table("user");
  const int64_t id = IdsOf(0, 1)[0];
  rows->set_ids(Bytes(&id, sizeof(id)));
  rows->set_values(std::string(kDim * sizeof(float), '\0'));  // slots, last steps, counts missing
  ReplicateEmbeddingsResponse response;
  EXPECT_EQ(shards_[1]->Replicate(r, &response).code(), absl::StatusCode::kInvalidArgument);
  // An id of another slot.
  const int64_t other = IdsOf(1, 1)[0];
  rows->set_ids(Bytes(&other, sizeof(other)));
  rows->set_slots(std::string(2 * kDim * sizeof(float), '\0'));
  const int64_t last = 0;
  const uint32_t count = 1;
  rows->set_last_steps(Bytes(&last, sizeof(last)));
  rows->set_counts(Bytes(&count, sizeof(count)));
  EXPECT_EQ(shards_[1]->Replicate(r, &response).code(), absl::StatusCode::kInvalidArgument);
  // A forward from a routing the backup has not seen yet: try again later.
  rows->set_ids(Bytes(&id, sizeof(id)));
  r.set_generation(5);
  EXPECT_EQ(shards_[1]->Replicate(r, &response).code(), absl::StatusCode::kUnavailable);
  r.set_generation(0);
  ASSERT_TRUE(shards_[1]->Replicate(r, &response).ok());
  EXPECT_EQ(response.seq(), 1);
  ASSERT_TRUE(shards_[1]->Replicate(r, &response).ok());  // again: held already
  EXPECT_EQ(response.seq(), 1);
  f->set_seq(3);  // a gap: nothing applied, the answer says what it holds
  ASSERT_TRUE(shards_[1]->Replicate(r, &response).ok());
  EXPECT_EQ(response.seq(), 1);
}

}  // namespace
}  // namespace pstrain
