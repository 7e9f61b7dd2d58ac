// Pipelined tables (TableConfig.pipeline_stages): a job of 4 workers in 2
// stages, rank r of stage r % 2; key "a" of stage 0, key "b" of stage 1.
// Each stage's InitTable brings its own keys' values and tells their
// stage; a key is pushed by its stage's two replicas only, whom SYNC waits for, SSP's clock counts and
// whose optimizer state and lr are per replica.
#include <gtest/gtest.h>

#include <future>

#include "table/shard_store.h"
#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

TableConfig Piped(Consistency consistency, double lr = 1.0) {
  TableConfig c = Config(consistency, 4, lr);
  c.set_pipeline_stages(2);
  return c;
}

class PipelinedTable : public ::testing::Test {
 protected:
  // Stage `stage`'s InitTable: its own key's value, the other's layout.
  InitTableRequest InitRequest(uint32_t stage, const TableConfig& config, uint64_t attempt = 0) {
    InitTableRequest req;
    req.set_job("job");
    req.set_attempt(attempt);
    *req.mutable_config() = config;
    req.add_keys("a");
    req.add_keys("b");
    req.set_stage(stage);
    req.add_own_keys(stage);  // "a" is stage 0's, "b" stage 1's
    KeyLayout* other = req.add_layouts();
    other->set_dtype(DT_FLOAT32);
    other->add_shape(2);
    return req;
  }
  absl::Status InitStage(uint32_t stage, const TableConfig& config, uint64_t attempt = 0) {
    InitTableRequest req = InitRequest(stage, config, attempt);
    return InitWith(req, {Floats(stage == 0 ? std::vector<float>{1, 2} : std::vector<float>{10, 20})});
  }
  absl::Status InitWith(const InitTableRequest& req, std::vector<TensorBuffer> values) {
    InitTableResponse resp;
    return WaitFor([&](StatusCallback d) { store_.InitTableAsync(req, std::move(values), &resp, {}, d); });
  }
  absl::Status PushKey(const std::string& key, uint32_t worker, int64_t step, std::vector<float> grad,
                       uint64_t attempt = 0) {
    PushRequest req;
    req.set_job("job");
    req.set_attempt(attempt);
    req.set_worker(worker);
    req.set_step(step);
    req.add_keys(key);
    PushResponse resp;
    return WaitFor([&](StatusCallback d) { store_.PushAsync(req, {Floats(grad)}, &resp, {}, d); });
  }
  absl::StatusOr<std::vector<float>> PullKey(const std::string& key, int64_t min_version = 0,
                                             int64_t min_worker_steps = 0, uint64_t attempt = 0,
                                             absl::Duration timeout = absl::Seconds(5)) {
    PullRequest req;
    req.set_job("job");
    req.set_attempt(attempt);
    req.set_min_version(min_version);
    req.set_min_worker_steps(min_worker_steps);
    req.add_keys(key);
    PullResponse resp;
    std::vector<TensorBuffer> values;
    absl::Status s = WaitFor([&](StatusCallback d) { store_.PullAsync(req, &resp, &values, Within(timeout), d); });
    if (!s.ok()) return s;
    return ToFloats(values.at(0));
  }
  absl::Status Save(const std::string& path, SaveTableResponse* resp) {
    SaveTableRequest req;
    req.set_job("job");
    req.set_path(path);
    return WaitFor([&](StatusCallback d) { store_.SaveTableAsync(req, resp, {}, d); });
  }

  ShardStore store_{Options()};
};

