// CtrBatchReader: under SYNC (windows) a rank covering a vacant one reads
// exactly the batches that rank's own reader would have, at the same step,
// whatever it skipped before; without windows, its own share as before;
// a file shorter than counted fails the step.
#include "worker/ctr_batches.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

// A file of `n` examples whose first id of field 0 is the example's index.
std::string File(const std::string& name, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&text, i % 2, std::string(13, '\t'));
    for (int f = 0; f < kCriteoSparseFields; ++f) absl::StrAppend(&text, "\t", absl::Hex(i));
    absl::StrAppend(&text, "\n", i == 7 ? "\n" : "");  // an empty line is no example
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  FILE* out = std::fopen(path.c_str(), "wb");
  std::fwrite(text.data(), 1, text.size(), out);
  std::fclose(out);
  return path;
}

CtrBatchReader Reader(const std::string& path, int rank, bool windows, int64_t per_epoch) {
  CriteoReaderOptions o;
  o.rank = rank;
  o.world = 3;
  auto reader = CriteoReader::Open(path, o);
  EXPECT_TRUE(reader.ok()) << reader.status();
  // {rank, world, batch_size, accumulate, examples_per_epoch, windows, file, declared}
  return CtrBatchReader(*std::move(reader), {rank, 3, 4, 2, per_epoch, windows, "train.tsv", false});
}

std::vector<int64_t> Ids(const std::vector<CriteoBatch>& micro, size_t n) {
  std::vector<int64_t> ids;
  for (size_t m = 0; m < n; ++m) ids.insert(ids.end(), micro[m].sparse_ids[0].begin(), micro[m].sparse_ids[0].end());
  return ids;
}

// Every step's batch of `rank` (own reader, windows), from step `from`.
std::vector<std::vector<int64_t>> OwnSteps(const std::string& path, int rank, int64_t from) {
  CtrBatchReader r = Reader(path, rank, true, 30);
  EXPECT_TRUE(r.Skip(from, nullptr).ok());
  std::vector<std::vector<int64_t>> steps;
  CtrStep step;
  while (*r.Next(StepBatches{}, &step)) steps.push_back(Ids(step.batches[0], step.micro));
  return steps;
}

TEST(CtrBatchReaderTest, ACoveringRankReadsTheVacantRanksBatchesAsItsOwnReaderWould) {
  // 90 examples, 30 a rank; steps of 2 micro-batches of 4: 4 steps, the
  // last of 6 (4 + 2).
  const std::string path = File("cover.tsv", 90);
  const auto two = OwnSteps(path, 2, 0);
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[0], (std::vector<int64_t>{2, 5, 8, 11, 14, 17, 20, 23}));
  EXPECT_EQ(two[3].size(), 6u);
  // Rank 0 skips a step (a resumed rank), trains its own at step 1, then
  // covers rank 2 at steps 2 and 3 (vacant), then only rank 2's at a step
  // it is told its own is vacant: never beyond the epoch.
  CtrBatchReader r = Reader(path, 0, true, 30);
  ASSERT_TRUE(r.Skip(1, nullptr).ok());
  const auto zero = OwnSteps(path, 0, 1);
  CtrStep step;
  ASSERT_TRUE(*r.Next(StepBatches{}, &step));
  EXPECT_EQ(Ids(step.batches[0], step.micro), zero[0]);
  ASSERT_TRUE(*r.Next(StepBatches{true, {2}}, &step));
  ASSERT_EQ(step.batches.size(), 2u);
  EXPECT_EQ(Ids(step.batches[0], step.micro), zero[1]);
  EXPECT_EQ(Ids(step.batches[1], step.micro), two[2]);
  EXPECT_EQ(step.examples(), 16);
  ASSERT_TRUE(*r.Next(StepBatches{false, {2}}, &step));
  ASSERT_EQ(step.batches.size(), 1u);
  EXPECT_EQ(Ids(step.batches[0], step.micro), two[3]);
  EXPECT_FALSE(*r.Next(StepBatches{}, &step));
}

TEST(CtrBatchReaderTest, WithoutWindowsARankReadsItsShareToTheEnd) {
  const std::string path = File("own.tsv", 20);  // rank 1: examples 1, 4, ..., 19 (7)
  CtrBatchReader r = Reader(path, 1, false, -1);
  CtrStep step;
  std::vector<int64_t> all;
  while (*r.Next(StepBatches{false, {0}}, &step)) {  // ignored without windows: its own only
    ASSERT_EQ(step.batches.size(), 1u);
    for (int64_t id : Ids(step.batches[0], step.micro)) all.push_back(id);
  }
  EXPECT_EQ(all, (std::vector<int64_t>{1, 4, 7, 10, 13, 16, 19}));
}

TEST(CtrBatchReaderTest, AFileShorterThanCountedFailsTheStep) {
  const std::string path = File("short.tsv", 60);  // counted as 30 a rank: 90
  for (bool windows : {true, false}) {
    CtrBatchReader r = Reader(path, 0, windows, 30);
    CtrStep step;
    absl::StatusOr<bool> more = true;
    while (more.ok() && *more) more = r.Next(StepBatches{}, &step);
    EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << windows;
    EXPECT_NE(more.status().message().find("did the file change?"), std::string::npos) << more.status();
  }
}

}  // namespace
}  // namespace pstrain
