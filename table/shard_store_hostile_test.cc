// ShardStore against hostile or buggy callers: attempt fencing (with a
// fault-injection point that holds a push until the job was restored),
// confined files, nonsense values, resource limits, callbacks that call
// back in, and crafted checkpoint files.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "table/shard_store.h"
#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

// The race the pods test hit: a push of the job's first attempt is delayed
// (a partition) while the coordinator requeues the job and restores its
// table for attempt 2; then the delayed push arrives. It must be refused
// (ABORTED, final for the worker) and change nothing.
TEST(ShardStoreFencingTest, DelayedPushOfAnEndedAttemptCannotReachTheRestoredTable) {
  absl::Mutex mu;
  bool held = false, release = false;  // under mu
  ShardStoreOptions options = Options();
  options.before_push = [&](const std::string&, uint64_t attempt, uint32_t, int64_t) {
    if (attempt != 1) return;
    absl::MutexLock lock(&mu);
    held = true;
    mu.Await(absl::Condition(&release));
  };
  ShardStore store(options);
  ASSERT_TRUE(Init(store, Config(ASYNC, 2), /*attempt=*/1).ok());
  auto delayed = std::async(std::launch::async, [&] { return Push(store, 1, 1, 140, Floats({1, 1, 1})); });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&held));
  }
  // The coordinator's drop of attempt 1 is lost; attempt 2 creates the table
  // again (a restore) and makes progress.
  ASSERT_TRUE(Init(store, Config(ASYNC, 2), /*attempt=*/2, {5, 5, 5}).ok());
  ASSERT_TRUE(Push(store, 2, 0, 0, Floats({0, 0, 0})).ok());
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  absl::Status s = delayed.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("attempt 1"), absl::string_view::npos) << s;
  EXPECT_EQ(*Pull(store, 2), (std::vector<float>{5, 5, 5}));
  TableStats st = Stats(store);
  EXPECT_EQ(st.attempt(), 2u);
  EXPECT_EQ(st.pushes_applied(), 1u);  // attempt 2's own push only
  EXPECT_EQ(st.max_version(), 1);
}