TEST_F(PipelinedTable, EachStageGivesItsOwnKeysValuesAndPendingKeysAreRefused) {
  ASSERT_TRUE(InitStage(1, Piped(SYNC)).ok());
  EXPECT_EQ(*PullKey("b"), (std::vector<float>{10, 20}));
  // Stage 0's key is pending: no pull, push or checkpoint sees its zeros.
  EXPECT_EQ(PullKey("a").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PushKey("a", 0, 0, {1, 1}).code(), absl::StatusCode::kFailedPrecondition);
  SaveTableResponse saved;
  EXPECT_EQ(Save("pending/shard-0.bin", &saved).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(InitStage(0, Piped(SYNC)).ok());
  EXPECT_EQ(*PullKey("a"), (std::vector<float>{1, 2}));
  // A replica's InitTable, or the other stage's again, changes nothing.
  ASSERT_TRUE(InitWith(InitRequest(1, Piped(SYNC)), {Floats({7, 7})}).ok());
  EXPECT_EQ(*PullKey("b"), (std::vector<float>{10, 20}));
  // A rank of stage 0 that does not claim "a" is of another cut: "a"'s
  // pushers would wait for its pushes.
  InitTableRequest unclaimed = InitRequest(0, Piped(SYNC));
  unclaimed.clear_own_keys();
  *unclaimed.add_layouts() = unclaimed.layouts(0);
  EXPECT_EQ(InitWith(unclaimed, {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Save("filled/shard-0.bin", &saved).ok());
}

TEST_F(PipelinedTable, SyncCompletesAKeysStepWhenItsStagesReplicasPushed) {
  ASSERT_TRUE(InitStage(0, Piped(SYNC)).ok());
  ASSERT_TRUE(InitStage(1, Piped(SYNC)).ok());
  // Ranks 1 and 3 are stage 1's: they do not push "a".
  EXPECT_EQ(PushKey("a", 1, 0, {1, 1}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushKey("a", 0, 0, {2, 4}).ok());
  EXPECT_EQ(PullKey("a", 1, 0, 0, absl::Milliseconds(100)).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(PushKey("a", 2, 0, {4, 8}).ok());
  // The mean of the two replicas' gradients, lr 1: {1, 2} - {3, 6}.
  EXPECT_EQ(*PullKey("a", 1), (std::vector<float>{-2, -4}));
  // Stage 1's key moves on its own.
  ASSERT_TRUE(PushKey("b", 1, 0, {2, 2}).ok());
  ASSERT_TRUE(PushKey("b", 3, 0, {0, 0}).ok());
  EXPECT_EQ(*PullKey("b", 1), (std::vector<float>{9, 19}));
}

TEST_F(PipelinedTable, AsyncDividesLrByTheReplicasAndSspCountsTheStagesRanks) {
  ASSERT_TRUE(InitStage(0, Piped(ASYNC)).ok());
  ASSERT_TRUE(InitStage(1, Piped(ASYNC)).ok());
  // Per-replica state, lr / 2 replicas: a round of both moves "a" by the
  // mean gradient times lr, as a SYNC step would.
  ASSERT_TRUE(PushKey("a", 0, 0, {2, 4}).ok());
  ASSERT_TRUE(PushKey("a", 2, 0, {4, 8}).ok());
  EXPECT_EQ(*PullKey("a"), (std::vector<float>{-2, -4}));
  // Both replicas of stage 0 pushed step 0: "a"'s clock is 0 although
  // stage 1's ranks never push it.
  EXPECT_TRUE(PullKey("a", 0, /*min_worker_steps=*/1).ok());
  EXPECT_EQ(PullKey("b", 0, 1, 0, absl::Milliseconds(100)).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(PipelinedTable, ARestoredTableLearnsItsStagesFromTheInitTables) {
  ASSERT_TRUE(InitStage(0, Piped(SYNC)).ok());
  ASSERT_TRUE(InitStage(1, Piped(SYNC)).ok());
  SaveTableResponse saved;
  ASSERT_TRUE(Save("ckpt/shard-0.bin", &saved).ok());
  LoadTableRequest load;
  load.set_job("job");
  load.set_attempt(1);
  *load.mutable_config() = Piped(SYNC);
  auto* f = load.add_files();
  f->set_path(saved.path());
  f->set_bytes(saved.bytes());
  f->set_crc32(saved.crc32());
  load.add_keys("a");
  load.add_keys("b");
  LoadTableResponse loaded;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { store_.LoadTableAsync(load, &loaded, {}, d); }).ok());
  // Until its stage's InitTable tells a key's stage, nobody may push it;
  // its restored value may be read (a checkpoint's reader does).
  EXPECT_EQ(PushKey("a", 0, 0, {1, 1}, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*PullKey("b", 0, 0, 1), (std::vector<float>{10, 20}));
  // The restored values stay: the InitTable's are the seeded ones.
  ASSERT_TRUE(InitWith(InitRequest(0, Piped(SYNC), 1), {Floats({5, 5})}).ok());
  EXPECT_EQ(*PullKey("a", 0, 0, 1), (std::vector<float>{1, 2}));
  EXPECT_EQ(PushKey("b", 1, 0, {1, 1}, 1).code(), absl::StatusCode::kFailedPrecondition);
  // Another cut, claiming "a" for stage 1, is refused whole: "b" learns
  // no stage from it.
  InitTableRequest recut = InitRequest(1, Piped(SYNC), 1);
  recut.clear_own_keys();
  recut.add_own_keys(0);
  recut.add_own_keys(1);
  recut.clear_layouts();
  EXPECT_EQ(InitWith(recut, {Floats({0, 0}), Floats({0, 0})}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(PushKey("b", 1, 0, {1, 1}, 1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(InitStage(1, Piped(SYNC), 1).ok());
  ASSERT_TRUE(PushKey("b", 1, 0, {2, 2}, 1).ok());
  ASSERT_TRUE(PushKey("b", 3, 0, {0, 0}, 1).ok());
  EXPECT_EQ(*PullKey("b", 1, 0, 1), (std::vector<float>{9, 19}));
}

// Layouts cost nothing to send: their bytes, summed, must not wrap around
// to a table the budget lets in (here 2^35 + 4 x (2^62 - 2^33) = 2^64).
TEST_F(PipelinedTable, LayoutsWhoseBytesWouldWrapAreRefusedBeforeAnyAllocation) {
  InitTableRequest req = InitRequest(0, Piped(SYNC));
  req.clear_keys();
  req.clear_own_keys();
  req.clear_layouts();
  for (int i = 0; i < 5; ++i) {
    req.add_keys("k" + std::to_string(i));
    KeyLayout* layout = req.add_layouts();
    layout->set_dtype(DT_FLOAT32);
    layout->add_shape(i == 0 ? int64_t{1} << 33 : (int64_t{1} << 60) - (int64_t{1} << 31));
  }
  EXPECT_EQ(InitWith(req, {}).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(PipelinedTable, MalformedPipelinedInitTablesAreRefused) {
  struct Case {
    std::string what;
    std::function<void(InitTableRequest&)> mutate;
    size_t values = 1;
  };
  const std::vector<Case> cases = {
      {"a stage out of range", [](InitTableRequest& r) { r.set_stage(2); }},
      {"an own key out of range", [](InitTableRequest& r) { r.set_own_keys(0, 2); }},
      {"own keys not ascending", [](InitTableRequest& r) { r.clear_layouts(), r.add_own_keys(0); }, 2},
      {"no own key for a value", [](InitTableRequest& r) { r.clear_own_keys(); }},
      {"a layout missing", [](InitTableRequest& r) { r.clear_layouts(); }},
      {"a negative dimension", [](InitTableRequest& r) { r.mutable_layouts(0)->set_shape(0, -1); }},
      {"an int layout", [](InitTableRequest& r) { r.mutable_layouts(0)->set_dtype(DT_INT64); }},
      {"two values for one key", [](InitTableRequest&) {}, 2},
      {"stages that do not divide the workers", [](InitTableRequest& r) { r.mutable_config()->set_num_workers(3); }},
      {"copies", [](InitTableRequest& r) { r.add_copies()->add_shards(0); }},
      {"layouts in an unpipelined table", [](InitTableRequest& r) { r.mutable_config()->set_pipeline_stages(0); }},
  };
  for (const Case& c : cases) {
    InitTableRequest req = InitRequest(0, Piped(SYNC));
    c.mutate(req);
    std::vector<TensorBuffer> values(c.values, Floats({1, 2}));
    EXPECT_EQ(InitWith(req, values).code(), absl::StatusCode::kInvalidArgument) << c.what;
  }
  StatsRequest stats;
  stats.set_job("job");
  StatsResponse tables;
  EXPECT_EQ(WaitFor([&](StatusCallback d) { store_.StatsAsync(stats, &tables, {}, d); }).code(),
            absl::StatusCode::kNotFound)
      << "a refused InitTable made a table";
}

}  // namespace
}  // namespace pstrain
