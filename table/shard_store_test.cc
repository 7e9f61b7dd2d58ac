// ShardStore's calls under the three consistency models (ASYNC, SYNC, SSP):
// tables made and pulled, pushes applied once, waits and deadlines, bad
// input refused, and the chunk export and import of an in-process owner.
// Gradients in narrow dtypes or in pieces: shard_store_wire_test.cc.
#include "table/shard_store.h"
#include "table/shard_store_testing.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

class ShardStoreTest : public ::testing::Test {
 protected:
  absl::Status Init(const TableConfig& config, const std::string& job = "job") {
    InitTableRequest req;
    req.set_job(job);
    *req.mutable_config() = config;
    req.add_keys("a");
    req.add_keys("b");
    InitTableResponse resp;
    return WaitFor([&](StatusCallback done) {
      store_.InitTableAsync(req, {Floats({1, 2, 3}), Floats({10, 20})}, &resp, {}, done);
    });
  }

  absl::Status Push(uint32_t worker, int64_t step, std::vector<std::string> keys,
                    std::vector<TensorBuffer> grads, PushResponse* resp = nullptr,
                    const std::string& job = "job") {
    PushRequest req;
    req.set_job(job);
    req.set_worker(worker);
    req.set_step(step);
    for (auto& k : keys) req.add_keys(k);
    PushResponse local;
    return WaitFor([&](StatusCallback done) {
      store_.PushAsync(req, std::move(grads), resp ? resp : &local, {}, done);
    });
  }

  absl::StatusOr<std::vector<std::vector<float>>> Pull(std::vector<std::string> keys,
                                                       int64_t min_version = 0,
                                                       absl::Duration timeout = absl::Seconds(10)) {
    PullRequest req;
    req.set_job("job");
    req.set_min_version(min_version);
    for (auto& k : keys) req.add_keys(k);
    PullResponse resp;
    std::vector<TensorBuffer> values;
    absl::Status s = WaitFor([&](StatusCallback done) {
      store_.PullAsync(req, &resp, &values, Within(timeout), done);
    });
    if (!s.ok()) return s;
    std::vector<std::vector<float>> out;
    for (auto& v : values) out.push_back(ToFloats(v));
    return out;
  }

  ShardStore store_{ShardStoreOptions{}};
};

TEST_F(ShardStoreTest, InitTableThenPullReturnsInitialValues) {
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 1)).ok());
  auto v = Pull({"b", "a"});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0], (std::vector<float>{10, 20}));
  EXPECT_EQ((*v)[1], (std::vector<float>{1, 2, 3}));
}

TEST_F(ShardStoreTest, InitTableIsIdempotentForTheSameLayoutOnly) {
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 2)).ok());
  ASSERT_TRUE(Push(0, 0, {"a"}, {Floats({1, 1, 1})}).ok());
  // Same layout and config: kept as is, progress included.
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 2)).ok());
  EXPECT_EQ((*Pull({"a"}))[0], (std::vector<float>{0.5, 1.5, 2.5}));
  // Different config: refused, nothing changed.
  absl::Status s = Init(SharedConfig(SYNC, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ((*Pull({"a"}))[0], (std::vector<float>{0.5, 1.5, 2.5}));
}

TEST_F(ShardStoreTest, AsyncAppliesOnArrivalAndARetriedPushOnlyOnce) {
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 2)).ok());
  PushResponse r;
  ASSERT_TRUE(Push(0, 0, {"a", "b"}, {Floats({2, 2, 2}), Floats({4, 4})}, &r).ok());
  EXPECT_EQ(r.applied(), 2u);
  EXPECT_EQ(r.versions(0), 1);
  // The same (worker, step) again, as a retry after a lost response would be.
  ASSERT_TRUE(Push(0, 0, {"a", "b"}, {Floats({2, 2, 2}), Floats({4, 4})}, &r).ok());
  EXPECT_EQ(r.applied(), 0u);
  EXPECT_EQ(r.duplicates(), 2u);
  EXPECT_EQ(r.versions(0), 1);
  // Another worker's step 0 is a different push.
  ASSERT_TRUE(Push(1, 0, {"a"}, {Floats({2, 2, 2})}, &r).ok());
  EXPECT_EQ(r.applied(), 1u);
  auto v = Pull({"a", "b"});
  EXPECT_EQ((*v)[0], (std::vector<float>{-1, 0, 1}));
  EXPECT_EQ((*v)[1], (std::vector<float>{8, 18}));
}

