#include "worker/sparse_embeddings.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/embedding_bag.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

namespace pstrain {
namespace {

// Rows as a function of (table, id, column), so a test knows every value;
// records what SparseEmbeddings asks for.
class FakeEmbeddingRows : public EmbeddingRows {
 public:
  explicit FakeEmbeddingRows(std::vector<int> dims) : dims_(std::move(dims)) {}
  static float Value(size_t t, int64_t id, int k) { return 0.1f * static_cast<float>(id % 13) + 0.01f * k + t; }

  absl::Status Lookup(int64_t step, const std::vector<std::vector<int64_t>>& ids,
                      std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) override {
    ++lookups;
    last_kind = kind;
    looked_up = ids;
    last_step = step;
    rows->assign(ids.size(), {});
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t id : ids[t]) {
        for (int k = 0; k < dims_[t]; ++k) (*rows)[t].push_back(Value(t, id, k));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Update(int64_t step, const std::vector<std::vector<int64_t>>& ids,
                      const std::vector<const float*>& grads) override {
    ++updates;
    last_step = step;
    pushed.clear();
    for (size_t t = 0; t < ids.size(); ++t) {
      for (size_t i = 0; i < ids[t].size(); ++i) {
        EXPECT_EQ(pushed[t].count(ids[t][i]), 0u) << "id " << ids[t][i] << " pushed twice";
        pushed[t][ids[t][i]].assign(grads[t] + i * dims_[t], grads[t] + (i + 1) * dims_[t]);
      }
    }
    pushed_tables = ids.size();
    return absl::OkStatus();
  }
  size_t num_tables() const override { return dims_.size(); }
  int dim(size_t table) const override { return dims_[table]; }

  int lookups = 0, updates = 0;
  int64_t last_step = -1;
  EmbeddingLookupKind last_kind = EmbeddingLookupKind::kTrain;
  size_t pushed_tables = 0;
  std::vector<std::vector<int64_t>> looked_up;
  std::map<size_t, std::map<int64_t, std::vector<float>>> pushed;

 private:
  std::vector<int> dims_;
};

// A batch of bags[f][i] = field f's ids of example i.
CriteoBatch MakeBatch(const std::vector<std::vector<std::vector<int64_t>>>& bags) {
  CriteoBatch batch;
  batch.Clear();
  const size_t b = bags.empty() ? 0 : bags[0].size();
  batch.labels.assign(b, 0.f);
  batch.dense.assign(b * kCriteoDenseFields, 0.f);
  for (size_t f = 0; f < bags.size(); ++f) {
    for (const auto& bag : bags[f]) {
      batch.sparse_ids[f].insert(batch.sparse_ids[f].end(), bag.begin(), bag.end());
      batch.sparse_offsets[f].push_back(static_cast<int64_t>(batch.sparse_ids[f].size()));
    }
  }
  return batch;
}

at::Tensor Rows(const std::vector<std::vector<float>>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size()), d = n ? static_cast<int64_t>(rows[0].size()) : 0;
  at::Tensor t = at::empty({n, d});
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < d; ++k) t[i][k] = rows[i][k];
  }
  return t;
}

TEST(SparseEmbeddingsTest, PoolsSumAndMeanAsByHand) {
  FakeEmbeddingRows rows({2});
  auto emb = SparseEmbeddings::Create(&rows, {{0, EmbeddingPooling::kSum}, {0, EmbeddingPooling::kMean}});
  ASSERT_TRUE(emb.ok()) << emb.status();
  // Example 0: ids 1 and 2; example 1: none; example 2: 1, 1 and -1.
  const std::vector<std::vector<int64_t>> bags = {{1, 2}, {}, {1, 1, -1}};
  CriteoBatch batch = MakeBatch({bags, bags});
  std::vector<at::Tensor> pooled;
  ASSERT_TRUE((*emb)->Forward(5, batch, &pooled).ok());
  ASSERT_EQ(pooled.size(), 2u);
  auto v = [](int64_t id, int k) { return FakeEmbeddingRows::Value(0, id, k); };
  std::vector<std::vector<float>> sum, mean;
  for (int k = 0; k < 2; ++k) {
    // -1 % 13 is -1 in C++: the missing id's row is as distinct as any.
    sum.push_back({v(1, k) + v(2, k), 0.f, 2 * v(1, k) + v(-1, k)});
    mean.push_back({(v(1, k) + v(2, k)) / 2, 0.f, (2 * v(1, k) + v(-1, k)) / 3});
  }
  EXPECT_TRUE(at::allclose(pooled[0], Rows(sum).t(), 1e-6, 1e-6)) << pooled[0];
  EXPECT_TRUE(at::allclose(pooled[1], Rows(mean).t(), 1e-6, 1e-6)) << pooled[1];
  EXPECT_EQ(rows.lookups, 1);
  EXPECT_EQ(rows.last_step, 5);
  ASSERT_EQ(rows.looked_up.size(), 1u);
  EXPECT_EQ(rows.looked_up[0], (std::vector<int64_t>{1, 2, -1}));
}