TEST(ShardStoreFencingTest, EveryCallIsCheckedAgainstTheTablesAttempt) {
  ShardStore store(Options());
  ASSERT_TRUE(Init(store, Config(SYNC, 2), 3).ok());
  // A waiter of attempt 3 is failed when attempt 4 replaces the table.
  auto waiting = std::async(std::launch::async, [&] { return Pull(store, 3, /*min_version=*/1).status(); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Init(store, Config(SYNC, 2), 4).ok());
  EXPECT_EQ(waiting.get().code(), absl::StatusCode::kAborted);
  // Earlier attempts: ABORTED everywhere; later ones: FAILED_PRECONDITION.
  EXPECT_EQ(Push(store, 3, 0, 0, Floats({1, 1, 1})).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Push(store, 0, 0, 0, Floats({1, 1, 1})).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Pull(store, 3).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Pull(store, 5).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Init(store, Config(SYNC, 2), 3).code(), absl::StatusCode::kAborted);
  SaveTableRequest save;
  save.set_job("job");
  save.set_attempt(3);
  save.set_path("fence/shard-0.bin");
  SaveTableResponse saved;
  EXPECT_EQ(WaitFor([&](StatusCallback d) { store.SaveTableAsync(save, &saved, {}, d); }).code(),
            absl::StatusCode::kAborted);
  // A late drop of attempt 3 keeps attempt 4's table.
  DropTableRequest drop;
  drop.set_job("job");
  drop.set_attempt(3);
  DropTableResponse dropped;
  EXPECT_EQ(WaitFor([&](StatusCallback d) { store.DropTableAsync(drop, &dropped, {}, d); }).code(),
            absl::StatusCode::kAborted);
  EXPECT_FALSE(dropped.dropped());
  EXPECT_TRUE(Pull(store, 4).ok());
  drop.set_attempt(4);
  EXPECT_TRUE(WaitFor([&](StatusCallback d) { store.DropTableAsync(drop, &dropped, {}, d); }).ok());
  EXPECT_TRUE(dropped.dropped());
}

// The store's header promises that no callback runs under a lock: a done
// callback that calls straight back into the store must not deadlock.
TEST(ShardStoreConcurrencyTest, CallbacksMayCallBackIntoTheStore) {
  ShardStore store(Options());
  auto chained = std::make_shared<std::promise<bool>>();
  auto result = chained->get_future();
  InitTableRequest req;
  req.set_job("job");
  *req.mutable_config() = Config(ASYNC, 1);
  req.add_keys("a");
  auto resp = std::make_shared<InitTableResponse>();
  std::thread caller([&] {
    store.InitTableAsync(req, {Floats({1})}, resp.get(), {}, [&, chained](absl::Status s) {
      // Re-entering: StatsAsync takes the table map's lock, InitTableAsync of the same
      // job the map's too, PushAsync the chunk's.
      StatsResponse stats;
      bool ok = s.ok();
      store.StatsAsync(StatsRequest(), &stats, {}, [&](absl::Status s2) { ok = ok && s2.ok(); });
      InitTableResponse again;
      store.InitTableAsync(req, {Floats({1})}, &again, {}, [&](absl::Status s3) { ok = ok && s3.ok(); });
      chained->set_value(ok);
    });
  });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "deadlock";
  EXPECT_TRUE(result.get());
  caller.join();
  // A waiter's callback that pushes (and so fires waiters again).
  auto pushed = std::make_shared<std::promise<absl::Status>>();
  auto pushed_result = pushed->get_future();
  PullRequest pull;
  pull.set_job("job");
  pull.add_keys("a");
  pull.set_min_version(1);
  PullResponse pull_resp;
  std::vector<TensorBuffer> values;
  PushResponse push_resp;
  store.PullAsync(pull, &pull_resp, &values, {}, [&, pushed](absl::Status s) {
    if (!s.ok()) return pushed->set_value(s);
    PushRequest push;
    push.set_job("job");
    push.set_step(1);
    push.add_keys("a");
    store.PushAsync(push, {Floats({1})}, &push_resp, {}, [pushed](absl::Status s2) { pushed->set_value(s2); });
  });
  ASSERT_TRUE(Push(store, 0, 0, 0, Floats({1})).ok());
  ASSERT_EQ(pushed_result.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "deadlock";
  EXPECT_TRUE(pushed_result.get().ok());
}

TEST(ShardStoreValuesTest, NonsenseConfigsAreRefusedNamingTheField) {
  ShardStore store(Options());
  struct Case {
    const char* field;
    std::function<void(OptimizerConfig*)> set;
  };
  const double nan = std::nan("");
  const std::vector<Case> cases = {
      {"lr", [](OptimizerConfig* o) { o->set_lr(1e30); }},
      {"lr", [&](OptimizerConfig* o) { o->set_lr(nan); }},
      {"momentum", [](OptimizerConfig* o) { o->set_momentum(50); }},
      {"dampening", [&](OptimizerConfig* o) { o->set_dampening(nan); }},
      {"weight_decay", [](OptimizerConfig* o) { o->set_weight_decay(1e9); }},
      {"beta1", [&](OptimizerConfig* o) { o->set_kind(OptimizerConfig::ADAM); o->set_beta1(nan); }},
      {"beta2", [](OptimizerConfig* o) { o->set_kind(OptimizerConfig::ADAM); o->set_beta2(7); }},
      {"eps", [](OptimizerConfig* o) { o->set_kind(OptimizerConfig::ADAM); o->set_eps(1e9); }},
      {"lr_decay", [&](OptimizerConfig* o) { o->set_kind(OptimizerConfig::ADAGRAD); o->set_lr_decay(nan); }},
      {"initial_accumulator_value",
       [](OptimizerConfig* o) { o->set_kind(OptimizerConfig::ADAGRAD); o->set_initial_accumulator_value(1e300); }},
  };
  for (const Case& c : cases) {
    TableConfig config = Config(ASYNC, 1);
    c.set(config.mutable_optimizer());
    absl::Status s = Init(store, config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field << ": " << s;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s;
  }
  TableConfig many = Config(ASYNC, 65536);
  EXPECT_EQ(Init(store, many).code(), absl::StatusCode::kInvalidArgument);
  StatsResponse all;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.StatsAsync(StatsRequest(), &all, {}, d); }).ok());
  EXPECT_EQ(all.tables_size(), 0);  // nothing was created
}

// A finite gradient can still make a non-finite update (huge for the lr):
// under REJECT the push is refused whole, under SKIP that update is dropped
// and counted; the parameters never become NaN or Inf.
TEST(ShardStoreValuesTest, UpdatesWithNonFiniteResultsAreNeverApplied) {
  for (NonFinitePolicy policy : {NONFINITE_REJECT, NONFINITE_SKIP}) {
    ShardStore store(Options());
    TableConfig config = Config(ASYNC, 1, /*lr=*/100);
    config.set_nonfinite(policy);
    InitTableRequest req;
    req.set_job("job");
    *req.mutable_config() = config;
    req.add_keys("a");
    req.add_keys("b");
    InitTableResponse ir;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.InitTableAsync(req, {Floats({1, 2}), Floats({3})}, &ir, {}, d); }).ok());
    PushRequest push;
    push.set_job("job");
    push.add_keys("b");  // fine
    push.add_keys("a");  // 3e38 * 100 overflows float32
    PushResponse resp;
    absl::Status s = WaitFor([&](StatusCallback d) {
      store.PushAsync(push, {Floats({1}), Floats({3e38f, 1})}, &resp, {}, d);
    });
    PullRequest pull;
    pull.set_job("job");
    pull.add_keys("a");
    pull.add_keys("b");
    PullResponse pr;
    std::vector<TensorBuffer> values;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.PullAsync(pull, &pr, &values, {}, d); }).ok());
    EXPECT_EQ(ToFloats(values[0]), (std::vector<float>{1, 2}));
    EXPECT_EQ(Stats(store).updates_nonfinite(), 1u);
    if (policy == NONFINITE_REJECT) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("'a'"), absl::string_view::npos) << s;
      EXPECT_EQ(ToFloats(values[1]), (std::vector<float>{3}));  // all or nothing: b untouched too
    } else {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(resp.applied(), 1u);
      EXPECT_EQ(resp.skipped_nonfinite(), 1u);
      EXPECT_EQ(ToFloats(values[1]), (std::vector<float>{-97}));
    }
  }
}