TEST_F(ShardStoreTest, AsyncKeepsMomentumPerWorkerAndScalesLrByWorkers) {
  TableConfig c = SharedConfig(ASYNC, 2, 1.0);
  c.set_shared_async_state(false);
  c.mutable_optimizer()->set_momentum(0.5);
  ASSERT_TRUE(Init(c).ok());
  ASSERT_TRUE(Push(0, 0, {"b"}, {Floats({2, 2})}).ok());  // buf0 = 2: 10 - 0.5 * 2
  EXPECT_EQ((*Pull({"b"}))[0], (std::vector<float>{9, 19}));
  ASSERT_TRUE(Push(1, 0, {"b"}, {Floats({4, 4})}).ok());  // buf1 = 4: 9 - 0.5 * 4
  EXPECT_EQ((*Pull({"b"}))[0], (std::vector<float>{7, 17}));
  ASSERT_TRUE(Push(0, 1, {"b"}, {Floats({2, 2})}).ok());  // buf0 = 0.5 * 2 + 2 = 3
  EXPECT_EQ((*Pull({"b"}))[0], (std::vector<float>{5.5, 15.5}));
}

TEST_F(ShardStoreTest, SyncAveragesAllWorkersAndPushPullWaitsForTheStep) {
  ASSERT_TRUE(Init(SharedConfig(SYNC, 2, 1.0)).ok());
  PushPullRequest req;
  req.set_job("job");
  req.set_worker(0);
  req.set_step(0);
  req.add_keys("a");
  PushPullResponse resp0;
  std::vector<TensorBuffer> values0;
  std::atomic<bool> finished{false};
  absl::Status status0;
  store_.PushPullAsync(req, {Floats({2, 4, 6})}, &resp0, &values0, {}, [&](absl::Status s) {
    status0 = s;
    finished = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(finished) << "SYNC PushPull returned before the other worker pushed";
  // Until the step completes, the value is unchanged.
  EXPECT_EQ((*Pull({"a"}))[0], (std::vector<float>{1, 2, 3}));
  // A retry of worker 0's push is not counted twice.
  PushResponse r;
  ASSERT_TRUE(Push(0, 0, {"a"}, {Floats({2, 4, 6})}, &r).ok());
  EXPECT_EQ(r.duplicates(), 1u);
  // A push for a step ahead is refused.
  EXPECT_EQ(Push(1, 1, {"a"}, {Floats({0, 0, 0})}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Push(1, 0, {"a"}, {Floats({0, 0, 0})}, &r).ok());
  EXPECT_EQ(r.versions(0), 1);
  for (int i = 0; i < 100 && !finished; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(finished);
  ASSERT_TRUE(status0.ok()) << status0;
  // mean gradient {1, 2, 3}, lr 1
  EXPECT_EQ(ToFloats(values0[0]), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(resp0.versions(0), 1);
}

TEST_F(ShardStoreTest, PulledValuesAreSnapshotsThatLaterPushesDoNotTouch) {
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 1, 1.0)).ok());
  PullRequest req;
  req.set_job("job");
  req.add_keys("a");
  PullResponse resp;
  std::vector<TensorBuffer> held;  // as a response still being sent would
  ASSERT_TRUE(WaitFor([&](StatusCallback done) { store_.PullAsync(req, &resp, &held, {}, done); }).ok());
  ASSERT_TRUE(Push(0, 0, {"a"}, {Floats({1, 1, 1})}).ok());
  ASSERT_TRUE(Push(0, 1, {"a"}, {Floats({1, 1, 1})}).ok());
  EXPECT_EQ(ToFloats(held[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ((*Pull({"a"}))[0], (std::vector<float>{-1, 0, 1}));
  // Caller-provided destinations receive the values in place.
  std::vector<float> dest(3, 0.f);
  std::vector<TensorBuffer> into = {
      TensorBuffer{DT_FLOAT32, {3}, reinterpret_cast<const uint8_t*>(dest.data()), 12, nullptr}};
  PullResponse resp2;
  ASSERT_TRUE(WaitFor([&](StatusCallback done) { store_.PullAsync(req, &resp2, &into, {}, done); }).ok());
  EXPECT_EQ(dest, (std::vector<float>{-1, 0, 1}));
}

TEST_F(ShardStoreTest, PullWithMinVersionWaitsThenFailsAtTheDeadline) {
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 1)).ok());
  auto v = Pull({"a"}, /*min_version=*/1, absl::Milliseconds(200));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("key a is at version 0"), absl::string_view::npos)
      << v.status();
  std::thread pusher([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(Push(0, 0, {"a"}, {Floats({0, 0, 2})}).ok());
  });
  v = Pull({"a"}, 1, absl::Seconds(10));
  pusher.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0], (std::vector<float>{1, 2, 2}));
}

