// A replicated SYNC slot changing hands while a step is under way: a spare
// that caught up takes its slot back from the shard that led it meanwhile
// (ShardCaughtUp), and a round of forwards that failed. Each case ends
// with the slot's rows equal to one unreplicated table's that took the same
// updates once each, and with a slot every copy of which may lead again.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <vector>

#include "embedding/embedding_store_replication_testing.h"

namespace pstrain {
namespace {

constexpr uint32_t kSpare = kShards;

class HandBack : public ReplicatedShards {
 protected:
  void SetUp() override {
    ReplicatedShards::SetUp();
    InitEmbeddingsRequest one = Init(SYNC, 2, 0, 0);
    one.set_num_shards(1);
    one.clear_routing();
    InitEmbeddingsResponse created;
    ASSERT_TRUE(reference_.Init(one, &created).ok());
    CreateJob(SYNC, 2, Replicas());
  }
  virtual uint32_t Replicas() const { return 1; }

  // The gradient ReplicatedShards::Update sends, on the reference table.
  void ReferenceStep(int64_t step) { ReferenceStep(step, ids_); }
  void ReferenceStep(int64_t step, const std::vector<int64_t>& ids) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      auto l = RequestOf<EmbeddingLookupRequest>(0, rank, step, ids);
      l.clear_slot();
      EmbeddingLookupResponse ignored;
      ASSERT_TRUE(reference_.Lookup(l, absl::Now() + absl::Seconds(5), &ignored).ok());
    }
    for (uint32_t rank = 0; rank < 2; ++rank) {
      auto u = RequestOf<EmbeddingUpdateRequest>(0, rank, step, ids);
      u.clear_slot();
      const std::vector<float> grads = GradsOf(rank, step, ids.size());
      u.add_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
      ASSERT_TRUE(reference_.Update(u).ok());
    }
  }

  // One step of slot 1 on `leader`, both ranks, and on the reference.
  void Step(int64_t step, uint32_t leader) { Step(step, leader, ids_); }
  void Step(int64_t step, uint32_t leader, const std::vector<int64_t>& ids) {
    ASSERT_NO_FATAL_FAILURE(StepSlot(step, 1, leader, ids));
    ReferenceStep(step, ids);
  }
  void StepSlot(int64_t step, uint32_t slot, uint32_t leader, const std::vector<int64_t>& ids) {
    for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Lookup(leader, slot, rank, step, ids).ok());
    for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Update(leader, slot, rank, step, ids).ok());
  }
  // A step of every slot: slot 1 on `leader`, slots 0 and 2 on their own
  // shards (never lost here).
  void StepAll(int64_t step, uint32_t leader) {
    ASSERT_NO_FATAL_FAILURE(StepSlot(step, 0, 0, IdsOf(0, 6)));
    ASSERT_NO_FATAL_FAILURE(StepSlot(step, 2, 2, IdsOf(2, 6)));
    ASSERT_NO_FATAL_FAILURE(Step(step, leader));
  }

  std::vector<float> ReferenceRows(int64_t step) {
    auto r = RequestOf<EmbeddingLookupRequest>(0, 0, step, ids_);
    r.clear_slot();
    r.set_read_only(true);
    EmbeddingLookupResponse response;
    EXPECT_TRUE(reference_.Lookup(r, absl::Now() + absl::Seconds(5), &response).ok());
    std::vector<float> want(response.values(0).size() / sizeof(float));
    std::memcpy(want.data(), response.values(0).data(), response.values(0).size());
    return want;
  }

  // Shard 1 lost, slot 1 led by shard 2; then a spare in shard 1's place,
  // copied the slots it holds by their leaders' rounds of step 3. Steps
  // 0..3 trained, every slot.
  void UpToASpareCopied() {
    ASSERT_NO_FATAL_FAILURE(StepAll(0, 1));
    ASSERT_NO_FATAL_FAILURE(StepAll(1, 1));
    Route(1, {1}, {0, 2});
    ASSERT_NO_FATAL_FAILURE(StepAll(2, 2));
    Route(2, {}, {0, 2}, {1}, /*spare=*/true);
    ASSERT_NO_FATAL_FAILURE(StepAll(3, 2));
    for (uint32_t leader : {0u, 2u}) {
      EmbeddingStatsRequest sr;
      sr.set_job("ctr");
      EmbeddingStatsResponse stats;
      ASSERT_TRUE(shards_[leader]->Stats(sr, &stats).ok());
      ASSERT_TRUE(stats.copying_to().empty()) << leader;
    }
  }

  // Up to a spare copied; then step 4 on shard 2 while generation 3 (the
  // spare leads slot 1 again) has reached the spare only: rank 1's update
  // completes the step, whose forward the spare refuses (shard 2 fences
  // itself); then, when `told`, generation 3 reaches shards 0 and 2.
  void FencedByTheSpare(bool told = true) {
    ASSERT_NO_FATAL_FAILURE(UpToASpareCopied());
    for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Lookup(2, 1, rank, 4, ids_).ok());
    ASSERT_TRUE(Update(2, 1, 0, 4, ids_).ok());
    Route(3, {}, {kSpare}, {}, /*spare=*/true);
    absl::Status s = Update(2, 1, 1, 4, ids_);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    if (told) Route(3, {}, {0, 2}, {}, /*spare=*/true);
  }

  // Then the spare lost: shard 2 leads slot 1 again, holding step 4 as it
  // applied it (from both ranks' updates); the ranks' updates sent again
  // are retries, and it trains on.
  void SpareLostAndShard2TrainsOn() {
    Route(4, {1}, {0, 2}, {}, /*spare=*/true);
    for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Update(2, 1, rank, 4, ids_).ok());
    ASSERT_NO_FATAL_FAILURE(ReferenceStep(4));
    ASSERT_NO_FATAL_FAILURE(Step(5, 2));
    std::vector<float> got;
    ASSERT_TRUE(Lookup(2, 1, 0, 6, ids_, &got, true).ok());
    EXPECT_EQ(got, ReferenceRows(6));
  }

  EmbeddingStore reference_{EmbeddingStoreOptions{}};
  const std::vector<int64_t> ids_ = IdsOf(1, 12);
};

