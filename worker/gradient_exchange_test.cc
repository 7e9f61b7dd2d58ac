// The all-reduce exchange's handling of what the host no longer waits for
// (see AllReduceExchange::Settle): NaN and Inf in the averaged gradients
// under either policy, and clipping computed where the gradients are. A
// one-rank Gloo group over a real socket and the in-process store, as an
// all-reduce worker runs them. With a LibTorch that has fused SGD and Adam
// (2.4 on: make test-torch2) the step is decided on the device and a REJECT
// shows at the next Finish, Pull or Flush; with 1.13 the host checks at
// once. Both must keep the same promises, which is what these tests hold
// them to. Then the parameter server's exchange narrowing on the device.
#include "worker/gradient_exchange.h"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/match.h"
#include "collective/collective.h"
#include "common/partition_plan.h"
#include "common/torch_compat.h"
#include "table/shard_store.h"
#include "worker/device.h"
#include "worker/ps_client.h"

namespace pstrain {
namespace {

constexpr double kLr = 0.1;

class OneRank {
 public:
  // A constructor cannot ASSERT: a test asserts status() first.
  OneRank(NonFinitePolicy policy, double clip = 0, OptimizerConfig::Kind kind = OptimizerConfig::SGD) {
    status_ = Init(policy, clip, kind);
  }
  const absl::Status& status() const { return status_; }

  absl::Status Step(int64_t step, const std::vector<at::Tensor>& grads) {
    if (!status_.ok()) return status_;
    exchange_->BeginStep(step, kLr);
    for (size_t i = 0; i < grads.size(); ++i) exchange_->Offer(i, grads[i]);
    return exchange_->Finish();
  }
  std::vector<at::Tensor> Values() const { return {params_[0].clone(), params_[1].clone()}; }
  GradientExchange& exchange() { return *exchange_; }

 private:
  absl::Status Init(NonFinitePolicy policy, double clip, OptimizerConfig::Kind kind) {
    CollectiveOptions co;
    co.store = NewInMemoryStore();
    co.hostname = "127.0.0.1";
    auto c = CreateCollective(Collective::Backend::kGloo, co);
    if (!c.ok()) return c.status();
    collective_ = std::move(*c);
    ShardStoreOptions so;
    store_ = std::make_unique<ShardStore>(so);
    at::manual_seed(11);
    params_ = {at::randn({4, 3}), at::randn({5})};
    std::vector<ParameterSpec> specs = {{"w", {4, 3}, DT_FLOAT32}, {"b", {5}, DT_FLOAT32}};
    auto plan = MakePartitionPlan(specs, 1, 16);
    if (!plan.ok()) return plan.status();
    PsClientOptions po;
    po.job = "exchange-test";
    po.plan = *plan;
    auto ps = PsClient::Create(po, {store_.get()});
    if (!ps.ok()) return ps.status();
    ps_ = std::move(*ps);
    ExchangeOptions eo;
    eo.ps = ps_.get();
    eo.params = params_;
    eo.bucket_bytes = 20;  // a bucket per parameter
    eo.collective = collective_.get();
    eo.clip_grad_norm = clip;
    eo.local_store = store_.get();
    eo.job = po.job;
    auto e = MakeAllReduceExchange(eo);
    if (!e.ok()) return e.status();
    exchange_ = std::move(*e);
    TableConfig config;
    config.mutable_optimizer()->set_kind(kind);
    config.mutable_optimizer()->set_lr(kLr);
    if (kind == OptimizerConfig::SGD) config.mutable_optimizer()->set_momentum(0.9);
    config.set_consistency(SYNC);
    config.set_num_workers(1);
    config.set_nonfinite(policy);
    return exchange_->InitTables(config);
  }