TEST_F(ShardStoreTest, SspBoundsHowFarAWorkerRunsAhead) {
  TableConfig c = SharedConfig(SSP, 2);
  c.set_staleness(1);
  ASSERT_TRUE(Init(c).ok());
  auto push_pull = [&](uint32_t worker, int64_t step, absl::Duration timeout) {
    PushPullRequest req;
    req.set_job("job");
    req.set_worker(worker);
    req.set_step(step);
    req.add_keys("b");
    PushPullResponse resp;
    std::vector<TensorBuffer> values;
    return WaitFor([&](StatusCallback done) {
      store_.PushPullAsync(req, {Floats({0, 0})}, &resp, &values, Within(timeout), done);
    });
  };
  // PushPull for step t returns once every worker pushed step t - 1: worker 0
  // may compute at most one step ahead of the slowest.
  const absl::StatusCode kBlocked = absl::StatusCode::kDeadlineExceeded;
  EXPECT_TRUE(push_pull(0, 0, absl::Seconds(5)).ok());
  EXPECT_EQ(push_pull(0, 1, absl::Milliseconds(150)).code(), kBlocked);
  EXPECT_TRUE(push_pull(1, 0, absl::Seconds(5)).ok());
  EXPECT_TRUE(push_pull(0, 1, absl::Seconds(5)).ok());  // its push was kept; now it may go on
  EXPECT_EQ(push_pull(0, 2, absl::Milliseconds(150)).code(), kBlocked);
  EXPECT_TRUE(push_pull(1, 1, absl::Seconds(5)).ok());
  EXPECT_TRUE(push_pull(0, 2, absl::Seconds(5)).ok());
}

TEST_F(ShardStoreTest, BadInputIsRefusedAndChangesNothing) {
  // Before InitTable.
  EXPECT_EQ(Push(0, 0, {"a"}, {Floats({1, 1, 1})}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Pull({"a"}).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 2)).ok());
  const std::vector<float> a0{1, 2, 3}, b0{10, 20};
  struct Bad {
    std::string name;
    std::vector<std::string> keys;
    std::vector<TensorBuffer> grads;
    uint32_t worker;
    absl::StatusCode code;
  };
  TensorBuffer short_bytes = Floats({1, 1, 1});
  short_bytes.nbytes = 8;
  std::vector<Bad> cases = {
      {"unknown key", {"b", "zzz"}, {Floats({1, 1}), Floats({1})}, 0, absl::StatusCode::kNotFound},
      {"shape", {"b", "a"}, {Floats({1, 1}), Floats({1, 1, 1, 1})}, 0,
       absl::StatusCode::kInvalidArgument},
      {"rank", {"b", "a"}, {Floats({1, 1}), Floats({1, 1, 1}, {1, 3})}, 0,
       absl::StatusCode::kInvalidArgument},
      {"dtype", {"b", "a"}, {Floats({1, 1}), TensorBuffer::CopyOf(DT_INT32, {3}, "abcdefghijkl", 12)},
       0, absl::StatusCode::kInvalidArgument},
      {"byte length", {"b", "a"}, {Floats({1, 1}), short_bytes}, 0,
       absl::StatusCode::kInvalidArgument},
      {"nan", {"b", "a"}, {Floats({1, 1}), Floats({1, NAN, 1})}, 0,
       absl::StatusCode::kInvalidArgument},
      {"inf", {"b", "a"}, {Floats({1, 1}), Floats({1, 1, -INFINITY})}, 0,
       absl::StatusCode::kInvalidArgument},
      {"duplicate key", {"a", "a"}, {Floats({1, 1, 1}), Floats({1, 1, 1})}, 0,
       absl::StatusCode::kInvalidArgument},
      {"count mismatch", {"a", "b"}, {Floats({1, 1, 1})}, 0, absl::StatusCode::kInvalidArgument},
      {"worker out of range", {"b"}, {Floats({1, 1})}, 7, absl::StatusCode::kInvalidArgument},
  };
  for (auto& c : cases) {
    absl::Status s = Push(c.worker, 5, c.keys, c.grads);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    EXPECT_FALSE(s.message().empty()) << c.name;
    auto v = Pull({"a", "b"});
    ASSERT_TRUE(v.ok());
    EXPECT_EQ((*v)[0], a0) << c.name << " changed key a";
    EXPECT_EQ((*v)[1], b0) << c.name << " changed key b";
  }
  // The step of a refused push was not consumed: the same push, fixed, applies.
  PushResponse r;
  ASSERT_TRUE(Push(0, 5, {"b"}, {Floats({2, 2})}, &r).ok());
  EXPECT_EQ(r.applied(), 1u);
}

