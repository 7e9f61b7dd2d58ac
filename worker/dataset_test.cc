#include "worker/dataset.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "common/file_util.h"

namespace pstrain {
namespace {

const char kDir[] = "/usr/share/datasets/fashion-mnist";
// The data root the real files are read under (names relative to it).
const DataRoot kDatasets{"/usr/share/datasets"};

bool HaveFashionMnist() {
  return std::filesystem::exists(std::string(kDir) + "/train-images-idx3-ubyte.gz");
}

std::string Tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }
// The test's temporary directory as a data root.
DataRoot TmpRoot() { return DataRoot{::testing::TempDir()}; }

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
  const std::string d = "fashion-mnist";
  auto train = LoadIdx(kDatasets, d + "/train-images-idx3-ubyte.gz", d + "/train-labels-idx1-ubyte.gz",
                       0.2860, 0.3530, 0, 10);
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
  auto test = LoadIdx(kDatasets, d + "/t10k-images-idx3-ubyte.gz", d + "/t10k-labels-idx1-ubyte.gz",
                      0.2860, 0.3530, 500, 10);
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
  // Files by name in the temporary directory.
  absl::Status Load(const std::string& images_name, const std::string& labels_name) {
    return LoadIdx(TmpRoot(), images_name, labels_name, 0.286, 0.353, 0, 10).status();
  }
  std::string images_, labels_;
};

TEST_F(CorruptIdxTest, RawCopiesLoadLikeTheGzipOnes) {
  WriteRaw(Tmp("img"), images_);
  WriteRaw(Tmp("lbl"), labels_);
  EXPECT_TRUE(Load("img", "lbl").ok());
}

TEST_F(CorruptIdxTest, TruncatedRawFileIsRefusedNamingTheFile) {
  WriteRaw(Tmp("img_short"), images_.substr(0, images_.size() - 100));
  WriteRaw(Tmp("lbl"), labels_);
  absl::Status s = Load("img_short", "lbl");
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
  absl::Status s = Load("img", "lbl_cut.gz");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lbl_cut.gz"), absl::string_view::npos) << s;
}

TEST_F(CorruptIdxTest, CorruptGzipIsRefused) {
  WriteGzip(Tmp("lbl.gz"), labels_);
  std::string bytes = *ReadFile(Tmp("lbl.gz"));
  for (size_t i = 20; i < bytes.size() - 10; i += 7) bytes[i] ^= 0x5a;
  WriteRaw(Tmp("lbl_bad.gz"), bytes);
  WriteRaw(Tmp("img"), images_);
  absl::Status s = Load("img", "lbl_bad.gz");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lbl_bad.gz"), absl::string_view::npos) << s;
}

TEST_F(CorruptIdxTest, BadMagicAndMismatchedCountsAreRefused) {
  std::string bad = images_;
  bad[2] = 0x0d;  // float elements, not ubyte
  WriteRaw(Tmp("img_float"), bad);
  WriteRaw(Tmp("lbl"), labels_);
  absl::Status s = Load("img_float", "lbl");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("img_float"), absl::string_view::npos);
  // Labels file swapped for the images file: wrong number of dimensions.
  WriteRaw(Tmp("img"), images_);
  s = Load("img", "img");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // 9999 labels for 10000 images.
  std::string fewer = labels_.substr(0, labels_.size() - 1);
  fewer[7] = static_cast<char>(0x0f);  // count 10000 = 0x2710 -> 0x270f
  WriteRaw(Tmp("lbl_fewer"), fewer);
  s = Load("img", "lbl_fewer");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("9999 labels"), absl::string_view::npos) << s;
  // A label outside the classes.
  std::string wrong = labels_;
  wrong[8 + 123] = 42;
  WriteRaw(Tmp("lbl_42"), wrong);
  s = Load("img", "lbl_42");
  EXPECT_NE(s.message().find("index 123"), absl::string_view::npos) << s;
  EXPECT_EQ(Load("missing", "lbl").code(), absl::StatusCode::kNotFound);
}

TEST(CsvTest, ReadsFeaturesAndLabelsAndRefusesBadRows) {
  WriteRaw(Tmp("ok.csv"), "a,b,label\n1,2,0\n3,4,1\n5,6,2\n");
  auto d = LoadCsv(TmpRoot(), "ok.csv", 0, 1, 0, 3);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 3);
  EXPECT_EQ(d->inputs.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(d->labels[2].item<int64_t>(), 2);
  WriteRaw(Tmp("cols.csv"), "1,2,0\n3,1\n");
  EXPECT_NE(LoadCsv(TmpRoot(), "cols.csv", 0, 1, 0, 3).status().message().find("cols.csv:2"),
            absl::string_view::npos);
  WriteRaw(Tmp("label.csv"), "1,2,0\n3,4,7\n");
  EXPECT_FALSE(LoadCsv(TmpRoot(), "label.csv", 0, 1, 0, 3).ok());
  WriteRaw(Tmp("nan.csv"), "1,2,0\n3,x,1\n");
  EXPECT_FALSE(LoadCsv(TmpRoot(), "nan.csv", 0, 1, 0, 3).ok());
}

