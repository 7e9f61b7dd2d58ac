// ShardStore and gradients as they arrive over the wire: narrow dtypes
// (bfloat16, float16) widened on arrival and values narrowed on request,
// and gradients left in the pieces gRPC read them into. The table keeps
// float32 throughout; these tests check that nothing else changes.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

#include "table/shard_store.h"
#include "table/shard_store_testing.h"

namespace pstrain {
namespace {

using namespace testing_util;  // NOLINT

TensorBuffer Narrow(const std::vector<float>& v, DataType dtype) {
  return *NarrowFloat32(Floats(v), dtype);
}

// The wire dtypes: a float32 table takes bf16/fp16 gradients (widened on
// arrival, exactly) and hands its values out narrowed; nothing else changes.
TEST(ShardStoreWireTest, NarrowGradientsAreWidenedAndValuesNarrowedOnRequest) {
  const std::vector<float> grad = {0.5f, -1.25f, 3.0f};  // exact in both formats
  for (DataType dtype : {DT_BFLOAT16, DT_FLOAT16}) {
    ShardStore wide{ShardStoreOptions{}}, narrow{ShardStoreOptions{}};
    for (ShardStore* s : {&wide, &narrow}) {
      InitTableRequest init;
      init.set_job("job");
      *init.mutable_config() = Config(SYNC, 1, 0.1);
      init.add_keys("a");
      InitTableResponse r;
      ASSERT_TRUE(WaitFor([&](StatusCallback d) { s->InitTableAsync(init, {Floats({1.0f, 2.0f, 3.14159f})}, &r, {}, d); })
                      .ok());
    }
    PushPullRequest req;
    req.set_job("job");
    req.add_keys("a");
    PushPullResponse wide_resp, narrow_resp;
    std::vector<TensorBuffer> wide_values, narrow_values;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) {
                  wide.PushPullAsync(req, {Floats(grad)}, &wide_resp, &wide_values, {}, d);
                }).ok());
    req.set_value_dtype(dtype);
    ASSERT_TRUE(WaitFor([&](StatusCallback d) {
                  narrow.PushPullAsync(req, {Narrow(grad, dtype)}, &narrow_resp, &narrow_values, {}, d);
                }).ok());
    EXPECT_EQ(narrow_resp.push().applied(), 1u);
    // The update was the same (float32 state), the value comes back narrowed.
    ASSERT_EQ(narrow_values[0].dtype, dtype);
    EXPECT_EQ(narrow_values[0].nbytes, 6u);
    const std::vector<float> expect = ToFloats(wide_values[0]);
    std::vector<float> got(3);
    WidenElements(dtype, narrow_values[0].data, 3, got.data());
    std::vector<float> rounded(3);
    RoundThrough(dtype, expect.data(), 3, rounded.data());
    EXPECT_EQ(got, rounded);
    EXPECT_NE(expect[2], rounded[2]);  // 3.14159 - 0.3 is not exact in 16 bits
    // An in-process reader with float32 destinations gets the wire's values.
    PullRequest pull;
    pull.set_job("job");
    pull.add_keys("a");
    pull.set_value_dtype(dtype);
    PullResponse pulled;
    std::vector<TensorBuffer> dest = {Floats({0, 0, 0})};
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { narrow.PullAsync(pull, &pulled, &dest, {}, d); }).ok());
    EXPECT_EQ(ToFloats(dest[0]), rounded);
    // ... and with destinations of the wire dtype (a worker that widens on
    // its GPU), the narrowed values written into them.
    TensorBuffer narrow_dest = Narrow({0, 0, 0}, dtype);
    const uint8_t* narrow_at = narrow_dest.data;
    std::vector<TensorBuffer> narrow_dests = {narrow_dest};
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { narrow.PullAsync(pull, &pulled, &narrow_dests, {}, d); }).ok());
    ASSERT_EQ(narrow_dests[0].data, narrow_at) << "not written into the destination";
    std::vector<float> widened(3);
    WidenElements(dtype, narrow_at, 3, widened.data());
    EXPECT_EQ(widened, rounded);
    // Not a wire dtype: refused.
    pull.set_value_dtype(DT_INT64);
    absl::Status s = WaitFor([&](StatusCallback d) { narrow.PullAsync(pull, &pulled, &dest, {}, d); });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    wide.Shutdown();
    narrow.Shutdown();
  }
}

