#include "worker/criteo_synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "worker/binary_metrics.h"
#include "worker/criteo_data.h"

namespace pstrain {
namespace {

std::string TempPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/", name); }

CriteoSynthOptions Small(uint64_t seed) {
  CriteoSynthOptions o;
  o.train_examples = 3000;
  o.test_examples = 20000;
  o.id_space.fill(5000);
  o.id_space[3] = 1;  // a field with a single id
  o.id_space[7] = uint64_t{1} << 32;  // the largest allowed
  o.seed = seed;
  return o;
}

// The whole test file through CriteoReader, and each example's true
// probability recomputed from what was parsed.
struct Parsed {
  std::vector<float> labels;
  std::vector<double> probabilities;
  std::vector<std::vector<int64_t>> ids;  // per field
};
Parsed ParseAndScore(const std::string& path, const CriteoSynthOptions& options) {
  Parsed out;
  out.ids.resize(kCriteoSparseFields);
  const PlantedCriteoModel model(options);
  auto reader = CriteoReader::Open(path, {});
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return out;
  CriteoBatch batch;
  while (true) {
    absl::Status s = (*reader)->ReadBatch(1000, &batch);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok() || batch.size() == 0) break;
    for (int64_t i = 0; i < batch.size(); ++i) {
      int64_t ids[kCriteoSparseFields];
      for (int f = 0; f < kCriteoSparseFields; ++f) {
        ids[f] = batch.sparse_ids[f][batch.sparse_offsets[f][i]];
        out.ids[f].push_back(ids[f]);
      }
      out.labels.push_back(batch.labels[i]);
      out.probabilities.push_back(model.Probability(ids, &batch.dense[i * kCriteoDenseFields]));
    }
  }
  return out;
}

TEST(CriteoSynthTest, SameSeedSameBytes) {
  std::vector<std::string> contents;
  for (auto [seed, name] : {std::pair<uint64_t, const char*>{5, "a"}, {5, "b"}, {6, "c"}}) {
    CriteoSynthOptions o = Small(seed);
    o.test_examples = 500;
    const std::string train = TempPath(absl::StrCat(name, "_train.tsv"));
    ASSERT_TRUE(WriteCriteoSynth(o, train, TempPath(absl::StrCat(name, "_test.tsv")), "").ok());
    absl::StatusOr<std::string> text = ReadFile(train);
    ASSERT_TRUE(text.ok());
    contents.push_back(*text);
  }
  EXPECT_EQ(contents[0], contents[1]);
  EXPECT_NE(contents[0], contents[2]);
}

TEST(CriteoSynthTest, BayesFiguresMatchTheFileAndLabelsMatchProbabilities) {
  CriteoSynthOptions o = Small(11);
  const std::string test = TempPath("bayes_test.tsv.gz"), meta_path = TempPath("bayes_meta.txt");
  o.gzip = true;
  absl::StatusOr<CriteoSynthMeta> meta = WriteCriteoSynth(o, TempPath("bayes_train.tsv.gz"), test, meta_path);
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<CriteoSynthMeta> read = ReadCriteoSynthMeta(meta_path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bayes_auc, meta->bayes_auc);  // printed with 17 digits: exact
  EXPECT_EQ(read->options.id_space, o.id_space);
  EXPECT_EQ(read->test_positives, meta->test_positives);
  EXPECT_TRUE(read->options.gzip);

  // The file, parsed, and the model applied to what was parsed: the same
  // probabilities the generator drew labels from, so the same AUC.
  const Parsed parsed = ParseAndScore(test, o);
  ASSERT_EQ(parsed.labels.size(), static_cast<size_t>(o.test_examples));
  EXPECT_NEAR(*Auc(parsed.probabilities, parsed.labels), read->bayes_auc, 1e-12);
  EXPECT_NEAR(*LogLoss(parsed.probabilities, parsed.labels), read->bayes_log_loss, 1e-12);
  EXPECT_GT(read->bayes_auc, 0.7);  // the planted model carries signal
  EXPECT_LT(read->bayes_auc, 0.9);

  double label_sum = 0, p_sum = 0, var = 0;
  for (size_t i = 0; i < parsed.labels.size(); ++i) {
    label_sum += parsed.labels[i];
    p_sum += parsed.probabilities[i];
    var += parsed.probabilities[i] * (1 - parsed.probabilities[i]);
  }
  EXPECT_EQ(static_cast<int64_t>(label_sum), read->test_positives);
  const double n = static_cast<double>(parsed.labels.size());
  EXPECT_NEAR(p_sum / n, read->test_mean_probability, 1e-12);
  // Bernoulli labels: their mean is within 4 standard errors of the mean
  // probability (fails about once in 16000 seeds; the seed is fixed).
  EXPECT_NEAR(label_sum / n, p_sum / n, 4 * std::sqrt(var) / n);

  // Ids stay in their field's id space; the one-id field has only id 0.
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    for (int64_t id : parsed.ids[f]) {
      if (id == kCriteoMissingId) continue;
      ASSERT_GE(id, 0);
      ASSERT_LT(static_cast<uint64_t>(id), o.id_space[f]) << "field " << f;
    }
  }
  EXPECT_EQ(std::set<int64_t>(parsed.ids[3].begin(), parsed.ids[3].end()), (std::set<int64_t>{kCriteoMissingId, 0}));
}

