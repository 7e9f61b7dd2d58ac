// Ranks that come and go (SetWorkers): a SYNC step completes with the ranks
// present, SSP and the final wait count active ranks only, and a replaced
// or removed worker's pushes are refused.
#include <gtest/gtest.h>

#include <future>
#include <limits>

#include "table/shard_store.h"
#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

// A push carrying `extra` covered batches (their gradients summed into g)
// or none (`empty`).
absl::Status PushCovering(ShardStore& store, uint32_t worker, uint32_t generation, int64_t step, float g,
                          uint32_t extra, bool empty = false) {
  PushRequest req;
  req.set_job("job");
  req.set_worker(worker);
  req.set_generation(generation);
  req.set_step(step);
  req.add_keys("a");
  req.set_extra_batches(extra);
  req.set_empty(empty);
  PushResponse resp;
  return WaitFor([&](StatusCallback done) { store.PushAsync(req, {Floats({g, g, g})}, &resp, {}, done); });
}

absl::Status PushAs(ShardStore& store, uint32_t worker, uint32_t generation, int64_t step, float g) {
  return PushCovering(store, worker, generation, step, g, /*extra=*/0);
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
  absl::Status s = WaitFor([&](StatusCallback done) { store.SetWorkersAsync(req, &resp, {}, done); });
  if (!s.ok()) return s;
  return resp;
}