  absl::Status status_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<PsClient> ps_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<GradientExchange> exchange_;
};

std::vector<at::Tensor> Grads(int seed) {
  at::manual_seed(seed);
  return {at::randn({4, 3}), at::randn({5})};
}

std::vector<at::Tensor> NonFinite() {
  std::vector<at::Tensor> g = Grads(99);
  g[0][1][2] = NAN;
  g[1][4] = INFINITY;
  return g;
}

bool Equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  return at::equal(a[0], b[0]) && at::equal(a[1], b[1]);
}

// The host's scan, which all-reduce on the CPU runs over the averaged
// gradients every step (and fp16's scaler over each gradient), tells what
// LibTorch's isfinite tells: every length around the vector width, the bad
// value first, in the middle and last (in the scalar tail), the extremes
// that are finite, other dtypes and layouts.
TEST(HostAllFiniteTest, AgreesWithLibTorchsIsfinite) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 1000, 4099}) {
      const at::Tensor clean = at::randn({n}).to(dtype);
      EXPECT_TRUE(HostAllFinite(clean)) << dtype << " n=" << n;
      for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
        for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
          if (n == 0) continue;
          at::Tensor t = clean.clone();
          t[at] = bad;
          ASSERT_FALSE(at::isfinite(t).all().item<bool>());
          EXPECT_FALSE(HostAllFinite(t)) << dtype << " n=" << n << " " << bad << " at " << at;
        }
      }
    }
  }
  // The largest finite values, the smallest subnormals, signed zeros.
  at::Tensor edges32 = at::tensor({3.4028235e38f, -3.4028235e38f, 1.4e-45f, -1.4e-45f, 0.0f, -0.0f});
  EXPECT_TRUE(HostAllFinite(edges32));
  EXPECT_TRUE(HostAllFinite(edges32.to(at::kDouble)));
  EXPECT_TRUE(HostAllFinite(at::tensor({1.7976931348623157e308, -4.9e-324})));
  // Not contiguous (a transposed view), and integers (always finite).
  at::Tensor m = at::randn({33, 17});
  m[32][0] = NAN;
  EXPECT_FALSE(HostAllFinite(m.t()));
  EXPECT_TRUE(HostAllFinite(at::randn({33, 17}).t()));
  EXPECT_TRUE(HostAllFinite(at::arange(100)));
}

// SKIP: the non-finite step changes nothing (values, momentum, Adam's
// moments and step count): training goes on exactly as if it had never
// been.
TEST(AllReduceExchangeTest, SkippedNonFiniteStepChangesNothing) {
  for (OptimizerConfig::Kind kind : {OptimizerConfig::SGD, OptimizerConfig::ADAM}) {
    SCOPED_TRACE(OptimizerConfig::Kind_Name(kind));
    OneRank run(NONFINITE_SKIP, 0, kind), ref(NONFINITE_SKIP, 0, kind);
    ASSERT_TRUE(run.status().ok()) << run.status();
    ASSERT_TRUE(ref.status().ok()) << ref.status();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(run.Step(2 * i, Grads(i)).ok());
      const std::vector<at::Tensor> before = run.Values();
      ASSERT_TRUE(run.Step(2 * i + 1, NonFinite()).ok());
      EXPECT_TRUE(Equal(run.Values(), before)) << "the skipped step " << 2 * i + 1 << " changed the values";
      ASSERT_TRUE(ref.Step(i, Grads(i)).ok());
    }
    ASSERT_TRUE(run.exchange().Pull().ok());
    EXPECT_TRUE(Equal(run.Values(), ref.Values())) << "a skipped step changed the optimizer's state";
  }
}

// REJECT: the job fails naming the step, at that step's Finish or, where
// the device decided, at the next call that settles (Finish, Pull, Flush);
// nothing of that step or any later one was applied, and every later call
// fails the same way.
TEST(AllReduceExchangeTest, RejectedNonFiniteStepFailsTheJobAndAppliesNothing) {
  for (int probe = 0; probe < 6; ++probe) {
    const OptimizerConfig::Kind kind = probe < 3 ? OptimizerConfig::SGD : OptimizerConfig::ADAMW;
    OneRank run(NONFINITE_REJECT, 0, kind);
    ASSERT_TRUE(run.status().ok()) << run.status();
    ASSERT_TRUE(run.Step(0, Grads(1)).ok());
    const std::vector<at::Tensor> before = run.Values();
    absl::Status s = run.Step(1, NonFinite());
    // Which path runs: the device's decides without telling the host now.
    EXPECT_EQ(s.ok(), kind == OptimizerConfig::SGD ? kHasFusedSgd : kHasFusedAdam) << s;
    if (s.ok()) {
      // Decided on the device: the next settling call tells.
      if (probe % 3 == 0) s = run.Step(2, Grads(2));
      if (probe % 3 == 1) s = run.exchange().Pull();
      if (probe % 3 == 2) s = run.exchange().Flush(2);
    }
    ASSERT_FALSE(s.ok()) << "probe " << probe << ": a NaN step went unreported";
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "step 1 have NaN or Inf")) << s;
    EXPECT_TRUE(Equal(run.Values(), before)) << "probe " << probe << ": something was applied after the NaN step";
    EXPECT_FALSE(run.exchange().Pull().ok()) << "the failure must stick";
  }
}