// Three fields over two tables, ids repeated within a bag, across examples
// and across fields: each distinct id is looked up once, and the gradient
// pushed for it equals the gradient of that row in a dense reference
// (embedding_bag over a full weight tensor holding the same rows).
using Bags = std::vector<std::vector<std::vector<int64_t>>>;

// Tables of `dims`, `fields` reading them, a batch of `bags`: every id looked
// up once, every field's pooled rows and every row's pushed gradient as
// at::embedding_bag over a dense table gives them. `fused`: the path
// expected.
void CheckAgainstEmbeddingBag(const std::vector<int>& dims, const std::vector<SparseFieldConfig>& fields,
                              const Bags& bags, bool fused) {
  FakeEmbeddingRows rows(dims);
  auto emb = SparseEmbeddings::Create(&rows, fields);
  ASSERT_TRUE(emb.ok()) << emb.status();
  EXPECT_EQ((*emb)->fused(), fused);
  CriteoBatch batch = MakeBatch(bags);
  std::vector<at::Tensor> pooled;
  ASSERT_TRUE((*emb)->Forward(11, batch, &pooled).ok());
  EXPECT_EQ(rows.lookups, 1);
  ASSERT_EQ(rows.looked_up.size(), dims.size());
  std::vector<std::set<int64_t>> distinct(dims.size());
  for (size_t f = 0; f < fields.size(); ++f) {
    for (const auto& bag : bags[f]) distinct[fields[f].table].insert(bag.begin(), bag.end());
  }
  for (size_t t = 0; t < dims.size(); ++t) {
    std::set<int64_t> seen(rows.looked_up[t].begin(), rows.looked_up[t].end());
    EXPECT_EQ(seen.size(), rows.looked_up[t].size()) << "table " << t << " looked an id up twice";
    EXPECT_EQ(seen, distinct[t]);
  }
  // Weights per output element make every row's gradient distinct.
  at::Tensor loss = at::zeros({});
  std::vector<at::Tensor> weights;
  for (size_t f = 0; f < pooled.size(); ++f) {
    weights.push_back(at::arange(pooled[f].numel(), at::kFloat).reshape(pooled[f].sizes()) * (f + 1.0) / 10.0);
    loss = loss + (pooled[f] * weights[f]).sum();
  }
  loss.backward();
  ASSERT_TRUE((*emb)->Backward(11).ok());
  EXPECT_EQ(rows.updates, 1);
  EXPECT_EQ(rows.pushed_tables, dims.size());

  // The dense reference: table t as a [distinct, dim] weight in sorted id
  // order (another order than the one under test).
  for (size_t t = 0; t < dims.size(); ++t) {
    if (distinct[t].empty()) {  // a table no field reads, or only empty bags
      EXPECT_TRUE(rows.pushed[t].empty()) << "table " << t;
      continue;
    }
    const std::vector<int64_t> sorted(distinct[t].begin(), distinct[t].end());
    std::vector<std::vector<float>> values;
    for (int64_t id : sorted) {
      values.push_back({});
      for (int k = 0; k < rows.dim(t); ++k) values.back().push_back(FakeEmbeddingRows::Value(t, id, k));
    }
    at::Tensor weight = Rows(values).requires_grad_(true);
    at::Tensor ref_loss = at::zeros({});
    for (size_t f = 0; f < fields.size(); ++f) {
      if (static_cast<size_t>(fields[f].table) != t) continue;
      std::vector<int64_t> index, offsets = {0};
      for (const auto& bag : bags[f]) {
        for (int64_t id : bag) index.push_back(std::lower_bound(sorted.begin(), sorted.end(), id) - sorted.begin());
        offsets.push_back(static_cast<int64_t>(index.size()));
      }
      const int64_t mode = fields[f].pooling == EmbeddingPooling::kMean ? 1 : 0;
      at::Tensor out = std::get<0>(at::embedding_bag(weight, at::tensor(index, at::kLong),
                                                     at::tensor(offsets, at::kLong), false, mode, false, {}, true));
      EXPECT_TRUE(at::allclose(out, pooled[f].detach(), 1e-6, 1e-6)) << "field " << f;
      ref_loss = ref_loss + (out * weights[f]).sum();
    }
    ref_loss.backward();
    for (size_t i = 0; i < sorted.size(); ++i) {
      ASSERT_EQ(rows.pushed[t].count(sorted[i]), 1u) << "table " << t << " id " << sorted[i];
      const std::vector<float>& got = rows.pushed[t][sorted[i]];
      for (int k = 0; k < rows.dim(t); ++k) {
        EXPECT_NEAR(got[k], weight.grad()[i][k].item<float>(), 1e-5) << "table " << t << " id " << sorted[i];
      }
    }
  }
}