TEST(CriteoSynthTest, PopularIdsAreAFewSpreadOverTheSpace) {
  const CriteoSynthOptions o = Small(3);
  const std::string test = TempPath("zipf_test.tsv");
  ASSERT_TRUE(WriteCriteoSynth(o, "", test, "").ok());
  const Parsed parsed = ParseAndScore(test, o);
  std::unordered_map<int64_t, int> counts;
  for (int64_t id : parsed.ids[0]) ++counts[id];
  std::vector<int> sorted;
  int64_t top_id = 0;
  int top = 0;
  for (auto [id, c] : counts) {
    sorted.push_back(c);
    if (c > top && id != kCriteoMissingId) top = c, top_id = id;
  }
  std::sort(sorted.rbegin(), sorted.rend());
  // Zipf(1.05) over 5000 ids: the top 1% of ids hold far more than 1% of
  // the examples, and the most popular id is not simply id 0.
  int head = 0;
  for (int k = 0; k < 50; ++k) head += sorted[k];
  EXPECT_GT(head, 0.4 * parsed.ids[0].size());
  EXPECT_NE(top_id, 0);
}

TEST(ZipfSamplerTest, FrequenciesFollowThePowerLaw) {
  const uint64_t n = 1000000;
  const double s = 1.05;
  const ZipfSampler zipf(n, s);
  double norm = 0;
  for (uint64_t k = 1; k <= n; ++k) norm += std::pow(static_cast<double>(k), -s);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto uniform = [&] { return unit(rng); };
  const int draws = 400000;
  std::vector<int> low(10, 0);
  int tail = 0;  // ranks at or above n / 2
  for (int i = 0; i < draws; ++i) {
    const uint64_t k = zipf.Sample(uniform);
    ASSERT_LT(k, n);
    if (k < low.size()) ++low[k];
    if (k >= n / 2) ++tail;
  }
  for (size_t k = 0; k < low.size(); ++k) {
    const double p = std::pow(static_cast<double>(k + 1), -s) / norm;
    EXPECT_NEAR(low[k], draws * p, 5 * std::sqrt(draws * p * (1 - p))) << "rank " << k;
  }
  double tail_p = 0;
  for (uint64_t k = n / 2 + 1; k <= n; ++k) tail_p += std::pow(static_cast<double>(k), -s) / norm;
  EXPECT_NEAR(tail, draws * tail_p, 5 * std::sqrt(draws * tail_p));
  // Per id, rank 0 is drawn over 10^4 times as often as a rank in the tail.
  EXPECT_GT(low[0] * (n / 2.0), 1e4 * tail);
  // Exponent exactly 1 (the helpers' series branch) and a one-id space.
  const ZipfSampler harmonic(10, 1.0), single(1, 1.05);
  int ones = 0;
  for (int i = 0; i < 20000; ++i) {
    ones += harmonic.Sample(uniform) == 0;
    ASSERT_EQ(single.Sample(uniform), 0u);
  }
  EXPECT_NEAR(ones / 20000.0, 1 / 2.9289682539682538, 0.015);  // 1 / H_10
}

TEST(ScrambleIdTest, IsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 1000ull, 1024ull, 1025ull}) {
    std::set<uint64_t> seen;
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t x = ScrambleId(k, n, 99);
      ASSERT_LT(x, n);
      seen.insert(x);
    }
    EXPECT_EQ(seen.size(), n);
  }
  EXPECT_LT(ScrambleId(12345, uint64_t{1} << 32, 7), uint64_t{1} << 32);
  EXPECT_NE(ScrambleId(0, 1000, 1), ScrambleId(0, 1000, 2));
}

TEST(CriteoSynthTest, RefusesBadOptionsAndMetaFiles) {
  CriteoSynthOptions o;
  o.id_space[5] = 0;
  EXPECT_EQ(ValidateCriteoSynthOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.id_space[5] = (uint64_t{1} << 32) + 1;
  EXPECT_EQ(ValidateCriteoSynthOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o = CriteoSynthOptions();
  o.zipf = 0;
  EXPECT_FALSE(ValidateCriteoSynthOptions(o).ok());
  o = CriteoSynthOptions();
  o.test_examples = kMaxCriteoSynthTestExamples + 1;
  EXPECT_FALSE(ValidateCriteoSynthOptions(o).ok());
  EXPECT_TRUE(ValidateCriteoSynthOptions(CriteoSynthOptions()).ok());

  CriteoSynthMeta meta;
  std::string text = FormatCriteoSynthMeta(meta);
  ASSERT_TRUE(WriteFileAtomically(TempPath("m1.txt"), text).ok());
  EXPECT_TRUE(ReadCriteoSynthMeta(TempPath("m1.txt")).ok());
  ASSERT_TRUE(WriteFileAtomically(TempPath("m2.txt"), text + "surprise 1\n").ok());
  absl::Status s = ReadCriteoSynthMeta(TempPath("m2.txt")).status();
  EXPECT_NE(s.message().find("m2.txt:"), std::string::npos) << s;
  EXPECT_NE(s.message().find("unknown name"), std::string::npos) << s;
  ASSERT_TRUE(WriteFileAtomically(TempPath("m3.txt"), text.substr(0, text.find("seed"))).ok());
  EXPECT_FALSE(ReadCriteoSynthMeta(TempPath("m3.txt")).ok());
}

}  // namespace
}  // namespace pstrain