// The vacant ranks a pull at `min_version` reports.
std::vector<uint32_t> VacantView(ShardStore& store, int64_t min_version) {
  PullRequest req;
  req.set_job("job");
  req.add_keys("a");
  req.set_min_version(min_version);
  PullResponse resp;
  std::vector<TensorBuffer> values;
  absl::Status s =
      WaitFor([&](StatusCallback done) { store.PullAsync(req, &resp, &values, Within(absl::Seconds(5)), done); });
  EXPECT_TRUE(s.ok()) << s;
  return {resp.vacant_ranks().begin(), resp.vacant_ranks().end()};
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

// The coordinator replaces rank 1's holder after the old holder's push
// passed its first seat check but before it locked its chunks: the push is
// refused as the replaced holder's, and changes nothing.
TEST(ShardSeatsTest, AHolderReplacedBeforeItsPushLocksTheChunksIsRefused) {
  ShardStoreOptions options = Options();
  ShardStore* target = nullptr;
  bool replaced = false;
  options.before_push_locks = [&](const std::string&, uint32_t worker, uint32_t generation) {
    if (replaced || worker != 1 || generation != 0) return;
    replaced = true;
    auto set = Seat(*target, {{true, 0}, {true, 1}});
    EXPECT_TRUE(set.ok()) << set.status();
  };
  ShardStore store(options);
  target = &store;
  ASSERT_TRUE(Init(store, Config(ASYNC, 2, 0.5)).ok());
  const absl::StatusOr<std::vector<float>> before = Pull(store, 0);
  ASSERT_TRUE(before.ok()) << before.status();

  absl::Status s = PushAs(store, 1, 0, 0, 1.0f);
  ASSERT_TRUE(replaced);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  const absl::StatusOr<std::vector<float>> after = Pull(store, 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
  // The rank did not advance: the new holder starts where the rank stood.
  auto set = Seat(store, {{true, 0}, {true, 1}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->last_steps(1), -1);
  EXPECT_TRUE(PushAs(store, 1, 1, 0, 1.0f).ok());
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

// A vacant rank's batch covered by a survivor: the survivor pushes the sum
// of its gradient and the covered one with extra_batches 1, and the step's
// update is the mean over the three batches -- the same as with all three
// ranks present. The view of vacant ranks comes back with the values.
TEST(ShardSeatsTest, CoveredBatchesMakeTheSameStepAsAFullOne) {
  ShardStore full(Options());
  ASSERT_TRUE(Init(full, Config(SYNC, 3, /*lr=*/1.0), 0, {0, 0, 0}).ok());
  ASSERT_TRUE(PushAs(full, 0, 0, 0, 1.0f).ok());
  ASSERT_TRUE(PushAs(full, 1, 0, 0, 3.0f).ok());
  ASSERT_TRUE(PushAs(full, 2, 0, 0, 8.0f).ok());
  auto expected = Pull(full, 0, 1);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(*expected, (std::vector<float>{-4, -4, -4}));
  EXPECT_TRUE(VacantView(full, 1).empty());

  ShardStore store(Options());
  ASSERT_TRUE(Init(store, Config(SYNC, 3, 1.0), 0, {0, 0, 0}).ok());
  ASSERT_TRUE(Seat(store, {{true, 0}, {true, 0}, {false, 0}}).ok());
  ASSERT_TRUE(PushCovering(store, 0, 0, 0, 1.0f + 8.0f, /*extra=*/1).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 0, 3.0f).ok());
  auto covered = Pull(store, 0, 1);
  ASSERT_TRUE(covered.ok()) << covered.status();
  EXPECT_EQ(*covered, *expected);
  EXPECT_EQ(VacantView(store, 1), (std::vector<uint32_t>{2}));

  // A replacement takes rank 2 while step 1 is in flight: the survivors
  // covered its batch (the view said vacant), so it arrives empty; the
  // mean is over the three batches the others carried.
  ASSERT_TRUE(Seat(store, {{true, 0}, {true, 0}, {true, 1}}).ok());
  ASSERT_TRUE(PushCovering(store, 0, 0, 1, 2.0f + 4.0f, 1).ok());
  ASSERT_TRUE(PushAs(store, 1, 0, 1, 6.0f).ok());
  ASSERT_TRUE(PushCovering(store, 2, 1, 1, 100.0f, 0, /*empty=*/true).ok());
  auto next = Pull(store, 0, 2);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, (std::vector<float>{-8, -8, -8}));  // -4 - (2 + 4 + 6) / 3
  EXPECT_TRUE(VacantView(store, 2).empty());
}

TEST(ShardSeatsTest, CoveringIsBoundedAndForSyncOnly) {
  ShardStore store(Options());
  ASSERT_TRUE(Init(store, Config(SYNC, 3, 1.0), 0, {0, 0, 0}).ok());
  EXPECT_EQ(PushCovering(store, 0, 0, 0, 1.0f, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PushCovering(store, 0, 0, 0, 1.0f, 1u << 31).code(), absl::StatusCode::kInvalidArgument);
  ShardStore async(Options());
  ASSERT_TRUE(Init(async, Config(ASYNC, 3, 1.0), 0, {0, 0, 0}).ok());
  EXPECT_EQ(PushCovering(async, 0, 0, 0, 1.0f, 1).code(), absl::StatusCode::kInvalidArgument);
}

// An empty push under ASYNC and SSP (a worker's fp16 step skipped for an
// overflow): the worker's step counts -- the final wait and SSP's clock move
// on -- while values and optimizer state do not change, and its gradients
// (NaN here) are not looked at, even under REJECT. Under SYNC it is an
// arrival that adds nothing.
TEST(ShardSeatsTest, AnEmptyPushCountsTheStepAndChangesNothing) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Consistency c : {ASYNC, SSP}) {
    SCOPED_TRACE(c == ASYNC ? "async" : "ssp");
    ShardStore store(Options());
    TableConfig config = Config(c, 2, 0.5);
    config.set_staleness(0);
    config.set_nonfinite(NONFINITE_REJECT);
    config.mutable_optimizer()->set_momentum(0.9);
    ASSERT_TRUE(Init(store, config).ok());
    ASSERT_TRUE(PushAs(store, 1, 0, 0, 2.0f).ok());
    auto before = Pull(store, 0);
    ASSERT_TRUE(before.ok());
    // Rank 0 has pushed nothing: a wait for every rank's first step waits.
    EXPECT_EQ(PullWorkerSteps(store, 1, absl::Milliseconds(50)).status().code(),
              absl::StatusCode::kDeadlineExceeded);
    ASSERT_TRUE(PushCovering(store, 0, 0, 0, nan, 0, /*empty=*/true).ok());
    auto after = PullWorkerSteps(store, 1, absl::Seconds(5));
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, *before);
    // Sent again: a duplicate; a real push of the same step too.
    ASSERT_TRUE(PushCovering(store, 0, 0, 0, nan, 0, /*empty=*/true).ok());
    ASSERT_TRUE(PushAs(store, 0, 0, 0, 4.0f).ok());
    EXPECT_EQ(*Pull(store, 0), *before);
    // Rank 0's momentum did not start from the skipped step: its first real
    // push moves the value exactly as a first push does (lr 0.5 / 2 workers).
    ASSERT_TRUE(PushAs(store, 0, 0, 1, 4.0f).ok());
    auto moved = Pull(store, 0);
    ASSERT_TRUE(moved.ok());
    for (size_t i = 0; i < moved->size(); ++i) EXPECT_FLOAT_EQ((*moved)[i], (*before)[i] - 0.25f * 4.0f) << i;
    // The same NaN in a real push is refused under REJECT.
    EXPECT_EQ(PushAs(store, 0, 0, 2, nan).code(), absl::StatusCode::kInvalidArgument);
  }
  ShardStore sync(Options());
  TableConfig config = Config(SYNC, 2, 1.0);
  config.set_nonfinite(NONFINITE_REJECT);
  ASSERT_TRUE(Init(sync, config, 0, {0, 0, 0}).ok());
  ASSERT_TRUE(PushCovering(sync, 0, 0, 0, nan, 0, /*empty=*/true).ok());
  ASSERT_TRUE(PushAs(sync, 1, 0, 0, 3.0f).ok());
  auto values = Pull(sync, 0, 1);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<float>{-3, -3, -3})) << "the mean over the one batch carried";
}

}  // namespace
}  // namespace pstrain
