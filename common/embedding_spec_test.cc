// The job spec's `embeddings:` (common/embedding_spec.h) and the rules tying
// it to `model: dlrm` and `data.format: criteo`.
#include "common/embedding_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace pstrain {
namespace {

constexpr char kHead[] = R"(
model: dlrm
seed: 11
data: {format: criteo, dir: criteo, train_file: train.tsv.gz, test_file: test.tsv}
)";

// A spec with kHead's model and data, `extra` top-level lines and `tables`.
std::string Spec(const std::string& tables, const std::string& extra = "") {
  return absl::StrCat(kHead, extra, "embeddings:\n", tables);
}

// The message of a spec's refusal ("" when it parses).
std::string Refusal(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

TEST(EmbeddingSpecTest, AFullTableParsesIntoItsConfig) {
  auto spec = ParseJobSpec(Spec(R"(
  tables:
    - name: shared
      dim: 16
      optimizer: {kind: ftrl, lr: 0.05, eps: 0.001, beta1: 0.5, beta2: 0.6, initial_accumulator_value: 0.1,
                  ftrl_beta: 2, ftrl_l1: 0.01, ftrl_l2: 0.02}
      initializer: {kind: normal, scale: 0.01}
      admission: {min_count: 2, probability: 0.5}
      eviction: {ttl_steps: 100, max_memory_mb: 64}
      seed: 7
      virtual_shards: 512
      nonfinite: skip
)"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->embeddings.tables.size(), 1u);
  const EmbeddingTableConfig& t = spec->embeddings.tables[0];
  EXPECT_EQ(t.name(), "shared");
  EXPECT_EQ(t.dim(), 16u);
  EXPECT_EQ(t.optimizer().kind(), EmbeddingOptimizer::FTRL);
  EXPECT_DOUBLE_EQ(t.optimizer().lr(), 0.05);
  EXPECT_DOUBLE_EQ(t.optimizer().eps(), 0.001);
  EXPECT_DOUBLE_EQ(t.optimizer().beta1(), 0.5);
  EXPECT_DOUBLE_EQ(t.optimizer().beta2(), 0.6);
  EXPECT_DOUBLE_EQ(t.optimizer().initial_accumulator_value(), 0.1);
  EXPECT_DOUBLE_EQ(t.optimizer().ftrl_beta(), 2);
  EXPECT_DOUBLE_EQ(t.optimizer().ftrl_l1(), 0.01);
  EXPECT_DOUBLE_EQ(t.optimizer().ftrl_l2(), 0.02);
  EXPECT_EQ(t.initializer().kind(), EmbeddingInitializer::NORMAL);
  EXPECT_DOUBLE_EQ(t.initializer().scale(), 0.01);
  EXPECT_EQ(t.admission().min_count(), 2u);
  EXPECT_DOUBLE_EQ(t.admission().probability(), 0.5);
  EXPECT_EQ(t.eviction().ttl_steps(), 100);
  EXPECT_EQ(t.eviction().max_memory_mb(), 64u);
  EXPECT_EQ(t.seed(), 7u);
  EXPECT_EQ(t.virtual_shards(), 512u);
  EXPECT_EQ(t.nonfinite(), NONFINITE_SKIP);
  EXPECT_EQ(spec->data.train_file, "train.tsv.gz");
  EXPECT_EQ(spec->data.test_file, "test.tsv");
  EXPECT_TRUE(CheckDataFileNames(*spec).ok());
  // One table and no `fields`: every sparse field reads it, summed.
  ASSERT_EQ(spec->embeddings.fields.size(), 26u);
  for (const EmbeddingFieldSpec& f : spec->embeddings.fields) {
    EXPECT_EQ(f.table, 0);
    EXPECT_EQ(f.pooling, PoolingSpec::kSum);
  }
}

TEST(EmbeddingSpecTest, DefaultsAreFilled) {
  auto spec = ParseJobSpec(Spec("  tables: [{name: t, dim: 8}]\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const EmbeddingTableConfig& t = spec->embeddings.tables[0];
  EXPECT_EQ(t.optimizer().kind(), EmbeddingOptimizer::SGD);
  EXPECT_DOUBLE_EQ(t.optimizer().lr(), 0.05);
  EXPECT_EQ(t.initializer().kind(), EmbeddingInitializer::UNIFORM);
  EXPECT_EQ(t.initializer().scale(), 0);  // 1/sqrt(dim), filled by NormalizeEmbeddingConfig
  EXPECT_EQ(t.admission().min_count(), 0u);
  EXPECT_EQ(t.eviction().max_memory_mb(), 0u);
  EXPECT_EQ(t.seed(), 11u);  // the job's
  EXPECT_EQ(t.virtual_shards(), 1024u);
  EXPECT_EQ(t.nonfinite(), NONFINITE_REJECT);
  EXPECT_EQ(spec->min_workers, spec->workers);
}

TEST(EmbeddingSpecTest, TwentySixTablesAreReadFieldByField) {
  std::string tables = "  tables:\n";
  for (int i = 0; i < 26; ++i) absl::StrAppend(&tables, "    - {name: c", i, ", dim: 4}\n");
  auto spec = ParseJobSpec(Spec(tables));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->embeddings.fields.size(), 26u);
  for (int f = 0; f < 26; ++f) {
    EXPECT_EQ(spec->embeddings.fields[f].table, f);
    EXPECT_EQ(spec->embeddings.fields[f].pooling, PoolingSpec::kSum);
  }
}

// Two tables: `fields` lists 26 entries, names or {table, pooling}.
std::string TwoTables(const std::string& last_field) {
  std::string fields = "  fields: [";
  for (int f = 0; f < 24; ++f) absl::StrAppend(&fields, f % 2 ? "b" : "a", ", ");
  absl::StrAppend(&fields, "{table: b, pooling: mean}, ", last_field, "]\n");
  return Spec("  tables: [{name: a, dim: 8}, {name: b, dim: 4, optimizer: {kind: rowwise_adagrad, lr: 0.1}}]\n" +
              fields);
}

TEST(EmbeddingSpecTest, FieldsNameTablesAndPooling) {
  auto spec = ParseJobSpec(TwoTables("a"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto& fields = spec->embeddings.fields;
  ASSERT_EQ(fields.size(), 26u);
  EXPECT_EQ(fields[0].table, 0);
  EXPECT_EQ(fields[1].table, 1);
  EXPECT_EQ(fields[24].table, 1);
  EXPECT_EQ(fields[24].pooling, PoolingSpec::kMean);
  EXPECT_EQ(fields[25].table, 0);
  EXPECT_EQ(fields[25].pooling, PoolingSpec::kSum);
  EXPECT_EQ(spec->embeddings.tables[1].optimizer().kind(), EmbeddingOptimizer::ROWWISE_ADAGRAD);
}

TEST(EmbeddingSpecTest, EachRefusalNamesItsField) {
  const std::string one = "  tables: [{name: t, dim: 8}]\n";
  const std::string table = "  tables:\n    - {name: t, dim: 8}\n    - name: u\n      dim: 8\n";
  struct Case {
    std::string yaml;
    std::string field;
  };
  const Case cases[] = {
      {Spec(table + "      optimizer: {kind: adam}\n"), "embeddings.tables[1].optimizer.kind is 'adam'"},
      {Spec(table + "      optimizer: {lr: 0}\n"), "embeddings.tables[1].optimizer.lr"},
      {Spec(table + "      optimizer: {beta1: 1}\n"), "embeddings.tables[1].optimizer.beta1"},
      {Spec(table + "      optimizer: {momentum: 0.9}\n"), "embeddings.tables[1].optimizer.momentum is not a known"},
      {Spec(table + "      initializer: {kind: ones}\n"), "embeddings.tables[1].initializer.kind"},
      {Spec(table + "      initializer: {scale: -1}\n"), "embeddings.tables[1].initializer.scale"},
      {Spec(table + "      admission: {min_count: 70000}\n"), "embeddings.tables[1].admission.min_count"},
      {Spec(table + "      admission: {probability: 2}\n"), "embeddings.tables[1].admission.probability"},
      {Spec(table + "      eviction: {ttl_steps: -1}\n"), "embeddings.tables[1].eviction.ttl_steps"},
      {Spec(table + "      eviction: {max_memory_mb: -1}\n"), "embeddings.tables[1].eviction.max_memory_mb"},
      {Spec(table + "      virtual_shards: 0\n"), "embeddings.tables[1].virtual_shards"},
      {Spec(table + "      nonfinite: ignore\n"), "embeddings.tables[1].nonfinite is 'ignore'"},
      {Spec(table + "      pooling: sum\n"), "embeddings.tables[1].pooling is not a known field"},
      {Spec(table + "      seed: x\n"), "embeddings.tables[1].seed has the wrong type"},
      {Spec("  tables: [{name: t, dim: 0}]\n"), "embeddings.tables[0].dim must be in 1..4096"},
      {Spec("  tables: [{name: t, dim: 4097}]\n"), "embeddings.tables[0].dim must be in 1..4096"},
      {Spec("  tables: [{name: t}]\n"), "embeddings.tables[0].dim is needed"},
      {Spec("  tables: [{name: 'a b', dim: 4}]\n"), "embeddings.tables[0].name is 'a b'"},
      {Spec("  tables: [{dim: 4}]\n"), "embeddings.tables[0].name"},
      {Spec(absl::StrCat("  tables: [{name: ", std::string(65, 'x'), ", dim: 4}]\n")), "embeddings.tables[0].name"},
      {Spec("  tables: [{name: t, dim: 4}, {name: t, dim: 4}]\n"), "embeddings.tables[1].name 't' names another"},
      {Spec("  tables: []\n"), "embeddings.tables must list 1..64 tables"},
      {Spec("  tables: [t]\n"), "embeddings.tables[0] must be a mapping"},
      {Spec("  fields: [t]\n"), "embeddings.tables must list 1..64 tables"},
      {Spec(one + "  other: 1\n"), "embeddings.other is not a known field"},
      {Spec("  tables: [{name: a, dim: 4}, {name: b, dim: 4}]\n"), "embeddings.fields is needed with 2 tables"},
      {Spec(one + "  fields: [t, t]\n"), "embeddings.fields must list 26 entries"},
      {TwoTables("c"), "embeddings.fields[25] is 'c': not one of"},
      {TwoTables("{table: c}"), "embeddings.fields[25].table is 'c'"},
      {TwoTables("{table: a, pooling: max}"), "embeddings.fields[25].pooling is 'max'"},
      {TwoTables("{pooling: sum}"), "embeddings.fields[25].table is needed"},
      {TwoTables("{table: a, weight: 1}"), "embeddings.fields[25].weight is not a known field"},
      {TwoTables("[a]"), "embeddings.fields[25] must be a table's name"},
      {Spec("  tables: [{name: a, dim: 4}, {name: b, dim: 4}]\n  fields: [a, a, a, a, a, a, a, a, a, a, a, a, a, "
            "a, a, a, a, a, a, a, a, a, a, a, a, a]\n"),
       "embeddings.tables[1] ('b') is read by no field"},
      {"embeddings: [1]\n", "embeddings must be a mapping"},
  };
  for (const Case& c : cases) {
    EXPECT_NE(Refusal(c.yaml).find(c.field), std::string::npos)
        << "want '" << c.field << "' in: " << Refusal(c.yaml) << "\n" << c.yaml;
  }
}

TEST(EmbeddingSpecTest, CrossFieldRulesNameTheirField) {
  const std::string tables = "embeddings: {tables: [{name: t, dim: 4}]}\n";
  const std::string criteo = "data: {format: criteo, train_file: train.tsv}\n";
  struct Case {
    std::string yaml;
    std::string field;
  };
  const Case cases[] = {
      {"model: dlrm\n" + tables, "model dlrm needs data.format: criteo"},
      {"model: dlrm\n" + criteo, "model dlrm needs embeddings"},
      {"model: mlp\n" + criteo + tables, "embeddings are read only by model: dlrm"},
      {"model: mlp\n" + criteo, "data.format criteo is read only by model: dlrm"},
      {"model: dlrm\ndata: {format: criteo}\n" + tables, "data.train_file is needed for format criteo"},
      {"model: dlrm\nmode: allreduce\nshards: 0\nconsistency: sync\n" + criteo + tables,
       "shards must be in 1..1024 in allreduce mode with embeddings"},
      {"model: dlrm\nworkers: 3\nmin_workers: 2\nclip_grad_norm: 1\naccumulate_steps: 2\nconsistency: sync\n" +
           criteo + tables,
       "min_workers must equal workers in a sync job with embeddings, clip_grad_norm and accumulate_steps"},
      {"model: dlrm\nmode: allreduce\nshards: 2\nworkers: 3\nmin_workers: 2\nconsistency: sync\n" + criteo + tables,
       "min_workers must equal workers"},
      {"model: dlrn\n", "model 'dlrn' is unknown: use mlp, mlp_wide, mlp_deep, lenet, dlrm"},
      {"model: torchscript:ctr.pt\ndata: {format: idx}\n" + tables, "data.format must be criteo for a model with embeddings"},
      {"data: {format: tsv}\n", "data.format must be idx, csv, synthetic or criteo"},
      {"checkpoint_incremental: 2\n", "checkpoint_incremental is for jobs with embeddings"},
      {"model: dlrm\ncheckpoint_incremental: 33\n" + criteo + tables, "checkpoint_incremental must be in 0..32"},
      {"model: dlrm\ncheckpoint_incremental: -1\n" + criteo + tables, "checkpoint_incremental must be in 0..32"},
  };
  for (const Case& c : cases) {
    EXPECT_NE(Refusal(c.yaml).find(c.field), std::string::npos)
        << "want '" << c.field << "' in: " << Refusal(c.yaml) << "\n" << c.yaml;
  }
  // A ps job goes on without a lost worker (the shards wait for no vacant
  // rank; sync: the others cover its batches).
  EXPECT_TRUE(ParseJobSpec("model: dlrm\nworkers: 3\nmin_workers: 2\nconsistency: sync\n" + criteo + tables).ok());
  EXPECT_TRUE(
      ParseJobSpec("model: dlrm\nworkers: 3\nmin_workers: 2\nclip_grad_norm: 1\nconsistency: sync\n" + criteo + tables)
          .ok());
  EXPECT_TRUE(ParseJobSpec("model: dlrm\nworkers: 3\nshards: 2\nreplicas: 1\nmin_workers: 2\nconsistency: sync\n" +
                           criteo + tables)
                  .ok());
  EXPECT_TRUE(ParseJobSpec("model: dlrm\nworkers: 3\nmin_workers: 2\nconsistency: async\n" + criteo + tables).ok());
  EXPECT_TRUE(
      ParseJobSpec("model: dlrm\nworkers: 3\nmin_workers: 2\nconsistency: ssp\nstaleness: 2\n" + criteo + tables).ok());
  // Periodic checkpoints of an embedding job: allowed (the shards save its rows).
  EXPECT_TRUE(ParseJobSpec("model: dlrm\ncheckpoint_every_steps: 100\n" + criteo + tables).ok());
  auto incremental = ParseJobSpec("model: dlrm\ncheckpoint_incremental: 4\n" + criteo + tables);
  ASSERT_TRUE(incremental.ok()) << incremental.status();
  EXPECT_EQ(incremental->checkpoint_incremental, 4);
  // Without test_file: no evaluation set, allowed; workers 3 = min_workers.
  auto spec = ParseJobSpec("model: dlrm\nworkers: 3\nshards: 2\nconsistency: async\n" + criteo + tables);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->data.test_file.empty());
  EXPECT_EQ(spec->data.dir, "fashion-mnist");  // the default; criteo files are relative to it
  // A TorchScript click model reads the embeddings as dlrm does.
  auto script = ParseJobSpec("model: torchscript:ctr.pt\n" + criteo + tables);
  ASSERT_TRUE(script.ok()) << script.status();
  EXPECT_EQ(script->embeddings.fields.size(), 26u);
  // Every consistency; and hybrid: the rows on the shards with the job's
  // consistency, the dense part all-reduced.
  for (const std::string c : {"sync", "ssp\nstaleness: 2", "async"}) {
    auto ps = ParseJobSpec("model: dlrm\nshards: 2\nconsistency: " + c + "\n" + criteo + tables);
    ASSERT_TRUE(ps.ok()) << c << ": " << ps.status();
    auto hybrid = ParseJobSpec("model: dlrm\nmode: allreduce\nshards: 2\nconsistency: " + c + "\n" + criteo + tables);
    ASSERT_TRUE(hybrid.ok()) << c << ": " << hybrid.status();
    EXPECT_TRUE(hybrid->allreduce());
    EXPECT_EQ(hybrid->shards, 2);
    EXPECT_EQ(hybrid->consistency, ps->consistency);
  }
}

TEST(EmbeddingSpecTest, CriteoFileNamesStayUnderTheDataRoot) {
  const std::string tables = "embeddings: {tables: [{name: t, dim: 4}]}\n";
  struct Case {
    std::string data;
    std::string field;
  };
  const Case cases[] = {
      {"{format: criteo, dir: criteo, train_file: /etc/passwd}", "data.train_file"},
      {"{format: criteo, dir: criteo, train_file: ../x.tsv}", "data.train_file"},
      {"{format: criteo, dir: criteo, train_file: x.tsv, test_file: a/../../y}", "data.test_file"},
      {"{format: criteo, dir: /data, train_file: x.tsv}", "data.dir"},
  };
  for (const Case& c : cases) {
    auto spec = ParseJobSpec("model: dlrm\ndata: " + c.data + "\n" + tables);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::Status s = CheckDataFileNames(*spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.data;
    EXPECT_NE(std::string(s.message()).find(c.field), std::string::npos) << s;
  }
  auto dot = ParseJobSpec("model: dlrm\ndata: {format: criteo, dir: ., train_file: day_0.gz}\n" + tables);
  ASSERT_TRUE(dot.ok()) << dot.status();
  EXPECT_TRUE(CheckDataFileNames(*dot).ok());
}

TEST(EmbeddingSpecTest, SpecsWithoutEmbeddingsAreUnchanged) {
  auto spec = ParseJobSpec("model: mlp\nmin_workers: 1\nworkers: 2\ncheckpoint_every_steps: 5\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->embeddings.empty());
  EXPECT_TRUE(spec->embeddings.fields.empty());
}

}  // namespace
}  // namespace pstrain