// The step's completing update could not be forwarded (an error the round
// does not retry by itself). Its retry must send the round again: answered
// OK at once, it would leave the next step's lookups waiting for a release
// that never comes.
TEST_F(HandBack, ARetriedUpdateSendsTheRoundItsFirstTryCouldNotSend) {
  ASSERT_NO_FATAL_FAILURE(Step(0, 1));
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Lookup(1, 1, rank, 1, ids_).ok());
  ASSERT_TRUE(Update(1, 1, 0, 1, ids_).ok());
  refuse_[2] = 1;
  absl::Status s = Update(1, 1, 1, 1, ids_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_TRUE(Update(1, 1, 1, 1, ids_).ok());  // the retry
  ASSERT_NO_FATAL_FAILURE(ReferenceStep(1));
  const absl::Time start = absl::Now();
  std::vector<float> leader, backup;
  ASSERT_TRUE(Lookup(1, 1, 0, 2, ids_, &leader, /*read_only=*/true).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(leader, ReferenceRows(2));
  Route(1, {1}, {0, 2});  // and the backup holds step 1: promoted, it answers the same
  ASSERT_TRUE(Lookup(2, 1, 0, 2, ids_, &backup, true).ok());
  EXPECT_EQ(backup, leader);
}

// Rank 0's update of step 4 reached shard 2, which then handed slot 1 back
// to the spare: rank 0's lookup of step 5, waiting there, must fail at once
// (FAILED_PRECONDITION, which a worker mends by sending its update again to
// the new leader), not wait out its deadline for a release that moved away.
TEST_F(HandBack, TheOldLeadersWaitingLookupFailsAtOnceAndTheStepEndsOnTheNewLeader) {
  ASSERT_NO_FATAL_FAILURE(UpToASpareCopied());
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Lookup(2, 1, rank, 4, ids_).ok());
  ASSERT_TRUE(Update(2, 1, 0, 4, ids_).ok());
  auto waiting = std::async(std::launch::async, [&] {
    const absl::Time start = absl::Now();
    absl::Status s = Lookup(2, 1, 0, 5, ids_);
    return std::make_pair(s, absl::Now() - start);
  });
  absl::SleepFor(absl::Milliseconds(200));
  Route(3, {}, {kSpare, 0, 2}, {}, /*spare=*/true);  // caught up: the spare leads slot 1
  const auto [s, waited] = waiting.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_LT(waited, absl::Seconds(5));
  // Both ranks send step 4 to the new leader (rank 0 again).
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Update(kSpare, 1, rank, 4, ids_).ok());
  ASSERT_NO_FATAL_FAILURE(ReferenceStep(4));
  ASSERT_NO_FATAL_FAILURE(Step(5, kSpare));
  std::vector<float> got;
  ASSERT_TRUE(Lookup(kSpare, 1, 0, 6, ids_, &got, true).ok());
  EXPECT_EQ(got, ReferenceRows(6));  // step 4 once, from the two updates the spare got
  Route(4, {1}, {0, 2}, {}, /*spare=*/true);  // and its backup, promoted, holds the same
  std::vector<float> promoted;
  ASSERT_TRUE(Lookup(2, 1, 0, 6, ids_, &promoted, true).ok());
  EXPECT_EQ(promoted, got);
}

