// Helpers of the shard store's tests.
#ifndef PSTRAIN_TABLE_SHARD_STORE_TESTING_H_
#define PSTRAIN_TABLE_SHARD_STORE_TESTING_H_

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "table/shard_store.h"

namespace pstrain {
namespace testing_util {

// `whole` cut at random places into pieces of 1..max_piece bytes, each
// copied to its own allocation at a random offset (so most are not aligned
// for the element type), as gRPC's read slices are.
inline TensorBuffer InPieces(const TensorBuffer& whole, std::mt19937& rng, size_t max_piece) {
  auto storage = std::make_shared<std::vector<std::vector<uint8_t>>>();
  auto pieces = std::make_shared<BytePieces>();
  std::uniform_int_distribution<size_t> len(1, max_piece), shift(0, 7);
  std::vector<size_t> offsets;
  for (size_t at = 0; at < whole.nbytes;) {
    const size_t n = std::min(len(rng), whole.nbytes - at);
    offsets.push_back(shift(rng));
    storage->emplace_back(offsets.back() + n);
    std::memcpy(storage->back().data() + offsets.back(), whole.data + at, n);
    at += n;
  }
  // Pointers only once the vector no longer grows.
  for (size_t k = 0; k < storage->size(); ++k) {
    auto& s = (*storage)[k];
    pieces->spans.push_back({s.data() + offsets[k], s.size() - offsets[k]});
  }
  TensorBuffer t;
  t.dtype = whole.dtype;
  t.shape = whole.shape;
  t.nbytes = whole.nbytes;
  t.pieces = pieces;
  t.owner = storage;
  return t;
}


// Options of a call that fails with DEADLINE_EXCEEDED once `timeout` passed.
inline CallOptions Within(absl::Duration timeout) {
  CallOptions opts;
  opts.deadline = absl::Now() + timeout;
  return opts;
}

inline TensorBuffer Floats(const std::vector<float>& v, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return TensorBuffer::CopyOf(DT_FLOAT32, shape, v.data(), v.size() * sizeof(float));
}

inline std::vector<float> ToFloats(const TensorBuffer& t) {
  const float* p = reinterpret_cast<const float*>(t.data);
  return std::vector<float>(p, p + t.NumElements());
}

// SGD; per-worker optimizer state under ASYNC/SSP (the default).
inline TableConfig Config(Consistency consistency, uint32_t workers, double lr = 0.5) {
  TableConfig c;
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_lr(lr);
  c.set_consistency(consistency);
  c.set_num_workers(workers);
  return c;
}

// The classic shared optimizer state, full lr per push.
inline TableConfig SharedConfig(Consistency consistency, uint32_t workers, double lr = 0.5) {
  TableConfig c = Config(consistency, workers, lr);
  c.set_shared_async_state(true);
  return c;
}

inline std::string Root() { return *CanonicalRoot(::testing::TempDir() + "/hostile-root"); }

// A store whose checkpoint files live under the test's temporary directory.
inline ShardStoreOptions Options() {
  ShardStoreOptions o;
  o.checkpoint_root = Root();
  return o;
}

// Shard `shard` of `shards`, rooted like Options().
inline ShardStoreOptions Rooted(uint32_t shard = 0, uint32_t shards = 1) {
  ShardStoreOptions o = Options();
  o.shard_index = shard;
  o.num_shards = shards;
  return o;
}

// One-key ("a") table, push and pull of job "job".
inline absl::Status Init(ShardStore& store, const TableConfig& config, uint64_t attempt = 0,
                  std::vector<float> a = {1, 2, 3}, const std::string& job = "job") {
  InitTableRequest req;
  req.set_job(job);
  req.set_attempt(attempt);
  *req.mutable_config() = config;
  req.add_keys("a");
  InitTableResponse resp;
  return WaitFor([&](StatusCallback done) { store.InitTableAsync(req, {Floats(a)}, &resp, {}, done); });
}

inline absl::Status Push(ShardStore& store, uint64_t attempt, uint32_t worker, int64_t step, TensorBuffer grad,
                  PushResponse* resp = nullptr) {
  PushRequest req;
  req.set_job("job");
  req.set_attempt(attempt);
  req.set_worker(worker);
  req.set_step(step);
  req.add_keys("a");
  PushResponse local;
  return WaitFor([&](StatusCallback done) { store.PushAsync(req, {grad}, resp ? resp : &local, {}, done); });
}

inline absl::StatusOr<std::vector<float>> Pull(ShardStore& store, uint64_t attempt, int64_t min_version = 0,
                                               absl::Duration timeout = absl::Seconds(5),
                                               int64_t min_worker_steps = 0) {
  PullRequest req;
  req.set_job("job");
  req.set_attempt(attempt);
  req.set_min_version(min_version);
  req.set_min_worker_steps(min_worker_steps);
  req.add_keys("a");
  PullResponse resp;
  std::vector<TensorBuffer> values;
  absl::Status s = WaitFor([&](StatusCallback done) { store.PullAsync(req, &resp, &values, Within(timeout), done); });
  if (!s.ok()) return s;
  return ToFloats(values.at(0));
}

inline TableStats Stats(ShardStore& store) {
  StatsRequest req;
  req.set_job("job");
  StatsResponse resp;
  EXPECT_TRUE(WaitFor([&](StatusCallback done) { store.StatsAsync(req, &resp, {}, done); }).ok());
  return resp.tables_size() > 0 ? resp.tables(0) : TableStats();
}

}  // namespace testing_util
}  // namespace pstrain

#endif  // PSTRAIN_TABLE_SHARD_STORE_TESTING_H_
