#include "worker/dlrm_model.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/binary_metrics.h"
#include "worker/criteo_data.h"
#include "worker/criteo_synth.h"
#include "worker/sparse_embeddings.h"

namespace pstrain {
namespace {

at::Tensor Param(Dlrm& model, const std::string& name) {
  const auto params = model.named_parameters();
  const at::Tensor* p = params.find(name);
  EXPECT_NE(p, nullptr) << name;
  return p == nullptr ? at::Tensor() : *p;
}

TEST(DlrmTest, ShapesAndSeededInit) {
  DlrmConfig config;
  config.sparse_fields = 3;
  config.dim = 4;
  config.bottom = {8};
  config.top = {5};
  auto a = Dlrm::Create(config);
  auto b = Dlrm::Create(config);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  // The top MLP reads x (dim) and the (3 + 1) 3 / 2 = 6 pairwise products.
  EXPECT_EQ(Param(**a, "top0.weight").sizes(), (at::IntArrayRef{5, 4 + 6}));
  EXPECT_EQ(Param(**a, "top1.weight").sizes(), (at::IntArrayRef{1, 5}));
  EXPECT_EQ(Param(**a, "bottom1.weight").sizes(), (at::IntArrayRef{4, 8}));
  for (const auto& p : (*a)->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), Param(**b, p.key()))) << p.key() << " differs for one seed";
  }
  config.seed = 2;
  auto c = Dlrm::Create(config);
  EXPECT_FALSE(at::equal(Param(**a, "top0.weight"), Param(**c, "top0.weight")));

  const at::Tensor dense = at::randn({7, 13});
  std::vector<at::Tensor> pooled(3, at::randn({7, 4}));
  auto logits = (*a)->Forward(dense, pooled);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->sizes(), (at::IntArrayRef{7}));
  pooled.pop_back();
  EXPECT_EQ((*a)->Forward(dense, pooled).status().code(), absl::StatusCode::kInvalidArgument);
  pooled.push_back(at::randn({6, 4}));
  EXPECT_EQ((*a)->Forward(dense, pooled).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*a)->Forward(at::randn({7, 12}), pooled).status().code(), absl::StatusCode::kInvalidArgument);
  config.bottom = {0};
  EXPECT_EQ(Dlrm::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

// With one top layer whose weights pick out one input column, the logit is
// that column: x's entries, then <T_i, T_j> for i < j in row-major order.
TEST(DlrmTest, TopReadsBottomOutputAndPairwiseDots) {
  DlrmConfig config;
  config.sparse_fields = 2;
  config.dim = 3;
  config.bottom = {};
  config.top = {};
  auto model = Dlrm::Create(config);
  ASSERT_TRUE(model.ok());
  const at::Tensor dense = at::randn({5, 13});
  const std::vector<at::Tensor> e = {at::randn({5, 3}), at::randn({5, 3})};
  at::Tensor x;
  {
    c10::NoGradGuard no_grad;
    x = at::relu(at::matmul(dense, Param(**model, "bottom0.weight").t()) + Param(**model, "bottom0.bias"));
  }
  const std::vector<at::Tensor> columns = {x.select(1, 0),    x.select(1, 1),    x.select(1, 2),
                                           (x * e[0]).sum(1), (x * e[1]).sum(1), (e[0] * e[1]).sum(1)};
  at::Tensor top_w = Param(**model, "top0.weight"), top_b = Param(**model, "top0.bias");
  for (size_t c = 0; c < columns.size(); ++c) {
    {
      c10::NoGradGuard no_grad;
      top_w.zero_();
      top_b.zero_();
      top_w[0][c] = 1.0;
    }
    auto logits = (*model)->Forward(dense, e);
    ASSERT_TRUE(logits.ok());
    EXPECT_TRUE(at::allclose(*logits, columns[c], 1e-5, 1e-5)) << "column " << c;
  }
}

absl::StatusOr<std::vector<CriteoBatch>> ReadAll(const std::string& path, int64_t batch_size) {
  auto reader = CriteoReader::Open(path, CriteoReaderOptions());
  if (!reader.ok()) return reader.status();
  std::vector<CriteoBatch> batches;
  while (true) {
    CriteoBatch batch;
    absl::Status s = (*reader)->ReadBatch(batch_size, &batch);
    if (!s.ok()) return s;
    if (batch.size() == 0) return batches;
    batches.push_back(std::move(batch));
  }
}

at::Tensor FromVector(const std::vector<float>& v, at::IntArrayRef shape) {
  return at::from_blob(const_cast<float*>(v.data()), shape, at::kFloat).clone();
}

// Trains Dlrm with its embeddings in LocalEmbeddingRows on planted-model
// data for one epoch and checks the held-out AUC.
//
// The data's size sets what any model can reach: the planted logit is
// mostly 26 per-id weights of sigma 0.2, and an id's weight is learnt only
// from its own examples. With 20k examples over 1000 ids per field even a
// count-based estimator (smoothed per-id click rates) reaches only ~0.65
// test AUC (Bayes 0.77); this DLRM ~0.59, memorising rare ids. So the test
// uses 50 ids per field and 100k examples (about 3 s on one core): DLRM
// reaches 0.726 (Bayes 0.780) with seed 7, 0.746 and 0.768 with seeds 8 and
// 9. The bound 0.70 holds under ATEN_CPU_CAPABILITY=default, avx2 and
// avx512 (each run by hand).
TEST(DlrmTest, LearnsPlantedCriteoModel) {
  at::set_num_threads(1);
  CriteoSynthOptions synth;
  synth.train_examples = 100000;
  synth.test_examples = 5000;
  synth.id_space.fill(50);
  synth.seed = 7;
  const std::string dir = ::testing::TempDir();
  auto meta = WriteCriteoSynth(synth, dir + "/dlrm_train.tsv", dir + "/dlrm_test.tsv", dir + "/dlrm_meta.txt");
  ASSERT_TRUE(meta.ok()) << meta.status();
  constexpr int64_t kBatch = 128;
  auto train = ReadAll(dir + "/dlrm_train.tsv", kBatch);
  auto test = ReadAll(dir + "/dlrm_test.tsv", 1024);
  ASSERT_TRUE(train.ok() && test.ok());

  DlrmConfig config;
  std::vector<EmbeddingTableConfig> tables;
  std::vector<SparseFieldConfig> fields;
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    EmbeddingTableConfig table;
    table.set_name(absl::StrCat("c", f));
    table.set_dim(config.dim);
    table.mutable_optimizer()->set_kind(EmbeddingOptimizer::ADAGRAD);
    table.mutable_optimizer()->set_lr(0.05);
    tables.push_back(table);
    fields.push_back({f, EmbeddingPooling::kSum});
  }
  auto rows = LocalEmbeddingRows::Create(tables);
  ASSERT_TRUE(rows.ok()) << rows.status();
  auto embeddings = SparseEmbeddings::Create(rows->get(), fields);
  ASSERT_TRUE(embeddings.ok());
  auto model = Dlrm::Create(config);
  ASSERT_TRUE(model.ok());
  torch::optim::Adagrad optimizer((*model)->parameters(), torch::optim::AdagradOptions(0.02));

  constexpr int64_t kWindow = 30;
  const int64_t steps = static_cast<int64_t>(train->size());  // one epoch
  double first = 0, last = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const CriteoBatch& batch = (*train)[step];
    std::vector<at::Tensor> pooled;
    ASSERT_TRUE((*embeddings)->Forward(step, batch, &pooled).ok());
    auto logits = (*model)->Forward(FromVector(batch.dense, {batch.size(), kCriteoDenseFields}), pooled);
    ASSERT_TRUE(logits.ok()) << logits.status();
    auto loss = DlrmLoss(*logits, FromVector(batch.labels, {batch.size()}));
    ASSERT_TRUE(loss.ok());
    optimizer.zero_grad();
    loss->backward();
    optimizer.step();
    ASSERT_TRUE((*embeddings)->Backward(step).ok());
    if (step < kWindow) first += loss->item<double>() / kWindow;
    if (step >= steps - kWindow) last += loss->item<double>() / kWindow;
  }

  std::vector<float> scores, labels;
  {
    c10::NoGradGuard no_grad;
    for (const CriteoBatch& batch : *test) {
      std::vector<at::Tensor> pooled;
      ASSERT_TRUE((*embeddings)->Forward(steps, batch, &pooled).ok());
      auto logits = (*model)->Forward(FromVector(batch.dense, {batch.size(), kCriteoDenseFields}), pooled);
      ASSERT_TRUE(logits.ok());
      const at::Tensor p = at::sigmoid(*logits).contiguous();
      scores.insert(scores.end(), p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
      labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
    }
  }
  auto auc = Auc(scores, labels);
  auto log_loss = LogLoss(scores, labels);
  ASSERT_TRUE(auc.ok() && log_loss.ok());
  std::cout << "train loss " << first << " -> " << last << "; test AUC " << *auc << " (Bayes " << meta->bayes_auc
            << "), log loss " << *log_loss << " (Bayes " << meta->bayes_log_loss << ")\n";
  EXPECT_LT(last, first - 0.02);
  EXPECT_GT(*auc, 0.70);
}

}  // namespace
}  // namespace pstrain
