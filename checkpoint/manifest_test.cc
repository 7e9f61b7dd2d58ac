// The manifest's workers with their fp16 loss scales: written and read back,
// absent for fp32 jobs, and a crafted scale refused. Embedding files: kept,
// absent (and read as none) without them, checked like shard files; an
// incremental checkpoint's chain of bases, and chains that do not hold.
#include "checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace pstrain {
namespace {

CheckpointManifest Sample() {
  CheckpointManifest m;
  m.job = "job-1";
  m.name = "ckpt-10";
  m.step = 10;
  m.spec_yaml = "name: x\n";
  m.chunk_bytes = 1024;
  m.params.push_back({"w", {2, 2}, DT_FLOAT32});
  m.workers.push_back({0, 10, 1, 3, 16384.0});
  m.workers.push_back({1, 10, 1, 3, 0.0});
  m.shards.push_back({0, "shard-0.bin", 4, 0});
  return m;
}

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/manifest_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/shard-0.bin") << "abcd";
  return dir;
}

std::string Text(const std::string& dir) {
  std::ifstream f(dir + "/manifest.json");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ManifestTest, LossScalesAreKeptPerWorkerAndOnlyWhereThereIsOne) {
  const std::string dir = Dir("scales");
  ASSERT_TRUE(WriteManifest(dir, Sample()).ok());
  const std::string text = Text(dir);
  EXPECT_NE(text.find("loss_scale"), std::string::npos) << text;
  EXPECT_EQ(text.find("loss_scale"), text.rfind("loss_scale")) << "written for rank 0 only:\n" << text;
  auto m = ReadManifest(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->workers.size(), 2u);
  EXPECT_EQ(m->workers[0].loss_scale, 16384.0);
  EXPECT_EQ(m->workers[1].loss_scale, 0.0);
  EXPECT_EQ(m->workers[1].epoch_step, 3);
}

TEST(ManifestTest, ACraftedLossScaleIsRefused) {
  for (const char* bad : {"-1", "1e300", "1e-30", "\"big\""}) {
    const std::string dir = Dir("bad");
    ASSERT_TRUE(WriteManifest(dir, Sample()).ok());
    const std::string text = std::regex_replace(Text(dir), std::regex("16384(\\.0)?"), bad);
    std::ofstream(dir + "/manifest.json") << text;
    auto m = ReadManifest(dir);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << bad << ": " << m.status();
  }
}

TEST(ManifestTest, EmbeddingFilesAreListedOnlyWhereThereAreSome) {
  const std::string dir = Dir("embeddings");
  ASSERT_TRUE(WriteManifest(dir, Sample()).ok());
  EXPECT_EQ(Text(dir).find("embeddings"), std::string::npos) << "a job without embeddings lists none";
  auto plain = ReadManifest(dir);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->embeddings.empty());

  CheckpointManifest m = Sample();
  m.embeddings.push_back({0, "emb-0.bin", 3, 77});
  m.embeddings.push_back({1, "emb-1.bin", 2, 78});
  std::ofstream(dir + "/emb-0.bin") << "xyz";
  std::ofstream(dir + "/emb-1.bin") << "xy";
  ASSERT_TRUE(WriteManifest(dir, m).ok());
  auto read = ReadManifest(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->embeddings.size(), 2u);
  EXPECT_EQ(read->embeddings[1].file, "emb-1.bin");
  EXPECT_EQ(read->embeddings[1].bytes, 2u);
  EXPECT_EQ(read->embeddings[1].crc32, 78u);

  // A missing, resized or escaping embedding file is refused as a shard file is.
  std::ofstream(dir + "/emb-1.bin") << "xyzw";
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::remove(dir + "/emb-1.bin");
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
  m.embeddings[1].file = "../emb-1.bin";
  ASSERT_TRUE(WriteManifest(dir, m).ok());
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
}

