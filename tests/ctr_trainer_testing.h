// The CTR loop's tests' data and specs (ctr_trainer_test, ctr_covering_test):
// planted Criteo-format data under a fresh data root, written once per test
// binary, and a DLRM job over it.
#ifndef PSTRAIN_TESTS_CTR_TRAINER_TESTING_H_
#define PSTRAIN_TESTS_CTR_TRAINER_TESTING_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/criteo_synth.h"
#include "worker/sparse_embeddings.h"
#include "worker/trainer.h"

namespace pstrain {

constexpr int kDim = 16;
// A second pass over a smaller file overfits (train loss falls below the
// Bayes log loss, test AUC drops), so the data is one pass of fresh examples.
constexpr int64_t kTrainExamples = 150000;

// The planted data under a fresh data root, written once per test binary.
struct CtrData {
  std::string root;
  CriteoSynthMeta meta;
};

inline const CtrData& Data() {
  static const CtrData* data = [] {
    auto* d = new CtrData;
    d->root = (std::filesystem::path(::testing::TempDir()) / "ctr_root").string();
    std::filesystem::create_directories(d->root);
    CriteoSynthOptions synth;
    synth.train_examples = kTrainExamples;
    synth.test_examples = 5000;
    synth.id_space.fill(50);
    synth.seed = 7;
    auto meta = WriteCriteoSynth(synth, d->root + "/train.tsv", d->root + "/test.tsv", d->root + "/meta.txt");
    EXPECT_TRUE(meta.ok()) << meta.status();
    if (meta.ok()) d->meta = *meta;
    return d;
  }();
  return *data;
}

inline std::vector<EmbeddingTableConfig> Tables(int dim) {
  std::vector<EmbeddingTableConfig> tables;
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    EmbeddingTableConfig table;
    table.set_name(absl::StrCat("c", f));
    table.set_dim(dim);
    table.mutable_optimizer()->set_kind(EmbeddingOptimizer::ADAGRAD);
    table.mutable_optimizer()->set_lr(0.05);
    tables.push_back(table);
  }
  return tables;
}

inline JobSpec CtrSpec(const std::string& name, int workers) {
  JobSpec spec;
  spec.name = name;
  spec.model = "dlrm";
  spec.data.format = "criteo";
  spec.data.dir = ".";  // the files lie in the data root itself
  spec.data.train_file = "train.tsv";
  spec.data.test_file = "test.tsv";
  spec.optimizer.set_kind(OptimizerConfig::ADAGRAD);
  spec.optimizer.set_lr(0.02);
  spec.consistency = ASYNC;
  spec.workers = workers;
  spec.shards = 2;
  spec.batch_size = 128;
  spec.epochs = 1;
  spec.seed = 7;
  spec.log_every_steps = 50;
  spec.embeddings.tables = Tables(kDim);
  for (int f = 0; f < kCriteoSparseFields; ++f) spec.embeddings.fields.push_back({f, PoolingSpec::kSum});
  return spec;
}

inline TrainerOptions Options(const JobSpec& spec, int rank) {
  TrainerOptions o;
  o.spec = spec;
  o.rank = rank;
  o.world_size = spec.workers;
  o.data_root = DataRoot{Data().root};
  o.write_weights = false;
  return o;
}

// Rows that look up in `rows`; subclasses say what an Update does.
class ForwardingRows : public EmbeddingRows {
 public:
  explicit ForwardingRows(EmbeddingRows* rows) : rows_(rows) {}
  absl::Status Lookup(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                      std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) override {
    return rows_->Lookup(step, unique_ids, rows, kind);
  }
  size_t num_tables() const override { return rows_->num_tables(); }
  int dim(size_t table) const override { return rows_->dim(table); }

 protected:
  EmbeddingRows* rows_;
};

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_CTR_TRAINER_TESTING_H_