const Bags kMultiHot = {
    {{7, 7, 3}, {3}, {}, {-1, 9}},
    {{4}, {4, 4, 4}, {8}, {}},
    {{9, 7}, {}, {3, 3}, {100}},
};
// Criteo's shape: one id per field and example (-1: missing).
const Bags kOneHot = {
    {{7}, {3}, {-1}, {9}},
    {{4}, {4}, {8}, {100}},
    {{9}, {7}, {3}, {3}},
};

TEST(SparseEmbeddingsTest, LooksUpEachIdOnceAndPushesSummedGradients) {
  // Tables of two dims, fields pooled two ways: one pooling per field.
  CheckAgainstEmbeddingBag({3, 2},
                           {{0, EmbeddingPooling::kSum}, {1, EmbeddingPooling::kMean}, {0, EmbeddingPooling::kMean}},
                           kMultiHot, /*fused=*/false);
}

TEST(SparseEmbeddingsTest, FusedPoolingMatchesOneEmbeddingBagPerField) {
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kMean}) {
    SCOPED_TRACE(pooling == EmbeddingPooling::kSum ? "sum" : "mean");
    const std::vector<SparseFieldConfig> fields = {{0, pooling}, {1, pooling}, {0, pooling}};
    CheckAgainstEmbeddingBag({3, 3}, fields, kMultiHot, /*fused=*/true);  // one embedding_bag
    CheckAgainstEmbeddingBag({3, 3}, fields, kOneHot, /*fused=*/true);    // a gather
    // Three tables, one unread: its update is empty.
    CheckAgainstEmbeddingBag({2, 2, 2}, {{2, pooling}, {0, pooling}, {2, pooling}}, kOneHot, /*fused=*/true);
  }
}

TEST(SparseEmbeddingsTest, TableWithNoIdsGivesZerosAndAnEmptyUpdate) {
  FakeEmbeddingRows rows({2, 4});
  auto emb = SparseEmbeddings::Create(&rows, {{0, EmbeddingPooling::kSum}, {1, EmbeddingPooling::kMean}});
  ASSERT_TRUE(emb.ok());
  CriteoBatch batch = MakeBatch({{{5}, {6}}, {{}, {}}});
  std::vector<at::Tensor> pooled;
  ASSERT_TRUE((*emb)->Forward(0, batch, &pooled).ok());
  ASSERT_EQ(pooled.size(), 2u);
  EXPECT_EQ(pooled[1].sizes(), (at::IntArrayRef{2, 4}));
  EXPECT_EQ(pooled[1].abs().sum().item<float>(), 0.f);
  (pooled[0].sum() + pooled[1].sum()).backward();
  ASSERT_TRUE((*emb)->Backward(0).ok());
  EXPECT_EQ(rows.pushed_tables, 2u);
  EXPECT_TRUE(rows.pushed[1].empty());
  EXPECT_EQ(rows.pushed[0][5], (std::vector<float>{1.f, 1.f}));
}

TEST(SparseEmbeddingsTest, FusedBatchWithNoIdsGivesZerosAndEmptyUpdates) {
  FakeEmbeddingRows rows({2, 2});
  auto emb = SparseEmbeddings::Create(&rows, {{0, EmbeddingPooling::kSum}, {1, EmbeddingPooling::kSum}});
  ASSERT_TRUE(emb.ok());
  ASSERT_TRUE((*emb)->fused());
  std::vector<at::Tensor> pooled;
  ASSERT_TRUE((*emb)->Forward(0, MakeBatch({{{}, {}}, {{}, {}}}), &pooled).ok());
  ASSERT_EQ(pooled.size(), 2u);
  for (const at::Tensor& p : pooled) {
    EXPECT_EQ(p.sizes(), (at::IntArrayRef{2, 2}));
    EXPECT_EQ(p.abs().sum().item<float>(), 0.f);
  }
  ASSERT_TRUE((*emb)->Backward(0).ok());
  EXPECT_EQ(rows.pushed_tables, 2u);
  EXPECT_TRUE(rows.pushed[0].empty() && rows.pushed[1].empty());
}