TEST_F(ShardStoreTest, NonFiniteGradientsCanBeSkippedByPolicy) {
  TableConfig c = SharedConfig(ASYNC, 1);
  c.set_nonfinite(NONFINITE_SKIP);
  ASSERT_TRUE(Init(c).ok());
  PushResponse r;
  ASSERT_TRUE(Push(0, 0, {"a", "b"}, {Floats({NAN, 0, 0}), Floats({2, 2})}, &r).ok());
  EXPECT_EQ(r.skipped_nonfinite(), 1u);
  EXPECT_EQ(r.applied(), 1u);
  auto v = Pull({"a", "b"});
  EXPECT_EQ((*v)[0], (std::vector<float>{1, 2, 3}));
  EXPECT_EQ((*v)[1], (std::vector<float>{9, 19}));
}

TEST_F(ShardStoreTest, ConcurrentPushesAreAllAppliedExactlyOnce) {
  // Plain SGD with lr 1 adds up, so the final value does not depend on order.
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 8, 1.0)).ok());
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      for (int step = 0; step < 200; ++step) {
        // Each push is sent twice, as a retry would be.
        for (int copy = 0; copy < 2; ++copy) {
          ASSERT_TRUE(Push(w, step, {"a", "b"}, {Floats({1, 0, 0}), Floats({0, 0.5})}).ok());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  auto v = Pull({"a", "b"}, 1600);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0], (std::vector<float>{1 - 1600, 2, 3}));
  EXPECT_EQ((*v)[1], (std::vector<float>{10, 20 - 800}));
  StatsResponse stats;
  ASSERT_TRUE(WaitFor([&](StatusCallback done) { store_.StatsAsync({}, &stats, {}, done); }).ok());
  ASSERT_EQ(stats.tables_size(), 1);
  EXPECT_EQ(stats.tables(0).pushes_applied(), 3200u);
  EXPECT_EQ(stats.tables(0).pushes_duplicate(), 3200u);
  EXPECT_EQ(stats.tables(0).min_version(), 1600);
}

TEST_F(ShardStoreTest, ShutdownFailsWaitingCallsWithUnavailable) {
  ASSERT_TRUE(Init(SharedConfig(ASYNC, 1)).ok());
  std::thread waiter([&] {
    auto v = Pull({"a"}, 5, absl::Seconds(30));
    EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  });
  absl::SleepFor(absl::Milliseconds(100));
  store_.Shutdown();
  waiter.join();
  EXPECT_EQ(Push(0, 0, {"a"}, {Floats({1, 1, 1})}).code(), absl::StatusCode::kUnavailable);
}