// Gradients left in the pieces they arrived in (what the gRPC service hands
// over: DecodeOptions.pieces) update a table exactly as the same bytes in
// one buffer do -- every optimizer, every consistency, narrow wires -- and
// meet the non-finite policy the same way.
TEST(ShardStorePiecesTest, GradientsInPiecesUpdateExactlyAsContiguousOnes) {
  std::mt19937 rng(11);
  const int n = 10'007;
  std::vector<float> start(n);
  for (int i = 0; i < n; ++i) start[i] = std::sin(0.01f * i);
  auto sgd = Config(ASYNC, 2, 0.1);
  sgd.mutable_optimizer()->set_momentum(0.9);
  sgd.mutable_optimizer()->set_nesterov(true);
  sgd.mutable_optimizer()->set_weight_decay(1e-3);
  auto adam = Config(ASYNC, 2, 0.01);
  adam.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  auto adagrad = Config(SSP, 2, 0.1);
  adagrad.mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  adagrad.set_staleness(3);
  auto sync = Config(SYNC, 2, 0.1);
  sync.mutable_optimizer()->set_momentum(0.9);
  for (const TableConfig& config : {sgd, adam, adagrad, sync}) {
    for (DataType wire : {DT_FLOAT32, DT_BFLOAT16}) {
      ShardStore whole{ShardStoreOptions{}}, pieces{ShardStoreOptions{}};
      ASSERT_TRUE(Init(whole, config, 0, start).ok());
      ASSERT_TRUE(Init(pieces, config, 0, start).ok());
      for (int step = 0; step < 4; ++step) {
        for (uint32_t worker = 0; worker < 2; ++worker) {
          std::vector<float> g(n);
          for (int i = 0; i < n; ++i) g[i] = std::cos(0.003f * i * (step + 1) + worker);
          TensorBuffer grad = Floats(g);
          if (wire != DT_FLOAT32) grad = *NarrowFloat32(grad, wire);
          ASSERT_TRUE(Push(whole, 0, worker, step, grad).ok());
          absl::Status s = Push(pieces, 0, worker, step, InPieces(grad, rng, 9000));
          ASSERT_TRUE(s.ok()) << s;
        }
        absl::StatusOr<std::vector<float>> a = Pull(whole, 0), b = Pull(pieces, 0);
        ASSERT_TRUE(a.ok() && b.ok());
        ASSERT_NE(*a, start);
        ASSERT_EQ(std::memcmp(a->data(), b->data(), n * sizeof(float)), 0)
            << config.ShortDebugString() << " wire " << DataTypeName(wire) << " step " << step;
      }
      whole.Shutdown();
      pieces.Shutdown();
    }
  }
}

TEST(ShardStorePiecesTest, NonFiniteGradientsInPiecesMeetThePolicy) {
  std::mt19937 rng(13);
  const int n = 4096;
  for (NonFinitePolicy policy : {NONFINITE_REJECT, NONFINITE_SKIP}) {
    for (int trial = 0; trial < 20; ++trial) {
      ShardStore store{ShardStoreOptions{}};
      TableConfig config = Config(ASYNC, 1, 0.1);
      config.set_nonfinite(policy);
      ASSERT_TRUE(Init(store, config, 0, std::vector<float>(n, 1.0f)).ok());
      std::vector<float> g(n, 0.5f);
      g[std::uniform_int_distribution<int>(0, n - 1)(rng)] = std::numeric_limits<float>::quiet_NaN();
      PushResponse resp;
      absl::Status s = Push(store, 0, 0, 0, InPieces(Floats(g), rng, 301), &resp);
      if (policy == NONFINITE_REJECT) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      } else {
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(resp.skipped_nonfinite(), 1u);
      }
      EXPECT_EQ(*Pull(store, 0), std::vector<float>(n, 1.0f));
      store.Shutdown();
    }
  }
}

// A narrow gradient with an Inf (fp16 overflows at 65520) meets the table's
// non-finite policy like a float32 one.
TEST(ShardStoreWireTest, NonFiniteNarrowGradientsAreCaught) {
  ShardStore store{ShardStoreOptions{}};
  InitTableRequest init;
  init.set_job("job");
  *init.mutable_config() = Config(ASYNC, 1, 0.1);
  init.mutable_config()->set_nonfinite(NONFINITE_REJECT);
  init.add_keys("a");
  InitTableResponse r;
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { store.InitTableAsync(init, {Floats({1, 2, 3})}, &r, {}, d); }).ok());
  PushRequest push;
  push.set_job("job");
  push.add_keys("a");
  PushResponse resp;
  absl::Status s = WaitFor([&](StatusCallback d) {
    store.PushAsync(push, {Narrow({1.0f, 1e6f, 1.0f}, DT_FLOAT16)}, &resp, {}, d);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  store.Shutdown();
}

}  // namespace
}  // namespace pstrain
