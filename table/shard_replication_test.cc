// Replicated tables (shard_store_replication.cc): forwarding, failover and
// catch-up, on shards in one process (table/shard_replication_ring.h).
#include <thread>
#include <vector>

#include "table/shard_replication_ring.h"

namespace pstrain {
namespace replication_testing {
namespace {

TEST(ShardReplication, SyncBackupsHoldEveryStepBeforeWorkersSeeIt) {
  Ring ring(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(ring.InitAll().ok());
  for (int64_t step = 0; step < 4; ++step) {
    SyncSteps(ring, step, step + 1);
    // The workers got step's result: each backup already holds it, momentum included.
    EXPECT_EQ(ring.View(1, "a"), ring.View(0, "a")) << "step " << step;
    EXPECT_EQ(ring.View(2, "b"), ring.View(1, "b"));
    EXPECT_EQ(ring.View(0, "c"), ring.View(2, "c"));
    EXPECT_EQ(ring.View(0, "a").optimizer_step, step + 1);
  }
  const TableStats stats = testing_util::Stats(ring.store(0));
  EXPECT_EQ(stats.replication().chunks_led(), 1u);
  EXPECT_EQ(stats.replication().unacked_seqs(), 0u);
  EXPECT_GE(stats.replication().forwards(), 4u);
  EXPECT_EQ(stats.replication().chunks_applied(), 4u);  // c's four steps, from shard 2
}

TEST(ShardReplication, PushesAndPullsGoToThePrimaryOnly) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  absl::StatusOr<std::vector<float>> wrong = ring.PushPull("a", 0, 0, 1.0f, /*shard=*/1);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_NE(wrong.status().message().find("led by shard 0"), std::string::npos) << wrong.status();
  EXPECT_EQ(ring.View(1, "a").optimizer_step, 0);
}

// The same SYNC job, with shard 0 killed between steps 2 and 3 (one of the
// workers' step-3 pushes already arrived there), ends with exactly the
// numbers of an uninterrupted run: no update lost, none applied twice.
TEST(ShardReplication, KilledPrimaryIsReplacedWithNoUpdateLost) {
  Ring whole(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(whole.InitAll().ok());
  SyncSteps(whole, 0, 6);

  Ring ring(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(ring.InitAll().ok());
  SyncSteps(ring, 0, 3);
  // Worker 0's step-3 push of "a" arrives at shard 0, then shard 0 dies.
  absl::StatusOr<std::vector<float>> lost;
  std::thread pusher([&] { lost = ring.PushPull("a", 0, 3, 1.0f / 4); });
  absl::SleepFor(absl::Milliseconds(100));
  ring.Kill(0);
  pusher.join();
  EXPECT_FALSE(lost.ok());
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  EXPECT_EQ(ring.Leader("a"), 1);
  EXPECT_EQ(ring.Leader("c"), 2);  // c had no backup left: shard 0 was it
  SyncSteps(ring, 3, 6);
  EXPECT_EQ(ring.View(1, "a"), whole.View(0, "a"));
  EXPECT_EQ(ring.View(1, "b"), whole.View(1, "b"));
  EXPECT_EQ(ring.View(2, "c"), whole.View(2, "c"));
}

// A shard that comes back empty (a spare in the lost one's place) is
// brought up to date by full copies while training goes on, takes its
// chunks back once the coordinator sees it caught up, and the next loss
// (of the shard that led them meanwhile) is survived too: the numbers
// are those of an uninterrupted run.
TEST(ShardReplication, RejoinedShardCatchesUpAndSurvivesTheNextLoss) {
  Ring whole(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(whole.InitAll().ok());
  SyncSteps(whole, 0, 8);

  Ring ring(3, kRing, MomentumConfig(SYNC, 2));
  ASSERT_TRUE(ring.InitAll().ok());
  SyncSteps(ring, 0, 2);
  ring.Kill(0);
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  SyncSteps(ring, 2, 4);
  // The spare: a fresh table from the initial values, 4 steps behind.
  ring.Revive(0);
  ring.Rejoin(0);
  ASSERT_TRUE(ring.Init(0).ok());
  ASSERT_TRUE(ring.Announce({0, 1, 2}).ok());
  EXPECT_EQ(ring.Leader("a"), 1);  // not while it catches up
  SyncSteps(ring, 4, 5);
  EXPECT_EQ(ring.View(0, "a"), ring.View(1, "a"));
  EXPECT_EQ(ring.View(0, "c"), ring.View(2, "c"));
  for (int s : {1, 2}) {
    EXPECT_EQ(testing_util::Stats(ring.store(s)).replication().copying_to_size(), 0) << "shard " << s;
  }
  ring.CaughtUp(0);
  ASSERT_TRUE(ring.Announce({0, 1, 2}).ok());
  EXPECT_EQ(ring.Leader("a"), 0);  // its first copy again
  SyncSteps(ring, 5, 6);
  // Now shard 1 dies.
  ring.Kill(1);
  ring.Lose(1);
  ASSERT_TRUE(ring.Announce({0, 2}).ok());
  EXPECT_EQ(ring.Leader("b"), 2);
  SyncSteps(ring, 6, 8);
  EXPECT_EQ(ring.View(0, "a"), whole.View(0, "a"));
  EXPECT_EQ(ring.View(2, "b"), whole.View(1, "b"));
  EXPECT_EQ(ring.View(2, "c"), whole.View(2, "c"));
  EXPECT_EQ(ring.View(0, "c"), whole.View(2, "c"));
}

TEST(ShardReplication, PromotedBackupCopiesToTheRemainingBackup) {
  Ring whole(3, {{"a", {0, 1, 2}}}, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(whole.InitAll().ok());
  Ring ring(3, {{"a", {0, 1, 2}}}, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(whole.PushPull("a", 0, step, 0.5f + step).ok());
    if (step == 3) {
      ring.Kill(0);
      ring.Lose(0);
      ASSERT_TRUE(ring.Announce({1, 2}).ok());
    }
    ASSERT_TRUE(ring.PushPull("a", 0, step, 0.5f + step).ok());
  }
  EXPECT_EQ(ring.View(1, "a"), whole.View(0, "a"));
  EXPECT_EQ(ring.View(2, "a"), whole.View(0, "a"));
  EXPECT_EQ(testing_util::Stats(ring.store(1)).replication().generation(), 1u);
}

// A retried push of a step the old primary applied and forwarded is
// recognised by the new one (the rank's last step came with the forward).
TEST(ShardReplication, RetryAfterFailoverIsAppliedOnce) {
  Ring ring(3, kRing, MomentumConfig(ASYNC, 1));
  ASSERT_TRUE(ring.InitAll().ok());
  ASSERT_TRUE(ring.PushPull("a", 0, 0, 1.0f).ok());
  const ChunkView before = ring.View(1, "a");
  ring.Kill(0);
  ring.Lose(0);
  ASSERT_TRUE(ring.Announce({1, 2}).ok());
  absl::StatusOr<std::vector<float>> again = ring.PushPull("a", 0, 0, 1.0f);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ring.View(1, "a"), before);
  EXPECT_EQ(*again, before.value);
}

// An old primary that was only cut off (not dead) and still takes a stale
// worker's push: its forward is refused, the push fails, and the shard
// serves nothing more; the new primary's chunk is untouched.

}  // namespace
}  // namespace replication_testing
}  // namespace pstrain