// The coordinator tells the spare it leads again before it tells shard 2,
// which completes step 4 meanwhile: its forward is refused and it fences
// itself. The routing that reaches it next makes it a backup: it must be
// one again (the spare's forward of step 4, made from the same updates,
// replaces the rows it could not forward), so that a later loss of the
// spare finds a copy that may lead.
TEST_F(HandBack, ALeaderFencedByTheSparesNewerRoutingBacksTheSlotUpAgain) {
  ASSERT_NO_FATAL_FAILURE(FencedByTheSpare());
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Update(kSpare, 1, rank, 4, ids_).ok());
  ASSERT_NO_FATAL_FAILURE(ReferenceStep(4));
  ASSERT_NO_FATAL_FAILURE(Step(5, kSpare));  // its round copies the whole slot to shard 2
  std::vector<float> got, promoted;
  ASSERT_TRUE(Lookup(kSpare, 1, 0, 6, ids_, &got, true).ok());
  EXPECT_EQ(got, ReferenceRows(6));
  Route(4, {1}, {0, 2}, {}, /*spare=*/true);  // the spare lost: shard 2 leads slot 1 again
  ASSERT_TRUE(Lookup(2, 1, 0, 6, ids_, &promoted, true).ok());
  EXPECT_EQ(promoted, got);
  ASSERT_NO_FATAL_FAILURE(Step(6, 2));
  ASSERT_TRUE(Lookup(2, 1, 0, 7, ids_, &promoted, true).ok());
  EXPECT_EQ(promoted, ReferenceRows(7));
}

// Rank 1 is lost mid-step: SetWorkers makes it vacant and so completes
// step 1 on slot 1's leader with rank 0's update alone (a worker covering
// the vacant batch says so with extra_batches). No caller waits for that
// step's forward: rank 0's next lookup sends it, and the backup holds it.
TEST_F(HandBack, AStepSetWorkersCompletesIsForwardedByTheNextLookup) {
  ASSERT_NO_FATAL_FAILURE(Step(0, 1));
  ASSERT_TRUE(Lookup(1, 1, 0, 1, ids_).ok());
  ASSERT_TRUE(Update(1, 1, 0, 1, ids_).ok());
  SetWorkersRequest vacant;
  vacant.set_job("ctr");
  vacant.set_attempt(1);
  vacant.add_seats()->set_active(true);
  vacant.add_seats()->set_active(false);
  const int before = forwards_;
  for (uint32_t s = 0; s < kShards; ++s) shards_[s]->SetWorkers(vacant);
  EXPECT_EQ(forwards_, before) << "SetWorkers sends nothing itself";
  std::vector<float> leader, promoted;
  ASSERT_TRUE(Lookup(1, 1, 0, 2, ids_, &leader).ok());
  EXPECT_GT(forwards_, before);
  // The reference: rank 0's gradient of step 1 alone (a mean over 1 batch).
  auto u = RequestOf<EmbeddingUpdateRequest>(0, 0, 1, ids_);
  u.clear_slot();
  const std::vector<float> grads = GradsOf(0, 1, ids_.size());
  u.add_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
  auto l = RequestOf<EmbeddingLookupRequest>(0, 0, 1, ids_);
  l.clear_slot();
  EmbeddingLookupResponse ignored;
  ASSERT_TRUE(reference_.Lookup(l, absl::Now() + absl::Seconds(5), &ignored).ok());
  ASSERT_TRUE(reference_.SetWorkers(vacant).ok());
  ASSERT_TRUE(reference_.Update(u).ok());
  EXPECT_EQ(leader, ReferenceRows(2));
  Route(1, {1}, {0, 2});
  ASSERT_TRUE(Lookup(2, 1, 0, 2, ids_, &promoted, true).ok());
  EXPECT_EQ(promoted, leader);
}