// Clipping on the gradients' device: the first SGD step moves each value by
// lr times the gradient scaled to the clip norm.
TEST(AllReduceExchangeTest, ClipsTheAveragedGradientsToTheNorm) {
  OneRank run(NONFINITE_REJECT, /*clip=*/0.5);
  ASSERT_TRUE(run.status().ok()) << run.status();
  const std::vector<at::Tensor> start = run.Values();
  const std::vector<at::Tensor> g = Grads(3);
  const double norm = std::sqrt(g[0].to(at::kDouble).square().sum().item<double>() +
                                g[1].to(at::kDouble).square().sum().item<double>());
  ASSERT_GT(norm, 0.5);
  ASSERT_TRUE(run.Step(0, g).ok());
  const double coef = 0.5 / (norm + 1e-6);
  const std::vector<at::Tensor> now = run.Values();
  for (size_t i = 0; i < g.size(); ++i) {
    at::Tensor expected = start[i].sub(g[i], kLr * coef);
    EXPECT_TRUE(at::allclose(now[i], expected, 1e-5, 1e-6)) << "parameter " << i << " differs by "
                                                            << now[i].sub(expected).abs().max().item<double>();
  }
  // A norm below the clip leaves the gradient alone.
  OneRank small(NONFINITE_REJECT, /*clip=*/10 * norm);
  ASSERT_TRUE(small.status().ok()) << small.status();
  const std::vector<at::Tensor> s0 = small.Values();
  ASSERT_TRUE(small.Step(0, g).ok());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(at::allclose(small.Values()[i], s0[i].sub(g[i], kLr), 1e-6, 1e-7));
}

// A parameter server worker's exchange against two in-process shards, its
// gradients narrowed for a bf16/fp16 wire by the PsClient on the host, or by
// the exchange where the parameters live (narrow_on_device: what a GPU
// worker does, run here on the CPU with the same tensor operations).
class PsRank {
 public:
  PsRank(DataType wire, bool error_feedback, bool narrow_on_device, c10::Device device = c10::Device(c10::kCPU))
      : device_(device) {
    status_ = Init(wire, error_feedback, narrow_on_device);
  }
  const absl::Status& status() const { return status_; }
  absl::Status Step(int64_t step, const std::vector<at::Tensor>& grads) {
    if (!status_.ok()) return status_;
    exchange_->BeginStep(step, kLr);
    for (size_t i = 0; i < grads.size(); ++i) exchange_->Offer(i, grads[i].to(device_));
    return exchange_->Finish();
  }
  std::vector<at::Tensor> Values() const {
    std::vector<at::Tensor> out;
    for (const auto& p : params_) out.push_back(p.to(c10::kCPU, /*non_blocking=*/false, /*copy=*/true));
    return out;
  }
  GradientExchange& exchange() { return *exchange_; }
  ~PsRank() {
    for (auto& s : shards_) s->Shutdown();
  }

 private:
  absl::Status Init(DataType wire, bool error_feedback, bool narrow_on_device) {
    at::manual_seed(5);
    params_ = {at::randn({4, 3}).to(device_), at::randn({5}).to(device_), at::randn({6}).to(device_)};
    std::vector<ParameterSpec> specs = {
        {"w", {4, 3}, DT_FLOAT32}, {"b", {5}, DT_FLOAT32}, {"c", {6}, DT_FLOAT32}};
    auto plan = MakePartitionPlan(specs, 2, 16);  // chunks of 4 values over 2 shards
    if (!plan.ok()) return plan.status();
    for (int i = 0; i < 2; ++i) shards_.push_back(std::make_unique<ShardStore>(ShardStoreOptions{}));
    PsClientOptions po;
    po.job = "ps-exchange-test";
    po.plan = *plan;
    po.wire_dtype = wire;
    po.error_feedback = error_feedback;
    po.max_request_bytes = 20;  // several requests per shard and bucket
    po.max_in_flight_per_shard = 1;
    auto ps = PsClient::Create(po, {shards_[0].get(), shards_[1].get()});
    if (!ps.ok()) return ps.status();
    ps_ = std::move(*ps);
    ExchangeOptions eo;
    eo.ps = ps_.get();
    eo.params = params_;
    eo.device = device_;
    eo.bucket_bytes = 40;  // buckets {c, b} and {w}
    eo.wire_dtype = wire == DT_BFLOAT16 ? at::kBFloat16 : wire == DT_FLOAT16 ? at::kHalf : at::kFloat;
    eo.narrow_on_device = narrow_on_device;
    eo.error_feedback = error_feedback;
    eo.job = po.job;
    exchange_ = MakePsExchange(eo);
    TableConfig config;
    config.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    config.mutable_optimizer()->set_lr(kLr);
    config.mutable_optimizer()->set_momentum(0.9);
    config.set_consistency(ASYNC);
    config.set_num_workers(1);
    config.set_nonfinite(NONFINITE_SKIP);
    return exchange_->InitTables(config);
  }

