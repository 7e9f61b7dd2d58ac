// The per-row optimizers against references written independently: LibTorch's
// own torch::optim on a dense table whose untouched rows get zero gradients
// (SGD and Adagrad: exactly what a sparse update must equal), and the
// published formulas in double precision on tensors (SparseAdam's, fbgemm's
// row-wise Adagrad, FTRL-Proximal). Plus the initializer and the placement.
#include "embedding/row_math.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace pstrain {
namespace {

constexpr int kRows = 6, kDim = 8, kSteps = 5;

EmbeddingTableConfig Config(EmbeddingOptimizer::Kind kind, double lr) {
  EmbeddingTableConfig c;
  c.set_name("t");
  c.set_dim(kDim);
  c.mutable_optimizer()->set_kind(kind);
  c.mutable_optimizer()->set_lr(lr);
  EXPECT_TRUE(NormalizeEmbeddingConfig(&c).ok());
  return c;
}

// Step t touches rows {t % kRows, (t + 2) % kRows}: others get no gradient.
bool Touched(int step, int row) { return row == step % kRows || row == (step + 2) % kRows; }

// The sparse path: each touched row updated on its own with ApplyRowUpdate.
std::vector<float> RunSparse(const EmbeddingTableConfig& c, const at::Tensor& init, const at::Tensor& grads) {
  std::vector<float> w(init.data_ptr<float>(), init.data_ptr<float>() + kRows * kDim);
  std::vector<float> slots(static_cast<size_t>(kRows) * std::max(1, SlotFloats(c.optimizer().kind(), kDim)), 0.0f);
  const int ns = SlotFloats(c.optimizer().kind(), kDim);
  for (int r = 0; r < kRows; ++r) {
    std::vector<float> scratch(kDim);
    InitRow(c, 0, r, scratch.data(), slots.data() + r * ns);  // the slots' initial values
  }
  for (int t = 1; t <= kSteps; ++t) {
    for (int r = 0; r < kRows; ++r) {
      if (!Touched(t, r)) continue;
      const float* g = grads[t - 1][r].data_ptr<float>();
      EXPECT_TRUE(ApplyRowUpdate(c, t, g, 1.0, w.data() + r * kDim, slots.data() + r * ns));
    }
  }
  return w;
}

at::Tensor Grads() {
  at::Tensor g = at::randn({kSteps, kRows, kDim});
  for (int t = 1; t <= kSteps; ++t) {
    for (int r = 0; r < kRows; ++r) {
      if (!Touched(t, r)) g[t - 1][r].zero_();
    }
  }
  return g.contiguous();
}

std::vector<float> RunTorch(torch::optim::Optimizer& opt, at::Tensor& w, const at::Tensor& grads) {
  for (int t = 1; t <= kSteps; ++t) {
    w.mutable_grad() = grads[t - 1].clone();
    opt.step();
  }
  return std::vector<float>(w.data_ptr<float>(), w.data_ptr<float>() + kRows * kDim);
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << "element " << i;
}

TEST(RowMathTest, SgdAndAdagradMatchTorchOptimOnADenseTable) {
  at::manual_seed(1);
  const at::Tensor init = at::randn({kRows, kDim});
  const at::Tensor grads = Grads();
  {
    at::Tensor w = init.clone().set_requires_grad(true);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
    const std::vector<float> want = RunTorch(opt, w, grads);
    ExpectClose(RunSparse(Config(EmbeddingOptimizer::SGD, 0.1), init, grads), want, 1e-6);
  }
  {
    at::Tensor w = init.clone().set_requires_grad(true);
    torch::optim::Adagrad opt({w}, torch::optim::AdagradOptions(0.1));
    const std::vector<float> want = RunTorch(opt, w, grads);
    ExpectClose(RunSparse(Config(EmbeddingOptimizer::ADAGRAD, 0.1), init, grads), want, 1e-6);
  }
}

TEST(RowMathTest, LazyAdamIsSparseAdamAndLeavesUntouchedMomentsAlone) {
  at::manual_seed(2);
  const at::Tensor init = at::randn({kRows, kDim}, at::kDouble).to(at::kFloat);
  const at::Tensor grads = Grads();
  const EmbeddingTableConfig c = Config(EmbeddingOptimizer::LAZY_ADAM, 0.01);
  // torch.optim.SparseAdam (1.13) in double: moments and parameters change
  // only at the gradient's rows; bias correction uses the step count.
  at::Tensor w = init.to(at::kDouble), m = at::zeros_like(w), v = at::zeros_like(w);
  for (int t = 1; t <= kSteps; ++t) {
    for (int r = 0; r < kRows; ++r) {
      if (!Touched(t, r)) continue;
      at::Tensor g = grads[t - 1][r].to(at::kDouble);
      m[r] = m[r] + (g - m[r]) * (1 - 0.9);
      v[r] = v[r] + (g * g - v[r]) * (1 - 0.999);
      const double step_size = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
      w[r] = w[r] - step_size * m[r] / (v[r].sqrt() + 1e-8);
    }
  }
  at::Tensor wf = w.to(at::kFloat).contiguous();
  ExpectClose(RunSparse(c, init, grads), std::vector<float>(wf.data_ptr<float>(), wf.data_ptr<float>() + kRows * kDim),
              1e-5);
  // One update from zero moments: m = (1 - beta1) g, v = (1 - beta2) g^2
  // (the untouched rows above kept theirs: their values matched).
  std::vector<float> a(kDim, 1.0f), slots(2 * kDim, 0.0f), g(kDim, 0.5f);
  ASSERT_TRUE(ApplyRowUpdate(c, 1, g.data(), 1.0, a.data(), slots.data()));
  EXPECT_FLOAT_EQ(slots[0], 0.05f);              // m = 0.1 g
  EXPECT_NEAR(slots[kDim], 0.001 * 0.25, 1e-7);  // v = 0.001 g^2 (1 - beta2 in float)
}

TEST(RowMathTest, RowwiseAdagradKeepsOneAccumulatorPerRow) {
  const EmbeddingTableConfig c = Config(EmbeddingOptimizer::ROWWISE_ADAGRAD, 0.5);
  ASSERT_EQ(SlotFloats(c.optimizer().kind(), kDim), 1);
  std::vector<float> w(kDim, 1.0f), acc(1, 0.0f), g(kDim);
  for (int j = 0; j < kDim; ++j) g[j] = 0.25f * (j + 1);
  double want_acc = 0, mean_sq = 0;
  for (int j = 0; j < kDim; ++j) mean_sq += std::pow(0.25 * (j + 1), 2) / kDim;
  std::vector<double> want(kDim, 1.0);
  for (int t = 1; t <= 3; ++t) {
    ASSERT_TRUE(ApplyRowUpdate(c, t, g.data(), 1.0, w.data(), acc.data()));
    want_acc += mean_sq;
    for (int j = 0; j < kDim; ++j) want[j] -= 0.5 * 0.25 * (j + 1) / (std::sqrt(want_acc) + 1e-8);
  }
  EXPECT_NEAR(acc[0], want_acc, 1e-5);
  for (int j = 0; j < kDim; ++j) EXPECT_NEAR(w[j], want[j], 1e-5) << j;
}

TEST(RowMathTest, FtrlFollowsTheClosedFormAndL1MakesZeros) {
  EmbeddingTableConfig c = Config(EmbeddingOptimizer::FTRL, 0.1);
  c.mutable_optimizer()->set_ftrl_l1(0.01);
  c.mutable_optimizer()->set_ftrl_l2(0.1);
  std::vector<float> w(kDim, 0.0f), slots(2 * kDim, 0.0f), g(kDim);
  std::vector<double> z(kDim, 0), n(kDim, 0), ww(kDim, 0);
  for (int t = 1; t <= 4; ++t) {
    for (int j = 0; j < kDim; ++j) g[j] = (j % 2 == 0 ? 1.0f : 0.001f) * (t % 2 == 0 ? -1.0f : 1.0f) * (j + 1);
    ASSERT_TRUE(ApplyRowUpdate(c, t, g.data(), 1.0, w.data(), slots.data()));
    for (int j = 0; j < kDim; ++j) {
      const double gj = g[j], nn = n[j] + gj * gj;
      z[j] += gj - (std::sqrt(nn) - std::sqrt(n[j])) / 0.1 * ww[j];
      n[j] = nn;
      ww[j] = std::abs(z[j]) <= 0.01 ? 0 : -(z[j] - std::copysign(0.01, z[j])) / ((1 + std::sqrt(nn)) / 0.1 + 0.1);
    }
  }
  for (int j = 0; j < kDim; ++j) EXPECT_NEAR(w[j], ww[j], 1e-5) << j;
  EXPECT_EQ(w[1], 0.0f);  // gradients of 0.002 stay under l1: an exact zero
  EXPECT_NE(w[0], 0.0f);
}

TEST(RowMathTest, ANonFiniteResultLeavesTheRowAsItWas) {
  const EmbeddingTableConfig c = Config(EmbeddingOptimizer::ADAGRAD, 0.1);
  std::vector<float> w(kDim, 1.0f), sum(kDim, 0.0f), g(kDim, 1.0f);
  g[3] = std::nanf("");
  EXPECT_FALSE(ApplyRowUpdate(c, 1, g.data(), 1.0, w.data(), sum.data()));
  for (int j = 0; j < kDim; ++j) {
    EXPECT_EQ(w[j], 1.0f);
    EXPECT_EQ(sum[j], 0.0f);
  }
  g[3] = 1e30f;  // finite, but its square is not
  EXPECT_FALSE(ApplyRowUpdate(c, 1, g.data(), 1.0, w.data(), sum.data()));
  EXPECT_EQ(sum[0], 0.0f);
}

TEST(RowMathTest, TheFirstValueIsAFunctionOfTableIdAndSeedOnly) {
  EmbeddingTableConfig c = Config(EmbeddingOptimizer::SGD, 0.1);
  c.set_dim(64);
  c.mutable_initializer()->set_scale(0);  // the default again: 1/sqrt(64)
  ASSERT_TRUE(NormalizeEmbeddingConfig(&c).ok());
  const double bound = 1 / std::sqrt(64.0);
  std::vector<float> a(64), b(64), none;
  InitRow(c, TableSalt("t"), -123456789012345LL, a.data(), none.data());
  InitRow(c, TableSalt("t"), -123456789012345LL, b.data(), none.data());
  EXPECT_EQ(a, b);
  for (float x : a) EXPECT_LE(std::abs(x), bound);
  InitRow(c, TableSalt("u"), -123456789012345LL, b.data(), none.data());
  EXPECT_NE(a, b);  // another table
  c.set_seed(7);
  InitRow(c, TableSalt("t"), -123456789012345LL, b.data(), none.data());
  EXPECT_NE(a, b);  // another seed
  // Normal: mean 0, standard deviation `scale`, over many rows.
  c.mutable_initializer()->set_kind(EmbeddingInitializer::NORMAL);
  c.mutable_initializer()->set_scale(0.5);
  double s = 0, s2 = 0;
  for (int64_t id = 0; id < 2000; ++id) {
    InitRow(c, 1, id, a.data(), none.data());
    for (float x : a) s += x, s2 += x * x;
  }
  const double n = 2000.0 * 64, mean = s / n;
  EXPECT_NEAR(mean, 0, 0.01);
  EXPECT_NEAR(std::sqrt(s2 / n - mean * mean), 0.5, 0.01);
}

TEST(RowMathTest, IdsSpreadEvenlyOverVirtualShardsAndShards) {
  // Consecutive ids, the worst case for a weak hash.
  std::map<uint32_t, int> per_shard;
  for (int64_t id = 0; id < 30000; ++id) {
    const uint32_t v = VirtualShardOf(id, 1024);
    ASSERT_LT(v, 1024u);
    EXPECT_EQ(ShardOfId(id, 1024, 3), v % 3);
    ++per_shard[ShardOfId(id, 1024, 3)];
  }
  for (const auto& [shard, n] : per_shard) EXPECT_NEAR(n, 10000, 400) << "shard " << shard;
  EXPECT_LT(VirtualShardOf(std::numeric_limits<int64_t>::min(), 1024), 1024u);
}

TEST(RowMathTest, ConfigsOutOfRangeAreRefusedNamingTheField) {
  auto refused = [](EmbeddingTableConfig c, const std::string& field) {
    absl::Status s = NormalizeEmbeddingConfig(&c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  const EmbeddingTableConfig good = Config(EmbeddingOptimizer::SGD, 0.1);
  EmbeddingTableConfig c = good;
  c.set_dim(0);
  refused(c, "dim");
  c = good;
  c.set_name(std::string(65, 'x'));
  refused(c, "name");
  c = good;
  c.mutable_optimizer()->set_kind(static_cast<EmbeddingOptimizer::Kind>(99));
  refused(c, "optimizer");
  c = good;
  c.mutable_optimizer()->set_lr(std::nan(""));
  refused(c, "optimizer.lr");
  c = good;
  c.mutable_admission()->set_probability(1.5);
  refused(c, "admission.probability");
  c = good;
  c.mutable_eviction()->set_ttl_steps(-1);
  refused(c, "eviction.ttl_steps");
  c = good;
  c.set_virtual_shards(1 << 21);
  refused(c, "virtual_shards");
}

}  // namespace
}  // namespace pstrain