// As above, but the spare is lost before it trains anything: shard 2, its
// fence lifted, leads slot 1 again.
TEST_F(HandBack, AFenceLiftedLeaderPromotedAtOnceHoldsTheStepItApplied) {
  ASSERT_NO_FATAL_FAILURE(FencedByTheSpare());
  ASSERT_NO_FATAL_FAILURE(SpareLostAndShard2TrainsOn());
}

// The fenced leader is told the spare is lost before it hears that the
// spare leads again (generation 3 never reaches it): the routing makes it
// the leader straight away. Its fence (a refused forward, not a loss) is
// lifted and it leads.
TEST_F(HandBack, ALeaderFencedByARefusalLeadsAgainWhenTheRoutingSaysSo) {
  ASSERT_NO_FATAL_FAILURE(FencedByTheSpare(/*told=*/false));
  ASSERT_NO_FATAL_FAILURE(SpareLostAndShard2TrainsOn());
}

// Three copies of each slot. Shard 2's forward of step 4 is refused by the
// spare (the first backup in copy order), so shard 0, the other backup,
// never gets it either; then the spare is lost and shard 2 leads again,
// holding step 4 as only it applied it. Shard 0 must get the whole slot
// before shard 2's next forward, or a later loss of shard 2 leaves it
// without step 4's rows that step 5 did not touch.
class HandBackThreeCopies : public HandBack {
 protected:
  uint32_t Replicas() const override { return 2; }
};

TEST_F(HandBackThreeCopies, ALeaderThatStoppedWithUnforwardedRowsCopiesEveryBackupWhenItLeadsAgain) {
  ASSERT_NO_FATAL_FAILURE(FencedByTheSpare());
  Route(4, {1}, {0, 2}, {}, /*spare=*/true);  // the spare lost: shard 2 leads slot 1
  for (uint32_t rank = 0; rank < 2; ++rank) ASSERT_TRUE(Update(2, 1, rank, 4, ids_).ok());
  ASSERT_NO_FATAL_FAILURE(ReferenceStep(4));
  const std::vector<int64_t> some(ids_.begin(), ids_.begin() + 4);
  ASSERT_NO_FATAL_FAILURE(Step(5, 2, some));
  Route(5, {1, 2}, {0}, {}, /*spare=*/true);  // shard 2 lost too: shard 0 leads
  std::vector<float> got;
  ASSERT_TRUE(Lookup(0, 1, 0, 6, ids_, &got, true).ok());
  EXPECT_EQ(got, ReferenceRows(6));
}

// A copy's first request that arrives late (its sender gave up on it and
// copied the slot again) must not remake the slot over the later copy.
TEST_F(HandBack, ALateRequestOfAnEarlierCopyIsRefused) {
  ASSERT_NO_FATAL_FAILURE(UpToASpareCopied());
  ReplicateEmbeddingsRequest late;
  {
    absl::MutexLock lock(&copies_mu_);
    for (const auto& r : copy_inits_) {
      if (r.slot() == 1) late = r;
    }
  }
  ASSERT_EQ(late.copy_state().copy(), 1u);
  // Under the same routing and from the same leader: only its number says
  // it is not the copy the slot was made from last.
  late.mutable_copy_state()->set_copy(0);
  late.set_copy(0);
  ReplicateEmbeddingsResponse response;
  absl::Status s = shards_[kSpare]->Replicate(late, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  late.clear_copy_init();
  late.clear_copy_state();
  late.add_copy_rows()->set_table("user");
  s = shards_[kSpare]->Replicate(late, &response);  // rows of that copy
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  Route(3, {}, {kSpare, 0, 2}, {}, /*spare=*/true);
  ASSERT_NO_FATAL_FAILURE(Step(4, kSpare));
  std::vector<float> got;
  ASSERT_TRUE(Lookup(kSpare, 1, 0, 5, ids_, &got, true).ok());
  EXPECT_EQ(got, ReferenceRows(5));  // the slot as copied and forwarded since
}

}  // namespace
}  // namespace pstrain
