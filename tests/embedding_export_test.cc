// A checkpoint's embedding tables, written by two shards, exported for
// PyTorch: torch.load reads the file, every row is there with its values,
// and nn.EmbeddingBag over the exported weights pools as the rows do.
#include "worker/embedding_export.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <memory>
#include <vector>

#include "embedding/embedding_files.h"
#include "embedding/embedding_table.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

EmbeddingTableConfig Config(const std::string& name, int dim) {
  EmbeddingTableConfig c;
  c.set_name(name);
  c.set_dim(dim);
  c.mutable_optimizer()->set_kind(EmbeddingOptimizer::LAZY_ADAM);
  c.mutable_optimizer()->set_lr(0.01);
  EXPECT_TRUE(NormalizeEmbeddingConfig(&c).ok());
  return c;
}

TEST(EmbeddingExportTest, TorchLoadsTheTablesAndEmbeddingBagPoolsThem) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is missing (make setup installs it)";
  }
  const std::vector<EmbeddingTableConfig> configs = {Config("user", 8), Config("item", 3)};
  // Two shards' parts of both tables, trained a step.
  std::vector<std::vector<std::unique_ptr<EmbeddingTable>>> shards(2);
  for (auto& shard : shards) {
    for (const auto& c : configs) shard.push_back(std::move(*EmbeddingTable::Create(c, nullptr)));
  }
  std::ofstream expected(::testing::TempDir() + "/export_expected.txt");
  expected << std::setprecision(9);  // every float32 exactly
  for (size_t t = 0; t < configs.size(); ++t) {
    const int dim = static_cast<int>(configs[t].dim());
    for (int64_t id : {-7LL, 0LL, 3LL, 1LL << 50, 123456789LL, -(1LL << 62)}) {
      EmbeddingTable& table = *shards[ShardOfId(id, 1024, 2)][t];
      std::vector<float> row(dim), grad(dim, 0.25f);
      ASSERT_TRUE(table.Lookup({id}, 1, row.data()).ok());
      ASSERT_TRUE(table.Update({id}, grad.data(), 1, 1.0).ok());
      ASSERT_TRUE(table.Lookup({id}, 2, row.data()).ok());
      expected << "row " << configs[t].name() << " " << id;
      for (float v : row) expected << " " << v;
      expected << "\n";
    }
  }
  // A bag: the sum of two rows, as SparseEmbeddings pools a field.
  {
    std::vector<float> a(8), b(8);
    ASSERT_TRUE(shards[ShardOfId(3, 1024, 2)][0]->Lookup({3}, 2, a.data()).ok());
    ASSERT_TRUE(shards[ShardOfId(-7, 1024, 2)][0]->Lookup({-7}, 2, b.data()).ok());
    expected << "bag user";
    for (int j = 0; j < 8; ++j) expected << " " << a[j] + b[j];
    expected << " : 3 -7\n";
  }
  expected.close();
  std::vector<std::string> files;
  for (int s = 0; s < 2; ++s) {
    EmbeddingFileHeader header;
    header.set_job("ctr");
    header.set_shard_index(s);
    header.set_num_shards(2);
    for (const auto& c : configs) *header.add_tables() = c;
    files.push_back(::testing::TempDir() + "/export-shard-" + std::to_string(s) + ".emb");
    ASSERT_TRUE(WriteEmbeddingFile(files.back(), header, {shards[s][0].get(), shards[s][1].get()}).ok());
  }
  const std::string out = ::testing::TempDir() + "/embeddings.pt";
  ASSERT_TRUE(ExportEmbeddings({files}, out).ok());
  const std::string cmd =
      "/usr/bin/python3 tests/check_embedding_export.py " + out + " " + ::testing::TempDir() + "/export_expected.txt";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace pstrain
