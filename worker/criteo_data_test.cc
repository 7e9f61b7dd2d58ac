#include "worker/criteo_data.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

// A line of 40 columns: dense I1..I13 = base + j (as text), ids C1..C26 =
// hex of (base * 100 + f), with the cells named in `missing` left empty.
std::string Line(int label, int base, const std::vector<int>& missing = {}) {
  std::vector<std::string> cells = {std::to_string(label)};
  for (int j = 0; j < kCriteoDenseFields; ++j) cells.push_back(std::to_string(base + j));
  for (int f = 0; f < kCriteoSparseFields; ++f) cells.push_back(absl::StrCat(absl::Hex(base * 100 + f, absl::kZeroPad8)));
  for (int c : missing) cells[c] = "";
  return absl::StrJoin(cells, "\t");
}

std::string TempPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/", name); }

void WritePlain(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Every batch of the file, concatenated; the status of the last read.
absl::Status ReadAll(const std::string& path, const CriteoReaderOptions& options, int64_t batch_size,
                     CriteoBatch* all, std::vector<int64_t>* sizes = nullptr) {
  auto reader = CriteoReader::Open(path, options);
  if (!reader.ok()) return reader.status();
  all->Clear();
  CriteoBatch batch;
  while (true) {
    absl::Status s = (*reader)->ReadBatch(batch_size, &batch);
    if (!s.ok()) return s;
    if (batch.size() == 0) return absl::OkStatus();
    if (sizes != nullptr) sizes->push_back(batch.size());
    all->labels.insert(all->labels.end(), batch.labels.begin(), batch.labels.end());
    all->dense.insert(all->dense.end(), batch.dense.begin(), batch.dense.end());
    for (int f = 0; f < kCriteoSparseFields; ++f) {
      for (int64_t i = 0; i < batch.size(); ++i) {
        all->sparse_ids[f].push_back(batch.sparse_ids[f][batch.sparse_offsets[f][i]]);
        all->sparse_offsets[f].push_back(static_cast<int64_t>(all->sparse_ids[f].size()));
      }
    }
  }
}

TEST(ParseCriteoLineTest, ValuesMissingValuesAndTransform) {
  CriteoBatch batch;
  // I2 = -3 (Kaggle's I2 has negatives), I5 and C7 missing.
  std::string line = Line(1, 0, {5, 1 + kCriteoDenseFields + 6});
  line.replace(line.find("\t1\t"), 3, "\t-3\t");
  ASSERT_TRUE(ParseCriteoLine(line, {}, &batch).ok());
  ASSERT_EQ(batch.size(), 1);
  EXPECT_EQ(batch.labels[0], 1.0f);
  EXPECT_FLOAT_EQ(batch.dense[0], 0.0f);  // log(1 + 0)
  EXPECT_FLOAT_EQ(batch.dense[1], 0.0f);  // negative -> 0
  EXPECT_FLOAT_EQ(batch.dense[2], std::log1p(2.0f));
  EXPECT_FLOAT_EQ(batch.dense[4], 0.0f);  // missing
  EXPECT_FLOAT_EQ(batch.dense[12], std::log1p(12.0f));
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    ASSERT_EQ(batch.sparse_offsets[f], (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(batch.sparse_ids[f][0], f == 6 ? kCriteoMissingId : f) << "field " << f;
  }
  CriteoParseOptions raw;
  raw.log_transform = false;
  ASSERT_TRUE(ParseCriteoLine(Line(0, 7), raw, &batch).ok());
  ASSERT_EQ(batch.size(), 2);
  EXPECT_EQ(batch.dense[kCriteoDenseFields + 3], 10.0f);
  EXPECT_EQ(batch.sparse_offsets[0], (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(batch.sparse_ids[25][1], 725);
}

TEST(ParseCriteoLineTest, HexIdsAreUint64CastToInt64) {
  CriteoBatch batch;
  std::string line = Line(0, 0);
  const size_t last = line.rfind('\t') + 1;
  line.replace(last, std::string::npos, "FFFFFFFFFFFFFFFE");
  ASSERT_TRUE(ParseCriteoLine(line, {}, &batch).ok());
  EXPECT_EQ(batch.sparse_ids[25][0], -2);
  line.replace(last, std::string::npos, "68fd1e64");  // a real Criteo value
  ASSERT_TRUE(ParseCriteoLine(line, {}, &batch).ok());
  EXPECT_EQ(batch.sparse_ids[25][1], 0x68fd1e64);
}

TEST(ParseCriteoLineTest, RefusesBadLinesAndLeavesTheBatchAlone) {
  CriteoBatch batch;
  ASSERT_TRUE(ParseCriteoLine(Line(0, 1), {}, &batch).ok());
  const std::string good = Line(1, 2);
  const size_t last = good.rfind('\t') + 1;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {good.substr(0, good.rfind('\t')), "has 39 tab-separated columns"},
      {good + "\t0", "has 41 tab-separated columns"},
      {"", "has 1 tab-separated columns"},
      {"2" + good.substr(1), "column 1 (the label) \"2\" is not 0 or 1"},
      {good.substr(0, 2) + "1.5" + good.substr(3), "column 2 (I1) \"1.5\" is not an integer"},
      {good.substr(0, last) + "xyz1", "column 40 (C26) \"xyz1\" is not 1 to 16 hex digits"},
      {good.substr(0, last) + "0x12", "is not 1 to 16 hex digits"},
      {good.substr(0, last) + "-12", "is not 1 to 16 hex digits"},
      {good.substr(0, last) + "12345678123456781", "is not 1 to 16 hex digits"},
      {good.substr(0, 2) + "99999999999999999999" + good.substr(3), "is not an integer"},
  };
  for (const auto& [line, message] : bad) {
    absl::Status s = ParseCriteoLine(line, {}, &batch);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  }
  EXPECT_EQ(batch.size(), 1);
  EXPECT_EQ(batch.dense.size(), static_cast<size_t>(kCriteoDenseFields));
  EXPECT_EQ(batch.sparse_offsets[3].size(), 2u);
  // A hostile cell is quoted, bounded and escaped.
  std::string long_cell = good.substr(0, last) + std::string(1000, 'z') + "\x1b";
  absl::Status s = ParseCriteoLine(long_cell, {}, &batch);
  EXPECT_LT(s.message().size(), 200u) << s.message();
}

TEST(CriteoReaderTest, PlainAndGzipReadTheSame) {
  std::string text;
  for (int i = 0; i < 23; ++i) absl::StrAppend(&text, Line(i % 2, i, {1 + i % 39}), i == 7 ? "\r\n" : "\n");
  text += "\n" + Line(1, 99);  // an empty line (skipped), then a last line without '\n'
  WritePlain(TempPath("plain.tsv"), text);
  WriteGzip(TempPath("packed.tsv.gz"), text);
  CriteoReaderOptions options;
  options.read_chunk_bytes = 100;  // lines span reads
  CriteoBatch plain, packed;
  std::vector<int64_t> sizes;
  ASSERT_EQ(ReadAll(TempPath("plain.tsv"), options, 5, &plain, &sizes), absl::OkStatus());
  ASSERT_EQ(ReadAll(TempPath("packed.tsv.gz"), {}, 5, &packed), absl::OkStatus());
  EXPECT_EQ(sizes, (std::vector<int64_t>{5, 5, 5, 5, 4}));
  ASSERT_EQ(plain.size(), 24);
  EXPECT_EQ(plain.labels, packed.labels);
  EXPECT_EQ(plain.dense, packed.dense);
  EXPECT_EQ(plain.sparse_ids, packed.sparse_ids);
  EXPECT_EQ(plain.sparse_ids[25][7], 7 * 100 + 25);  // the \r did not reach the id
  EXPECT_EQ(plain.sparse_ids[25][23], 99 * 100 + 25);
  EXPECT_EQ(plain.sparse_ids[5][18], kCriteoMissingId);  // column 1 + 18 = C6
  EXPECT_EQ(plain.dense[2 * kCriteoDenseFields + 2], 0.0f);  // column 1 + 2 = I3
}

TEST(CriteoReaderTest, RanksSplitTheFileByExample) {
  std::string text;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&text, Line(0, i), "\n", i == 4 ? "\n" : "");
  WritePlain(TempPath("ranks.tsv"), text);
  std::vector<int> seen(20, 0);
  for (int rank = 0; rank < 3; ++rank) {
    CriteoReaderOptions options;
    options.rank = rank;
    options.world = 3;
    CriteoBatch all;
    ASSERT_TRUE(ReadAll(TempPath("ranks.tsv"), options, 4, &all).ok());
    ASSERT_EQ(all.size(), rank < 2 ? 7 : 6);
    for (int64_t k = 0; k < all.size(); ++k) {
      const int64_t i = all.sparse_ids[0][k] / 100;  // the example's index, from its id
      EXPECT_EQ(i % 3, rank);
      EXPECT_EQ(i, rank + 3 * k);
      ++seen[i];
    }
  }
  EXPECT_EQ(seen, std::vector<int>(20, 1));
  // Counting sees every rank's examples (the empty line is none), from
  // where the reader stands.
  auto counter = CriteoReader::Open(TempPath("ranks.tsv"), {});
  ASSERT_TRUE(counter.ok());
  EXPECT_EQ(*(*counter)->CountRemainingExamples(), 20);
  EXPECT_EQ(*(*counter)->CountRemainingExamples(), 0);
  CriteoReaderOptions second;
  second.rank = 1;
  second.world = 3;
  auto partly = CriteoReader::Open(TempPath("ranks.tsv"), second);
  ASSERT_TRUE(partly.ok());
  CriteoBatch first;
  ASSERT_TRUE((*partly)->ReadBatch(2, &first).ok());  // examples 1 and 4: five of the file read
  EXPECT_EQ(*(*partly)->CountRemainingExamples(), 15);
  CriteoBatch none;
  ASSERT_TRUE((*partly)->ReadBatch(2, &none).ok());
  EXPECT_EQ(none.size(), 0);
  CriteoReaderOptions bad;
  bad.rank = 3;
  bad.world = 3;
  EXPECT_EQ(CriteoReader::Open(TempPath("ranks.tsv"), bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// ReadRanks: a window of the file per call, each listed rank's examples as
// its own reader's batches would hold them; the others passed over.
TEST(CriteoReaderTest, ReadRanksGivesEachListedRankItsOwnBatch) {
  std::string text;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&text, Line(0, i), "\n", i == 4 ? "\n" : "");
  WritePlain(TempPath("windows.tsv"), text);
  CriteoReaderOptions options;
  options.rank = 0;
  options.world = 3;
  auto reader = CriteoReader::Open(TempPath("windows.tsv"), options);
  ASSERT_TRUE(reader.ok());
  CriteoBatch own, other;
  // Window 1 (examples 0..5): rank 0's and rank 2's two each.
  EXPECT_EQ(*(*reader)->ReadRanks(2, {0, 2}, {&own, &other}), 6);
  auto ids = [](const CriteoBatch& b) {
    std::vector<int64_t> out;
    for (int64_t k = 0; k < b.size(); ++k) out.push_back(b.sparse_ids[0][k] / 100);
    return out;
  };
  EXPECT_EQ(ids(own), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(ids(other), (std::vector<int64_t>{2, 5}));
  // Window 2 (6..11), skipped: nothing parsed; window 3 (12..17): rank 1.
  ASSERT_TRUE((*reader)->ReadRanks(2, {}, {}).ok());
  ASSERT_TRUE((*reader)->ReadRanks(2, {1}, {&other}).ok());
  EXPECT_EQ(ids(other), (std::vector<int64_t>{13, 16}));
  // The end of the file: a short window, then none.
  EXPECT_EQ(*(*reader)->ReadRanks(2, {0, 1}, {&own, &other}), 2);
  EXPECT_EQ(ids(own), (std::vector<int64_t>{18}));
  EXPECT_EQ(ids(other), (std::vector<int64_t>{19}));
  ASSERT_TRUE((*reader)->ReadRanks(2, {0}, {&own}).ok());
  EXPECT_EQ(own.size(), 0);
  EXPECT_EQ((*reader)->ReadRanks(2, {3}, {&own}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->ReadRanks(2, {1, 1}, {&own, &other}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CriteoReaderTest, ErrorsNameFileAndLine) {
  const std::string path = TempPath("bad.tsv");
  std::string third = Line(0, 2);
  third.replace(third.rfind('\t') + 1, std::string::npos, "nothex");
  WritePlain(path, absl::StrCat(Line(0, 0), "\n", Line(1, 1), "\n", third, "\n", Line(0, 3), "\n"));
  auto reader = CriteoReader::Open(path, {});
  ASSERT_TRUE(reader.ok());
  CriteoBatch batch;
  absl::Status s = (*reader)->ReadBatch(10, &batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path + ":3: column 40 (C26) \"nothex\""), std::string::npos) << s.message();
  EXPECT_EQ(batch.size(), 0);
  EXPECT_EQ((*reader)->ReadBatch(10, &batch), s);  // final
  // Rank 1 of 2 owns lines 2 and 4 only: the bad line is not its to parse.
  CriteoReaderOptions odd;
  odd.rank = 1;
  odd.world = 2;
  CriteoBatch all;
  EXPECT_TRUE(ReadAll(path, odd, 10, &all).ok());
  EXPECT_EQ(all.size(), 2);
}

TEST(CriteoReaderTest, RefusesALongLineWithoutBufferingIt) {
  const std::string path = TempPath("long.tsv.gz");
  // 1 MiB of one line, compressed to a few KiB: the reader must stop at
  // max_line_bytes, whatever the rest holds.
  WriteGzip(path, absl::StrCat(Line(0, 0), "\n", std::string(1 << 20, '7'), "\n", Line(0, 1), "\n"));
  CriteoReaderOptions options;
  options.max_line_bytes = 64 << 10;
  options.read_chunk_bytes = 4096;
  CriteoBatch all;
  absl::Status s = ReadAll(path, options, 10, &all);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path + ":2: line longer than 65536 bytes"), std::string::npos) << s.message();
  EXPECT_LT(s.message().size(), 400u);
  // The same line in one read (a chunk larger than the line).
  options.read_chunk_bytes = 4 << 20;
  s = ReadAll(path, options, 10, &all);
  EXPECT_NE(s.message().find(":2: line longer than"), std::string::npos) << s.message();
  // Exactly the bound is accepted (and then fails as a line, not a length).
  WritePlain(TempPath("edge.tsv"), std::string(100, '1') + "\n");
  options.max_line_bytes = 100;
  options.read_chunk_bytes = 7;
  s = ReadAll(TempPath("edge.tsv"), options, 10, &all);
  EXPECT_NE(s.message().find(":1: has 1 tab-separated columns"), std::string::npos) << s.message();
}

TEST(CriteoReaderTest, TruncatedGzipIsAnError) {
  std::string text;
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&text, Line(i % 2, i), "\n");
  const std::string whole = TempPath("whole.tsv.gz"), cut = TempPath("cut.tsv.gz");
  WriteGzip(whole, text);
  FILE* f = std::fopen(whole.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string bytes(1 << 20, '\0');
  bytes.resize(std::fread(&bytes[0], 1, bytes.size(), f));
  std::fclose(f);
  WritePlain(cut, bytes.substr(0, bytes.size() * 2 / 3));
  CriteoBatch all;
  absl::Status s = ReadAll(cut, {}, 256, &all);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(CriteoReaderTest, RefusesWhatIsNotARegularFile) {
  EXPECT_EQ(CriteoReader::Open(::testing::TempDir(), {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string fifo = TempPath("fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(CriteoReader::Open(fifo, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CriteoReader::Open(TempPath("absent"), {}).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pstrain
