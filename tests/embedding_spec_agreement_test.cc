// The job spec's parser (common/, which may not depend on embedding/) checks
// a table's ranges itself so that a bad value is refused at submission naming
// its field. This test keeps it in step with the shard's
// NormalizeEmbeddingConfig: whatever the spec accepts, even at the edge of
// every range, the shard accepts and keeps as given; past those edges both
// refuse.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

absl::StatusOr<JobSpec> Parse(const std::string& table) {
  return ParseJobSpec(absl::StrCat("model: dlrm\nseed: 5\n",
                                   "data: {format: criteo, dir: criteo, train_file: train.tsv}\n",
                                   "embeddings:\n  tables:\n    - ", table, "\n"));
}

TEST(EmbeddingSpecAgreementTest, WhatTheSpecAcceptsTheShardKeeps) {
  const std::string name64(64, 'n');
  const std::string tables[] = {
      "{name: t, dim: 1}",
      "{name: " + name64 + ", dim: 4096, virtual_shards: 1048576, seed: 18446744073709551615}",
      "{name: a.b-c_D9, dim: 8, virtual_shards: 1, nonfinite: skip}",
      "{name: t, dim: 8, optimizer: {kind: sgd, lr: 100}}",
      "{name: t, dim: 8, optimizer: {kind: adagrad, lr: 1e-12, eps: 1, initial_accumulator_value: 1e6}}",
      "{name: t, dim: 8, optimizer: {kind: rowwise_adagrad, lr: 0.1, eps: 0.5}}",
      "{name: t, dim: 8, optimizer: {kind: lazy_adam, lr: 0.1, beta1: 0.999999, beta2: 0.999999}}",
      "{name: t, dim: 8, optimizer: {kind: ftrl, lr: 0.1, ftrl_beta: 1e6, ftrl_l1: 1e6, ftrl_l2: 1e6}}",
      "{name: t, dim: 8, initializer: {kind: normal, scale: 1000}}",
      "{name: t, dim: 8, initializer: {kind: zeros}}",
      "{name: t, dim: 8, admission: {min_count: 65535, probability: 1}}",
      "{name: t, dim: 8, eviction: {ttl_steps: 9223372036854775807, max_memory_mb: 1073741824}}",
  };
  for (const std::string& table : tables) {
    auto spec = Parse(table);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const EmbeddingTableConfig& parsed = spec->embeddings.tables.at(0);
    EmbeddingTableConfig normalized = parsed;
    ASSERT_TRUE(NormalizeEmbeddingConfig(&normalized).ok()) << table << ": " << NormalizeEmbeddingConfig(&normalized);
    // Normalizing only fills zeros that mean "the kind's default"; what the
    // spec set stays.
    EXPECT_EQ(normalized.name(), parsed.name());
    EXPECT_EQ(normalized.dim(), parsed.dim());
    EXPECT_EQ(normalized.seed(), parsed.seed());
    EXPECT_EQ(normalized.virtual_shards(), parsed.virtual_shards());
    EXPECT_EQ(normalized.optimizer().kind(), parsed.optimizer().kind());
    EXPECT_EQ(normalized.optimizer().lr(), parsed.optimizer().lr());
    EXPECT_EQ(normalized.initializer().kind(), parsed.initializer().kind());
    EXPECT_EQ(normalized.admission().SerializeAsString(), parsed.admission().SerializeAsString());
    EXPECT_EQ(normalized.eviction().SerializeAsString(), parsed.eviction().SerializeAsString());
    EXPECT_EQ(normalized.nonfinite(), parsed.nonfinite());
    EmbeddingTableConfig again = normalized;
    ASSERT_TRUE(NormalizeEmbeddingConfig(&again).ok());
    EXPECT_EQ(again.SerializeAsString(), normalized.SerializeAsString()) << table;
  }
}

TEST(EmbeddingSpecAgreementTest, PastEachEdgeBothRefuse) {
  struct Case {
    std::string table;                   // refused by the spec
    void (*set)(EmbeddingTableConfig*);  // the same value, set on a valid config
  };
  const Case cases[] = {
      {"{name: t, dim: 4097}", [](EmbeddingTableConfig* c) { c->set_dim(4097); }},
      {"{name: t, dim: 8, virtual_shards: 1048577}",
       [](EmbeddingTableConfig* c) { c->set_virtual_shards(1048577); }},
      {"{name: t, dim: 8, optimizer: {lr: 100.5}}",
       [](EmbeddingTableConfig* c) { c->mutable_optimizer()->set_lr(100.5); }},
      {"{name: t, dim: 8, optimizer: {eps: 1.5}}",
       [](EmbeddingTableConfig* c) { c->mutable_optimizer()->set_eps(1.5); }},
      {"{name: t, dim: 8, optimizer: {beta2: 1}}",
       [](EmbeddingTableConfig* c) { c->mutable_optimizer()->set_beta2(1); }},
      {"{name: t, dim: 8, optimizer: {initial_accumulator_value: 2e6}}",
       [](EmbeddingTableConfig* c) { c->mutable_optimizer()->set_initial_accumulator_value(2e6); }},
      {"{name: t, dim: 8, optimizer: {ftrl_l2: -1}}",
       [](EmbeddingTableConfig* c) { c->mutable_optimizer()->set_ftrl_l2(-1); }},
      {"{name: t, dim: 8, initializer: {scale: 1001}}",
       [](EmbeddingTableConfig* c) { c->mutable_initializer()->set_scale(1001); }},
      {"{name: t, dim: 8, admission: {min_count: 65536}}",
       [](EmbeddingTableConfig* c) { c->mutable_admission()->set_min_count(65536); }},
      {"{name: t, dim: 8, admission: {probability: 1.01}}",
       [](EmbeddingTableConfig* c) { c->mutable_admission()->set_probability(1.01); }},
      {"{name: t, dim: 8, eviction: {max_memory_mb: 1073741825}}",
       [](EmbeddingTableConfig* c) { c->mutable_eviction()->set_max_memory_mb(1073741825); }},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(Parse(c.table).ok()) << c.table;
    auto valid = Parse("{name: t, dim: 8}");
    ASSERT_TRUE(valid.ok()) << valid.status();
    EmbeddingTableConfig config = valid->embeddings.tables.at(0);
    c.set(&config);
    EXPECT_EQ(NormalizeEmbeddingConfig(&config).code(), absl::StatusCode::kInvalidArgument) << c.table;
  }
}

}  // namespace
}  // namespace pstrain
