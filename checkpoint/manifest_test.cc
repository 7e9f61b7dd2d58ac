// The manifest's workers with their fp16 loss scales: written and read back,
// absent for fp32 jobs, and a crafted scale refused. Embedding files: kept,
// absent (and read as none) without them, checked like shard files.
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