  const c10::Device device_;
  absl::Status status_;
  std::vector<std::unique_ptr<ShardStore>> shards_;
  std::unique_ptr<PsClient> ps_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<GradientExchange> exchange_;
};

// Gradients at several scales (so rounding loses something different each
// step), and at step 3 values beyond float16's range (Inf on an fp16 wire:
// the shards skip that step, and no residual may be carried from it).
std::vector<at::Tensor> PsGrads(int step) {
  at::manual_seed(100 + step);
  const double scale = std::pow(10.0, step % 5 - 2);
  std::vector<at::Tensor> g = {at::randn({4, 3}).mul(scale), at::randn({5}).mul(scale), at::randn({6}).mul(scale)};
  if (step == 3) {
    g[0][2][1] = 7e4;
    g[2][5] = -1e5;
  }
  return g;
}

bool AllEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

// Narrowing on the device (here the CPU) and narrowing on the host reach
// the same bits after every step, with and without error feedback, for
// both wire dtypes -- and a narrow wire does change the result, so the
// comparison is not between two runs that never narrowed.
TEST(PsExchangeTest, NarrowingOnTheDeviceGivesTheHostsBits) {
  for (DataType wire : {DT_BFLOAT16, DT_FLOAT16}) {
    for (bool feedback : {false, true}) {
      SCOPED_TRACE(::testing::Message() << DataTypeName(wire) << (feedback ? " with" : " without")
                                        << " error feedback");
      PsRank host(wire, feedback, /*narrow_on_device=*/false);
      PsRank device(wire, feedback, /*narrow_on_device=*/true);
      PsRank wide(DT_FLOAT32, false, /*narrow_on_device=*/true);
      ASSERT_TRUE(host.status().ok()) << host.status();
      ASSERT_TRUE(device.status().ok()) << device.status();
      ASSERT_TRUE(wide.status().ok()) << wide.status();
      EXPECT_FALSE(host.exchange().narrows_on_device());
      EXPECT_TRUE(device.exchange().narrows_on_device());
      EXPECT_FALSE(wide.exchange().narrows_on_device()) << "nothing to narrow on a float32 wire";
      ASSERT_TRUE(AllEqual(host.Values(), device.Values())) << "the initial pull differs";
      for (int step = 0; step < 8; ++step) {
        const std::vector<at::Tensor> g = PsGrads(step);
        ASSERT_TRUE(host.Step(step, g).ok());
        ASSERT_TRUE(device.Step(step, g).ok());
        ASSERT_TRUE(wide.Step(step, g).ok());
        ASSERT_TRUE(AllEqual(host.Values(), device.Values())) << "after step " << step;
      }
      EXPECT_FALSE(AllEqual(host.Values(), wide.Values())) << "the narrow wire changed nothing";
      // Pull (fp32 staging) agrees with what the steps left.
      const std::vector<at::Tensor> before = device.Values();
      ASSERT_TRUE(device.exchange().Pull().ok());
      EXPECT_TRUE(AllEqual(device.Values(), before));
    }
  }
}

// The same on a GPU: narrowed on the device (its rounding, its streams,
// pinned buffers, the values widened there) against the host's narrowing of
// the same gradients -- the same bits.
TEST(PsExchangeTest, NarrowingOnTheGpuGivesTheHostsBits) {
  if (CudaDevices() == 0) {
    GTEST_SKIP() << "no CUDA device: this LibTorch has no CUDA (Debian's 1.13 is CPU-only) or the machine no GPU "
                    "or driver; tools/gpu/run.sh runs this test on a GPU machine";
  }
  for (DataType wire : {DT_BFLOAT16, DT_FLOAT16}) {
    for (bool feedback : {false, true}) {
      SCOPED_TRACE(::testing::Message() << DataTypeName(wire) << (feedback ? " with" : " without")
                                        << " error feedback");
      PsRank host(wire, feedback, /*narrow_on_device=*/false);
      PsRank gpu(wire, feedback, /*narrow_on_device=*/true, c10::Device(c10::kCUDA, 0));
      ASSERT_TRUE(host.status().ok()) << host.status();
      ASSERT_TRUE(gpu.status().ok()) << gpu.status();
      EXPECT_TRUE(gpu.exchange().narrows_on_device());
      ASSERT_TRUE(AllEqual(host.Values(), gpu.Values())) << "the initial pull differs";
      for (int step = 0; step < 8; ++step) {
        const std::vector<at::Tensor> g = PsGrads(step);
        ASSERT_TRUE(host.Step(step, g).ok());
        ASSERT_TRUE(gpu.Step(step, g).ok());
        ASSERT_TRUE(AllEqual(host.Values(), gpu.Values())) << "after step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace pstrain