TEST_F(ShardStoreTest, InitTableRefusesBadTables) {
  InitTableRequest req;
  req.set_job("j");
  *req.mutable_config() = SharedConfig(ASYNC, 1);
  req.add_keys("a");
  InitTableResponse resp;
  auto init = [&](std::vector<TensorBuffer> values) {
    return WaitFor([&](StatusCallback done) { store_.InitTableAsync(req, values, &resp, {}, done); });
  };
  EXPECT_EQ(init({}).code(), absl::StatusCode::kInvalidArgument);  // count
  EXPECT_EQ(init({TensorBuffer::CopyOf(DT_INT64, {1}, "abcdefgh", 8)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(init({Floats({NAN})}).code(), absl::StatusCode::kInvalidArgument);
  req.mutable_config()->set_num_workers(0);
  EXPECT_EQ(init({Floats({1})}).code(), absl::StatusCode::kInvalidArgument);
  req.mutable_config()->set_num_workers(1);
  req.mutable_config()->mutable_optimizer()->set_lr(0);
  EXPECT_EQ(init({Floats({1})}).code(), absl::StatusCode::kInvalidArgument);
}


// An in-process owner that applies the optimizer itself (the all-reduce
// worker) reads the state out after updates, writes new values and state
// in, and a checkpoint of the store then carries exactly what it wrote.
TEST_F(ShardStoreTest, ExportAndImportCarryValuesAndOptimizerState) {
  TableConfig config = SharedConfig(SYNC, 1, 0.5);
  config.mutable_optimizer()->set_momentum(0.9);
  ASSERT_TRUE(Init(config).ok());
  std::vector<float> a(3), a_mom(3), b(2), b_mom(2);
  std::vector<ShardStore::ChunkState> chunks(2);
  chunks[0] = {"a", {a.data(), 3}, {{a_mom.data(), 3}}, -1};
  chunks[1] = {"b", {b.data(), 2}, {{b_mom.data(), 2}}, -1};
  // Before any update: the values, a zero momentum buffer, step 0.
  ASSERT_TRUE(store_.ExportChunks("job", &chunks).ok());
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(a_mom, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(chunks[0].optimizer_step, 0);
  // Two SGD-momentum steps with gradient 1: momentum 1 then 1.9.
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(Push(0, step, {"a", "b"}, {Floats({1, 1, 1}), Floats({1, 1})}).ok());
  }
  ASSERT_TRUE(store_.ExportChunks("job", &chunks).ok());
  EXPECT_FLOAT_EQ(a_mom[0], 1.9f);
  EXPECT_FLOAT_EQ(a[0], 1 - 0.5f * 1 - 0.5f * 1.9f);
  EXPECT_EQ(chunks[1].optimizer_step, 2);

  // What the owner computed elsewhere replaces values and state at once.
  a = {7, 8, 9};
  a_mom = {0.1f, 0.2f, 0.3f};
  b = {5, 6};
  b_mom = {0.5f, 0.6f};
  for (auto& c : chunks) c.optimizer_step = 12;
  ASSERT_TRUE(store_.ImportChunks("job", chunks, /*step=*/11).ok());
  auto v = Pull({"a", "b"}, /*min_version=*/12);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0], (std::vector<float>{7, 8, 9}));
  EXPECT_EQ((*v)[1], (std::vector<float>{5, 6}));
  std::vector<float> a2(3), a2_mom(3);
  std::vector<ShardStore::ChunkState> again(1);
  again[0] = {"a", {a2.data(), 3}, {{a2_mom.data(), 3}}, -1};
  ASSERT_TRUE(store_.ExportChunks("job", &again).ok());
  EXPECT_EQ(a2_mom, (std::vector<float>{0.1f, 0.2f, 0.3f}));
  EXPECT_EQ(again[0].optimizer_step, 12);
  // The next update continues from the imported momentum: 0.9 * 0.1 + 1.
  ASSERT_TRUE(Push(0, 12, {"a", "b"}, {Floats({1, 1, 1}), Floats({1, 1})}).ok());
  ASSERT_TRUE(store_.ExportChunks("job", &again).ok());
  EXPECT_FLOAT_EQ(a2_mom[0], 0.9f * 0.1f + 1);

  // Unknown keys and a wrong slot count change nothing.
  std::vector<ShardStore::ChunkState> bad(1);
  bad[0] = {"zz", {a.data(), 3}, {{a_mom.data(), 3}}, 1};
  EXPECT_FALSE(store_.ImportChunks("job", bad, 0).ok());
  bad[0] = {"a", {a.data(), 3}, {}, 1};
  EXPECT_EQ(store_.ImportChunks("job", bad, 0).code(), absl::StatusCode::kInvalidArgument);
  // Buffers of another size or dtype than the chunk: refused, not overrun.
  bad[0] = {"a", {a.data(), 2}, {{a_mom.data(), 3}}, 1};
  EXPECT_EQ(store_.ImportChunks("job", bad, 0).code(), absl::StatusCode::kInvalidArgument);
  std::vector<double> wide(3);
  bad[0] = {"a", {a.data(), 3}, {{wide.data(), 3}}, 1};
  EXPECT_EQ(store_.ExportChunks("job", &bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(store_.ExportChunks("nojob", &again).ok());
}

}  // namespace
}  // namespace pstrain