TEST(SparseEmbeddingsTest, UnreachedRowsPushZeros) {
  FakeEmbeddingRows rows({2});
  auto emb = SparseEmbeddings::Create(&rows, {{0, EmbeddingPooling::kSum}});
  ASSERT_TRUE(emb.ok());
  std::vector<at::Tensor> pooled;
  ASSERT_TRUE((*emb)->Forward(0, MakeBatch({{{5}}}), &pooled).ok());
  ASSERT_TRUE((*emb)->Backward(0).ok());  // no loss.backward(): no grad
  EXPECT_EQ(rows.pushed[0][5], (std::vector<float>{0.f, 0.f}));
  EXPECT_EQ((*emb)->Backward(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SparseEmbeddingsTest, EvaluateReadsOnlyAndPoolsAsForwardOutsideAutograd) {
  FakeEmbeddingRows rows({2});
  auto emb = SparseEmbeddings::Create(&rows, {{0, EmbeddingPooling::kMean}});
  ASSERT_TRUE(emb.ok());
  const CriteoBatch batch = MakeBatch({{{5, 6}, {7}}});
  std::vector<at::Tensor> trained, evaluated;
  ASSERT_TRUE((*emb)->Forward(3, batch, &trained).ok());
  EXPECT_EQ(rows.last_kind, EmbeddingLookupKind::kTrain);
  ASSERT_TRUE((*emb)->Backward(3).ok());
  ASSERT_TRUE((*emb)->Evaluate(4, batch, &evaluated).ok());
  EXPECT_EQ(rows.last_kind, EmbeddingLookupKind::kReadOnly);
  EXPECT_EQ(rows.last_step, 4);
  ASSERT_EQ(evaluated.size(), 1u);
  EXPECT_TRUE(at::equal(evaluated[0], trained[0].detach()));
  EXPECT_FALSE(evaluated[0].requires_grad());
  // Nothing to push after an evaluation.
  EXPECT_EQ((*emb)->Backward(4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rows.updates, 1);
}

TEST(SparseEmbeddingsTest, RefusesBadConfigsAndBatches) {
  FakeEmbeddingRows rows({2});
  EXPECT_EQ(SparseEmbeddings::Create(&rows, {{1, EmbeddingPooling::kSum}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SparseEmbeddings::Create(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto emb = SparseEmbeddings::Create(&rows, {{0, EmbeddingPooling::kSum}});
  ASSERT_TRUE(emb.ok());
  CriteoBatch batch = MakeBatch({{{1}, {2}}});
  batch.sparse_offsets[0] = {0, 2, 1};  // decreasing, and past the ids
  std::vector<at::Tensor> pooled;
  EXPECT_EQ((*emb)->Forward(0, batch, &pooled).code(), absl::StatusCode::kInvalidArgument);
  batch.sparse_offsets[0] = {0, 1};  // one example short
  EXPECT_EQ((*emb)->Forward(0, batch, &pooled).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.lookups, 0);
}

// LocalEmbeddingRows applies what the shard would: the table's optimizer
// (SGD here: w -= lr g) with grad_scale 1.
TEST(LocalEmbeddingRowsTest, UpdatesAsOneAsyncWorkersShard) {
  EmbeddingTableConfig config;
  config.set_name("t");
  config.set_dim(2);
  config.mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
  config.mutable_optimizer()->set_lr(0.5);
  auto local = LocalEmbeddingRows::Create({config});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->dim(0), 2);
  std::vector<std::vector<float>> before, after;
  ASSERT_TRUE((*local)->Lookup(0, {{3, -1}}, &before, EmbeddingLookupKind::kTrain).ok());
  const float grads[4] = {1.f, -2.f, 0.5f, 4.f};
  ASSERT_TRUE((*local)->Update(0, {{3, -1}}, {grads}).ok());
  ASSERT_TRUE((*local)->Lookup(1, {{3, -1}}, &after, EmbeddingLookupKind::kTrain).ok());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(after[0][i], before[0][i] - 0.5f * grads[i], 1e-6);
  // A read-only lookup sees the updated rows and zeros for an id never
  // trained, and creates no row for it.
  std::vector<std::vector<float>> read;
  ASSERT_TRUE((*local)->Lookup(2, {{-1, 99, 3}}, &read, EmbeddingLookupKind::kReadOnly).ok());
  EXPECT_EQ(std::vector<float>(read[0].begin(), read[0].begin() + 2), std::vector<float>(after[0].begin() + 2, after[0].end()));
  EXPECT_EQ(std::vector<float>(read[0].begin() + 2, read[0].begin() + 4), std::vector<float>(2, 0.0f));
  EXPECT_EQ(std::vector<float>(read[0].begin() + 4, read[0].end()), std::vector<float>(after[0].begin(), after[0].begin() + 2));
  EXPECT_EQ((*local)->table(0).Stats().rows, 2);
  EXPECT_EQ((*local)->Update(0, {}, {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pstrain
