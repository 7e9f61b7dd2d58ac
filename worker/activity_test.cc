#include "worker/activity.h"

#include <gtest/gtest.h>

namespace pstrain {
namespace {

TEST(ActivityTest, SaysThePhaseAndForHowLong) {
  Activity a;
  EXPECT_EQ(a.Snapshot().phase(), WorkerActivity::STARTING);
  a.Enter(WorkerActivity::COMPUTE, 7);
  absl::SleepFor(absl::Milliseconds(30));
  a.Enter(WorkerActivity::COMPUTE, 8);  // the same phase: the clock runs on
  WorkerActivity s = a.Snapshot();
  EXPECT_EQ(s.phase(), WorkerActivity::COMPUTE);
  EXPECT_EQ(s.step(), 8);
  EXPECT_GE(s.for_s(), 0.03);
  EXPECT_EQ(s.shard(), -1);
  a.Enter(WorkerActivity::DATA, 8);
  EXPECT_LT(a.Snapshot().for_s(), 0.03);
}

TEST(ActivityTest, NamesTheShardWaitedOnLongest) {
  Activity a;
  a.Enter(WorkerActivity::SHARDS, 3);
  a.ShardCallStarted(1);
  absl::SleepFor(absl::Milliseconds(5));
  a.ShardCallStarted(0);
  EXPECT_EQ(a.Snapshot().shard(), 1);
  a.ShardCallEnded(1, absl::Milliseconds(6), 100);
  EXPECT_EQ(a.Snapshot().shard(), 0);
  a.ShardCallEnded(0, absl::Milliseconds(1), 50);
  EXPECT_EQ(a.Snapshot().shard(), -1);
  // Not in the shard phase: no shard named, even with calls out.
  a.ShardCallStarted(2);
  a.Enter(WorkerActivity::COMPUTE, 4);
  EXPECT_EQ(a.Snapshot().shard(), -1);
}

TEST(ActivityTest, TheShardWindowCountsAndResets) {
  Activity a;
  a.ShardCallStarted(0);
  a.ShardCallEnded(0, absl::Milliseconds(4), 1000);
  a.ShardCallStarted(0);
  a.ShardCallEnded(0, absl::Milliseconds(2), 1000);
  a.ShardCallStarted(2);
  a.ShardCallEnded(2, absl::Milliseconds(8), 10);
  std::vector<ShardCalls> w = a.TakeShardWindow();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].shard(), 0);
  EXPECT_EQ(w[0].calls(), 2);
  EXPECT_DOUBLE_EQ(w[0].mean_ms(), 3.0);
  EXPECT_GT(w[0].bytes_per_s(), 0);
  EXPECT_EQ(w[1].shard(), 2);
  EXPECT_TRUE(a.TakeShardWindow().empty());
  // A hostile index is clamped, not grown without bound.
  a.ShardCallStarted(1 << 30);
  a.ShardCallEnded(1 << 30, absl::Milliseconds(1), 1);
  EXPECT_EQ(a.TakeShardWindow().back().shard(), 4095);
}

}  // namespace
}  // namespace pstrain