// Three checkpoints of one job, each incremental on the one before: the
// chain runs oldest first; a base replaced by another checkpoint of its
// step, a base gone, a crafted name or a cycle is DATA_LOSS.
TEST(ManifestTest, AnIncrementalCheckpointsChainRunsBackToAWholeOne) {
  const std::string job = ::testing::TempDir() + "/manifest_chain";
  std::filesystem::remove_all(job);
  auto write = [&job](int step, uint64_t id, const std::string& base, uint64_t base_id, int chain) {
    const std::string dir = job + "/ckpt-" + std::to_string(step);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/shard-0.bin") << "abcd";
    std::ofstream(dir + "/emb-0.bin") << "xyz";
    CheckpointManifest m = Sample();
    m.id = id;
    m.embeddings.push_back({0, "emb-0.bin", 3, 77});
    m.embeddings_base = base;
    m.embeddings_base_id = base_id;
    m.embeddings_chain = chain;
    EXPECT_TRUE(WriteManifest(dir, m).ok());
    return dir;
  };
  write(10, 101, "", 0, 0);
  write(20, 102, "ckpt-10", 101, 1);
  const std::string newest = write(30, 103, "ckpt-20", 102, 2);
  auto m = ReadManifest(newest);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->id, 103u);
  EXPECT_EQ(m->embeddings_base, "ckpt-20");
  auto chain = EmbeddingChain(newest, *m);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_EQ((*chain)[0].dir, job + "/ckpt-10");
  EXPECT_EQ((*chain)[0].files, std::vector<std::string>{job + "/ckpt-10/emb-0.bin"});
  EXPECT_EQ((*chain)[2].dir, newest);

  write(20, 999, "", 0, 0);  // step 20 checkpointed again: another checkpoint
  auto replaced = EmbeddingChain(newest, *m);
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(replaced.status().message().find("replaced"), std::string::npos) << replaced.status();
  std::filesystem::remove_all(job + "/ckpt-20");
  EXPECT_EQ(EmbeddingChain(newest, *m).status().code(), absl::StatusCode::kDataLoss);

  write(40, 104, "ckpt-50", 105, 1);
  write(50, 105, "ckpt-40", 104, 1);  // a cycle: ends at the chain's bound
  auto cycle = ReadManifest(job + "/ckpt-50");
  ASSERT_TRUE(cycle.ok());
  EXPECT_EQ(EmbeddingChain(job + "/ckpt-50", *cycle).status().code(), absl::StatusCode::kDataLoss);
  for (const char* bad : {"../other/ckpt-1", "ckpt-", "ckpt-1x", "shard-0.bin"}) {
    write(60, 106, bad, 1, 1);
    EXPECT_EQ(ReadManifest(job + "/ckpt-60").status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

// A QAT job's buffers file: listed only where there is one, checked as a
// shard file is, never more than one.
TEST(ManifestTest, ABuffersFileIsListedOnlyWhereThereIsOne) {
  const std::string dir = Dir("buffers");
  ASSERT_TRUE(WriteManifest(dir, Sample()).ok());
  EXPECT_EQ(Text(dir).find("buffers"), std::string::npos);
  ASSERT_TRUE(ReadManifest(dir)->buffers.empty());
  CheckpointManifest m = Sample();
  m.buffers.push_back({0, "buffers.pt", 4, 99});
  std::ofstream(dir + "/buffers.pt") << "abcd";
  ASSERT_TRUE(WriteManifest(dir, m).ok());
  auto read = ReadManifest(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->buffers.size(), 1u);
  EXPECT_EQ(read->buffers[0].file, "buffers.pt");
  EXPECT_EQ(read->buffers[0].crc32, 99u);
  std::ofstream(dir + "/buffers.pt") << "abcde";
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
  std::ofstream(dir + "/buffers.pt", std::ios::trunc) << "abcd";
  m.buffers.push_back({0, "buffers.pt", 4, 99});
  ASSERT_TRUE(WriteManifest(dir, m).ok());
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pstrain