TEST(ShardStoreValuesTest, StepsOutOfReachAreRefused) {
  ShardStore store(Options());
  ASSERT_TRUE(Init(store, Config(ASYNC, 1)).ok());
  for (int64_t step : {int64_t{-1}, INT64_MAX, INT64_MAX - 1, kMaxStep, kMaxStepAhead + 1}) {
    EXPECT_EQ(Push(store, 0, 0, step, Floats({1, 1, 1})).code(), absl::StatusCode::kInvalidArgument) << step;
  }
  EXPECT_EQ(Pull(store, 0, INT64_MAX).status().code(), absl::StatusCode::kInvalidArgument);
  // The worker is not stalled: its next real step applies.
  PushResponse resp;
  ASSERT_TRUE(Push(store, 0, 0, 0, Floats({1, 1, 1}), &resp).ok());
  EXPECT_EQ(resp.applied(), 1u);
}

TEST(ShardStoreResourcesTest, MemoryTablesAndWaitersAreBounded) {
  ShardStoreOptions options = Options();
  options.max_bytes = 1000;
  options.max_tables = 2;
  options.max_waiters = 2;
  ShardStore store(options);
  // 200 floats, SGD with momentum, 4 workers with their own state: 800 bytes
  // of values and 4 x 800 of state -- more than the budget, refused before
  // anything is allocated.
  TableConfig big = Config(ASYNC, 4);
  big.mutable_optimizer()->set_momentum(0.9);
  absl::Status s = Init(store, big, 0, std::vector<float>(200, 1.f));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("max_memory_mb"), absl::string_view::npos) << s;
  EXPECT_EQ(store.reserved_bytes(), 0u);
  ASSERT_TRUE(Init(store, Config(SYNC, 2), 0, {1}, "job").ok());
  const uint64_t reserved = store.reserved_bytes();
  EXPECT_GT(reserved, 0u);
  // An identical InitTable (every worker sends one) allocates nothing.
  ASSERT_TRUE(Init(store, Config(SYNC, 2), 0, {1}, "job").ok());
  EXPECT_EQ(store.reserved_bytes(), reserved);
  ASSERT_TRUE(Init(store, Config(ASYNC, 1), 0, {1}, "other").ok());
  EXPECT_EQ(Init(store, Config(ASYNC, 1), 0, {1}, "third").code(), absl::StatusCode::kResourceExhausted);
  // Two parked pulls are allowed, the third is refused at once.
  auto w1 = std::async(std::launch::async, [&] { return Pull(store, 0, 5, absl::Seconds(2)).status(); });
  auto w2 = std::async(std::launch::async, [&] { return Pull(store, 0, 5, absl::Seconds(2)).status(); });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(Pull(store, 0, 5, absl::Seconds(2)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(w1.get().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(w2.get().code(), absl::StatusCode::kDeadlineExceeded);
  // Dropping a table returns its bytes -- once the last reference goes: a
  // timed-out pull's waiter may still hold the table for a moment after its
  // caller heard DEADLINE_EXCEEDED (the full suite under load once saw the
  // bytes of both tables just after the drop).
  DropTableRequest drop;
  drop.set_job("job");
  DropTableResponse dropped;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.DropTableAsync(drop, &dropped, {}, d); }).ok());
  EXPECT_TRUE(dropped.dropped());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (store.reserved_bytes() > reserved && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_LT(store.reserved_bytes(), reserved + 1);
}

TEST(ShardStoreResourcesTest, LongNamesAreRefusedAndNeverEchoedWhole) {
  ShardStore store(Options());
  const std::string huge(1 << 20, 'x');
  InitTableRequest req;
  req.set_job(huge);
  *req.mutable_config() = Config(ASYNC, 1);
  InitTableResponse resp;
  absl::Status s = WaitFor([&](StatusCallback d) { store.InitTableAsync(req, {}, &resp, {}, d); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 300u);
  PullRequest pull;
  pull.set_job(huge);
  PullResponse pr;
  std::vector<TensorBuffer> values;
  s = WaitFor([&](StatusCallback d) { store.PullAsync(pull, &pr, &values, {}, d); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(s.message().size(), 300u);
  req.set_job("job");
  req.add_keys(std::string(5000, 'k'));
  s = WaitFor([&](StatusCallback d) { store.InitTableAsync(req, {Floats({1})}, &resp, {}, d); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 300u);
}

}  // namespace
}  // namespace pstrain
