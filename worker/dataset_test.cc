#include "worker/dataset.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "common/file_util.h"

namespace pstrain {
namespace {

const char kDir[] = "/usr/share/datasets/fashion-mnist";

bool HaveFashionMnist() {
  return std::filesystem::exists(std::string(kDir) + "/train-images-idx3-ubyte.gz");
}

std::string Tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string Gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

void WriteGzip(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, data.data(), data.size());
  gzclose(f);
}

void WriteRaw(const std::string& path, const std::string& data) {
  ASSERT_TRUE(WriteFileAtomically(path, data).ok());
}

TEST(IdxTest, ReadsTheRealFashionMnistFiles) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed (make setup installs it)";
  const std::string d = kDir;
  auto train = LoadIdx(d + "/train-images-idx3-ubyte.gz", d + "/train-labels-idx1-ubyte.gz", 0.2860,
                       0.3530, 0, 10);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(train->inputs.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  // Kept as the file's bytes (a quarter of float32's memory)...
  EXPECT_EQ(train->inputs.scalar_type(), at::kByte);
  // ...and normalised per batch with the published mean and std: about 0
  // and 1 overall.
  at::Tensor all = train->Normalize(train->inputs);
  EXPECT_EQ(all.scalar_type(), at::kFloat);
  EXPECT_NEAR(all.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(all.std().item<double>(), 1.0, 0.01);
  // Ten balanced classes.
  auto counts = train->labels.bincount();
  EXPECT_EQ(counts.size(0), 10);
  EXPECT_EQ(counts.min().item<int64_t>(), 6000);
  auto test = LoadIdx(d + "/t10k-images-idx3-ubyte.gz", d + "/t10k-labels-idx1-ubyte.gz", 0.2860,
                      0.3530, 500, 10);
  ASSERT_TRUE(test.ok());
  EXPECT_EQ(test->size(), 500);
}

class CorruptIdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    images_ = Gunzip(std::string(kDir) + "/t10k-images-idx3-ubyte.gz");
    labels_ = Gunzip(std::string(kDir) + "/t10k-labels-idx1-ubyte.gz");
    ASSERT_EQ(images_.size(), 16u + 10000 * 784);
  }
  absl::Status Load(const std::string& images_path, const std::string& labels_path) {
    return LoadIdx(images_path, labels_path, 0.286, 0.353, 0, 10).status();
  }
  std::string images_, labels_;
};

TEST_F(CorruptIdxTest, RawCopiesLoadLikeTheGzipOnes) {
  WriteRaw(Tmp("img"), images_);
  WriteRaw(Tmp("lbl"), labels_);
  EXPECT_TRUE(Load(Tmp("img"), Tmp("lbl")).ok());
}

TEST_F(CorruptIdxTest, TruncatedRawFileIsRefusedNamingTheFile) {
  WriteRaw(Tmp("img_short"), images_.substr(0, images_.size() - 100));
  WriteRaw(Tmp("lbl"), labels_);
  absl::Status s = Load(Tmp("img_short"), Tmp("lbl"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("img_short"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
}

TEST_F(CorruptIdxTest, TruncatedGzipIsRefused) {
  const std::string gz = Gunzip(std::string(kDir) + "/t10k-labels-idx1-ubyte.gz");
  WriteGzip(Tmp("lbl.gz"), gz);
  std::string bytes = *ReadFile(Tmp("lbl.gz"));
  WriteRaw(Tmp("lbl_cut.gz"), bytes.substr(0, bytes.size() / 2));
  WriteRaw(Tmp("img"), images_);
  absl::Status s = Load(Tmp("img"), Tmp("lbl_cut.gz"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lbl_cut.gz"), absl::string_view::npos) << s;
}

TEST_F(CorruptIdxTest, CorruptGzipIsRefused) {
  WriteGzip(Tmp("lbl.gz"), labels_);
  std::string bytes = *ReadFile(Tmp("lbl.gz"));
  for (size_t i = 20; i < bytes.size() - 10; i += 7) bytes[i] ^= 0x5a;
  WriteRaw(Tmp("lbl_bad.gz"), bytes);
  WriteRaw(Tmp("img"), images_);
  absl::Status s = Load(Tmp("img"), Tmp("lbl_bad.gz"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lbl_bad.gz"), absl::string_view::npos) << s;
}

TEST_F(CorruptIdxTest, BadMagicAndMismatchedCountsAreRefused) {
  std::string bad = images_;
  bad[2] = 0x0d;  // float elements, not ubyte
  WriteRaw(Tmp("img_float"), bad);
  WriteRaw(Tmp("lbl"), labels_);
  absl::Status s = Load(Tmp("img_float"), Tmp("lbl"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("img_float"), absl::string_view::npos);
  // Labels file swapped for the images file: wrong number of dimensions.
  WriteRaw(Tmp("img"), images_);
  s = Load(Tmp("img"), Tmp("img"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // 9999 labels for 10000 images.
  std::string fewer = labels_.substr(0, labels_.size() - 1);
  fewer[7] = static_cast<char>(0x0f);  // count 10000 = 0x2710 -> 0x270f
  WriteRaw(Tmp("lbl_fewer"), fewer);
  s = Load(Tmp("img"), Tmp("lbl_fewer"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("9999 labels"), absl::string_view::npos) << s;
  // A label outside the classes.
  std::string wrong = labels_;
  wrong[8 + 123] = 42;
  WriteRaw(Tmp("lbl_42"), wrong);
  s = Load(Tmp("img"), Tmp("lbl_42"));
  EXPECT_NE(s.message().find("index 123"), absl::string_view::npos) << s;
  EXPECT_EQ(Load(Tmp("missing"), Tmp("lbl")).code(), absl::StatusCode::kNotFound);
}

TEST(CsvTest, ReadsFeaturesAndLabelsAndRefusesBadRows) {
  WriteRaw(Tmp("ok.csv"), "a,b,label\n1,2,0\n3,4,1\n5,6,2\n");
  auto d = LoadCsv(Tmp("ok.csv"), 0, 1, 0, 3);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 3);
  EXPECT_EQ(d->inputs.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(d->labels[2].item<int64_t>(), 2);
  WriteRaw(Tmp("cols.csv"), "1,2,0\n3,1\n");
  EXPECT_NE(LoadCsv(Tmp("cols.csv"), 0, 1, 0, 3).status().message().find("cols.csv:2"),
            absl::string_view::npos);
  WriteRaw(Tmp("label.csv"), "1,2,0\n3,4,7\n");
  EXPECT_FALSE(LoadCsv(Tmp("label.csv"), 0, 1, 0, 3).ok());
  WriteRaw(Tmp("nan.csv"), "1,2,0\n3,x,1\n");
  EXPECT_FALSE(LoadCsv(Tmp("nan.csv"), 0, 1, 0, 3).ok());
}

TEST(SyntheticTest, IsDeterministicAndLabelled) {
  Dataset a = MakeSynthetic(100, 10, 3), b = MakeSynthetic(100, 10, 3);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_EQ(a.inputs.sizes(), (std::vector<int64_t>{100, 1, 28, 28}));
  EXPECT_EQ(a.labels.max().item<int64_t>(), 9);
}

}  // namespace
}  // namespace pstrain
