// Ranks that come and go (SetWorkers): a SYNC step completes with the ranks
// present, SSP and the final wait count active ranks only, and a replaced
// or removed worker's pushes are refused.
#include <gtest/gtest.h>

#include <future>

#include "table/shard_store.h"
#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

absl::Status PushAs(ShardStore& store, uint32_t worker, uint32_t generation, int64_t step, float g) {
  PushRequest req;
  req.set_job("job");
  req.set_worker(worker);
  req.set_generation(generation);
  req.set_step(step);
  req.add_keys("a");
  PushResponse resp;
  return WaitFor([&](StatusCallback done) { store.Push(req, {Floats({g, g, g})}, &resp, {}, done); });
}

// Seats: {active, generation} per rank.
absl::StatusOr<SetWorkersResponse> Seat(ShardStore& store, std::vector<std::pair<bool, uint32_t>> seats) {
  SetWorkersRequest req;
  req.set_job("job");
  for (auto [active, generation] : seats) {
    WorkerSeat* s = req.add_seats();
    s->set_active(active);
    s->set_generation(generation);
  }
  SetWorkersResponse resp;
  absl::Status s = WaitFor([&](StatusCallback done) { store.SetWorkers(req, &resp, {}, done); });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<float>> PullWorkerSteps(ShardStore& store, int64_t steps, absl::Duration timeout) {
  return Pull(store, 0, 0, timeout, steps);
}

TEST(ShardSeatsTest, SyncStepCompletesWithTheRanksPresentAndAveragesOverThem) {
  ShardStore store(Options());
  ASSERT_TRUE(Init(store, Config(SYNC, 3, /*lr=*/1.0), 0, {0, 0, 0}).ok());
  ASSERT_TRUE(PushAs(store, 0, 0, 0, 1.0f).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 0, 3.0f).ok());
  // Rank 2 is lost before it pushed step 0: a pull of step 1 waits ...
  auto waiting = std::async(std::launch::async, [&] { return Pull(store, 0, /*min_version=*/1); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // ... until the coordinator removes the rank: the step completes with
  // ranks 0 and 1, the mean over the two (2), not the three.
  auto set = Seat(store, {{true, 0}, {true, 0}, {false, 0}});
  ASSERT_TRUE(set.ok()) << set.status();
  auto values = waiting.get();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<float>{-2, -2, -2}));
  EXPECT_EQ(set->last_steps_size(), 3);
  EXPECT_EQ(set->last_steps(2), -1);
  EXPECT_EQ(set->min_version(), 1);
  // The removed rank is refused; the next step needs ranks 0 and 1 only.
  EXPECT_EQ(PushAs(store, 2, 0, 1, 5.0f).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(PushAs(store, 0, 0, 1, 1.0f).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 1, 1.0f).ok());
  values = Pull(store, 0, 2);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<float>{-3, -3, -3}));
}

TEST(ShardSeatsTest, AReplacementTakesTheRankAndItsPredecessorIsRefused) {
  ShardStore store(Options());
  ASSERT_TRUE(Init(store, Config(ASYNC, 2, 0.5)).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 0, 1.0f).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 1, 1.0f).ok());
  // Rank 1 goes to a new worker (generation 1): it learns where the rank
  // stopped.
  auto set = Seat(store, {{true, 0}, {true, 1}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->last_steps(0), -1);
  EXPECT_EQ(set->last_steps(1), 1);
  // The old holder, back from a partition, cannot push; a holder the shard
  // has not heard of yet is told to retry; the new one pushes step 2.
  EXPECT_EQ(PushAs(store, 1, 0, 2, 1.0f).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(PushAs(store, 1, 2, 2, 1.0f).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(PushAs(store, 1, 1, 2, 1.0f).ok());
  // A late, older view of the ranks (generation 0) does not take it back.
  ASSERT_TRUE(Seat(store, {{true, 0}, {false, 0}}).ok());
  EXPECT_TRUE(PushAs(store, 1, 1, 3, 1.0f).ok());
  // Malformed: the wrong number of seats.
  EXPECT_EQ(Seat(store, {{true, 0}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardSeatsTest, SspAndTheFinalWaitCountActiveRanksOnly) {
  ShardStore store(Options());
  TableConfig config = Config(SSP, 2, 0.1);
  config.set_staleness(1);
  ASSERT_TRUE(Init(store, config).ok());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(PushAs(store, 0, 0, step, 1.0f).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 0, 1.0f).ok());
  // Every active rank through step 2: rank 1 is at step 0.
  EXPECT_EQ(PullWorkerSteps(store, 3, absl::Milliseconds(50)).status().code(), absl::StatusCode::kDeadlineExceeded);
  auto waiting = std::async(std::launch::async, [&] { return PullWorkerSteps(store, 3, absl::Seconds(10)); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // Rank 1 is lost and not replaced: nobody waits for it any more.
  ASSERT_TRUE(Seat(store, {{true, 0}, {false, 0}}).ok());
  EXPECT_TRUE(waiting.get().ok());
  // Under SYNC the final wait is by version, not worker steps.
  ShardStore sync(Options());
  ASSERT_TRUE(Init(sync, Config(SYNC, 2)).ok());
  EXPECT_EQ(PullWorkerSteps(sync, 1, absl::Milliseconds(10)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