// A small IDX pair (n images of 28x28, labels i % 10), written under `dir`.
void WriteIdx(const std::string& dir, int n) {
  std::filesystem::create_directories(dir);
  std::string images = {0, 0, 8, 3, 0, 0, 0, static_cast<char>(n), 0, 0, 0, 28, 0, 0, 0, 28};
  images += std::string(static_cast<size_t>(n) * 784, '\x7f');
  std::string labels = {0, 0, 8, 1, 0, 0, 0, static_cast<char>(n)};
  for (int i = 0; i < n; ++i) labels += static_cast<char>(i % 10);
  for (const char* split : {"train", "t10k"}) {
    WriteGzip(dir + "/" + split + "-images-idx3-ubyte.gz", images);
    WriteGzip(dir + "/" + split + "-labels-idx1-ubyte.gz", labels);
  }
}

// A job's data lies under the worker's --data_root and nowhere else.
class ConfinedDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(base_);
    root_.dir = base_ + "/root";
    WriteIdx(root_.dir + "/mnist", 20);
    WriteIdx(base_ + "/outside", 20);
    spec_.dir = "mnist";
  }
  absl::StatusCode Code() { return LoadData(spec_, 1, root_).status().code(); }
  std::string base_;
  DataRoot root_;
  DataSpec spec_;
};

TEST_F(ConfinedDataTest, ADatasetUnderTheRootLoads) {
  auto data = LoadData(spec_, 1, root_);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train.size(), 20);
  spec_.dir = ".";
  spec_.train_images = "mnist/train-images-idx3-ubyte.gz";
  spec_.train_labels = "mnist/train-labels-idx1-ubyte.gz";
  spec_.test_images = "mnist/t10k-images-idx3-ubyte.gz";
  spec_.test_labels = "mnist/t10k-labels-idx1-ubyte.gz";
  EXPECT_TRUE(LoadData(spec_, 1, root_).ok());
}

TEST_F(ConfinedDataTest, AbsoluteAndDotDotNamesAreRefused) {
  spec_.dir = base_ + "/outside";
  absl::Status s = LoadData(spec_, 1, root_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--data_root"), absl::string_view::npos) << s;
  spec_.dir = "../outside";
  EXPECT_EQ(Code(), absl::StatusCode::kInvalidArgument);
  spec_.dir = "mnist";
  spec_.train_images = base_ + "/outside/train-images-idx3-ubyte.gz";  // was read as given
  EXPECT_EQ(Code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ConfinedDataTest, ADirectoryLinkedOutOfTheRootIsRefused) {
  std::filesystem::create_symlink(base_ + "/outside", root_.dir + "/linked");
  spec_.dir = "linked";
  EXPECT_EQ(Code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(ConfinedDataTest, DevicesAndFifosAreRefused) {
  // `train_images: zero` with the files under /dev took a pool worker down
  // (it read to the end of /dev/zero), on every requeue.
  std::filesystem::create_symlink("/dev/zero", root_.dir + "/mnist/zero");
  spec_.train_images = "zero";
  EXPECT_EQ(Code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(::mkfifo((root_.dir + "/mnist/fifo").c_str(), 0600), 0);
  spec_.train_images = "fifo";
  EXPECT_EQ(Code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ConfinedDataTest, AGzipBombAndAnOversizedFileAreRefused) {
  WriteGzip(root_.dir + "/mnist/bomb.gz", std::string(32 << 20, '\0'));
  root_.max_file_bytes = 1 << 20;
  spec_.train_images = "bomb.gz";
  absl::Status s = LoadData(spec_, 1, root_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--max_data_file_bytes"), absl::string_view::npos) << s;
  root_.max_file_bytes = 100;  // the labels file (40 bytes gzipped) fits, not the images
  spec_.train_images = "train-images-idx3-ubyte.gz";
  EXPECT_EQ(Code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ConfinedDataTest, CsvFilesAreConfinedToo) {
  WriteRaw(root_.dir + "/ok.csv", "1,2,0\n3,4,1\n");
  WriteRaw(base_ + "/outside/ok.csv", "1,2,0\n3,4,1\n");
  spec_.format = "csv";
  spec_.train_csv = spec_.test_csv = "ok.csv";
  EXPECT_TRUE(LoadData(spec_, 1, root_).ok());
  spec_.train_csv = base_ + "/outside/ok.csv";
  EXPECT_EQ(Code(), absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticTest, IsDeterministicAndLabelled) {
  Dataset a = MakeSynthetic(100, 10, 3), b = MakeSynthetic(100, 10, 3);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_EQ(a.inputs.sizes(), (std::vector<int64_t>{100, 1, 28, 28}));
  EXPECT_EQ(a.labels.max().item<int64_t>(), 9);
}

}  // namespace
}  // namespace pstrain
