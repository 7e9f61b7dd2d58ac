#include "worker/criteo_synth.h"

#include <zlib.h>

#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "embedding/row_math.h"
#include "worker/binary_metrics.h"

namespace pstrain {
namespace {

constexpr double kTwoPi = 6.283185307179586;
constexpr uint64_t kMaxIdSpace = uint64_t{1} << 32;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
// Salts that keep the model's weights, the ids' scrambling and the two
// splits' streams independent of one another under one seed.
enum Salt : uint64_t { kFieldWeight = 1, kDenseWeight, kFactor, kScramble, kTrain, kTest };

// A uniform in (0, 1) from 53 bits of a hash; never 0, so log() is finite.
double UnitOpen(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }

// N(0, 1) as a function of a key (Box-Muller on two hashes of it).
double NormalOf(uint64_t key) {
  const uint64_t h1 = MixId(key);
  const uint64_t h2 = MixId(h1 ^ kGolden);
  return std::sqrt(-2 * std::log(UnitOpen(h1))) * std::cos(kTwoPi * UnitOpen(h2));
}

uint64_t KeyOf(uint64_t seed, Salt salt, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t k = MixId(seed ^ (salt * kGolden));
  k = MixId(k ^ a);
  k = MixId(k + b * kGolden);
  return MixId(k ^ (c * 0xd1b54a32d192ed03ULL));
}

// One example's random numbers: a counter hashed (SplitMix64), so example i
// needs no draws of examples before it.
class Stream {
 public:
  explicit Stream(uint64_t key) : state_(key) {}
  double Uniform() { return (static_cast<double>(Next() >> 11)) * 0x1.0p-53; }
  double Normal() { return NormalOf(Next()); }

 private:
  uint64_t Next() { return MixId(state_ += kGolden); }
  uint64_t state_;
};

double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

absl::Status ValidateCriteoSynthOptions(const CriteoSynthOptions& o) {
  auto bad = [](absl::string_view what) { return absl::InvalidArgumentError(what); };
  if (o.train_examples < 0) return bad(absl::StrCat("train_examples ", o.train_examples, " is negative"));
  if (o.test_examples < 0 || o.test_examples > kMaxCriteoSynthTestExamples) {
    return bad(absl::StrCat("test_examples ", o.test_examples, " is not in [0, ", kMaxCriteoSynthTestExamples, "]"));
  }
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    if (o.id_space[f] < 1 || o.id_space[f] > kMaxIdSpace) {
      return bad(absl::StrCat("id_space of field C", f + 1, " is ", o.id_space[f], ", not in [1, 2^32]: ids are "
                              "written as 8 hex digits"));
    }
  }
  if (!(o.zipf > 0 && o.zipf <= 10)) return bad(absl::StrCat("zipf exponent ", o.zipf, " is not in (0, 10]"));
  if (!(o.missing_rate >= 0 && o.missing_rate <= 1)) {
    return bad(absl::StrCat("missing_rate ", o.missing_rate, " is not in [0, 1]"));
  }
  for (auto [name, v] : {std::pair<const char*, double>{"field_sigma", o.field_sigma}, {"dense_sigma", o.dense_sigma},
                         {"factor_sigma", o.factor_sigma}}) {
    if (!(v >= 0 && v <= 100)) return bad(absl::StrCat(name, " ", v, " is not in [0, 100]"));
  }
  if (!(std::fabs(o.bias) <= 100)) return bad(absl::StrCat("bias ", o.bias, " is not in [-100, 100]"));
  if (o.factor_fields < 0 || o.factor_fields > kCriteoSparseFields) {
    return bad(absl::StrCat("factor_fields ", o.factor_fields, " is not in [0, ", kCriteoSparseFields, "]"));
  }
  if (o.factor_rank < 1 || o.factor_rank > 64) {
    return bad(absl::StrCat("factor_rank ", o.factor_rank, " is not in [1, 64]"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Zipf
// Hörmann and Derflinger, "Rejection-inversion to generate variates from
// monotone discrete distributions" (1996), in the form of Apache Commons
// RNG: H is the integral of h(x) = x^-s, written with expm1/log1p helpers
// that stay exact as s -> 1.

namespace {
double Helper1(double x) { return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
double Helper2(double x) {
  return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}
}  // namespace

ZipfSampler::ZipfSampler(uint64_t n, double exponent) : n_(n), exponent_(exponent) {
  h_integral_x1_ = HIntegral(1.5) - 1;
  h_integral_n_ = HIntegral(static_cast<double>(n_) + 0.5);
  s_ = 2 - HIntegralInverse(HIntegral(2.5) - H(2));
}
double ZipfSampler::H(double x) const { return std::exp(-exponent_ * std::log(x)); }
double ZipfSampler::HIntegral(double x) const {
  const double log_x = std::log(x);
  return Helper2((1 - exponent_) * log_x) * log_x;
}
double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1 - exponent_);
  if (t < -1) t = -1;  // rounding; the exact value is never below -1
  return std::exp(Helper1(t) * x);
}

uint64_t ScrambleId(uint64_t rank, uint64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 1;
  while ((uint64_t{1} << bits) < n) ++bits;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const int shift = bits / 2 + 1;
  // Each step is a bijection of [0, 2^bits): adding, multiplying by an odd
  // number and x ^ (x >> s) all are, mod 2^bits. Walking the cycle until
  // the value is below n again gives a bijection of [0, n); as 2^bits < 2n,
  // fewer than two steps are needed on average.
  uint64_t x = rank;
  do {
    for (int round = 0; round < 3; ++round) {
      x = (x + MixId(key + round)) & mask;
      x = (x * (MixId(key ^ (round + 17)) | 1)) & mask;
      x ^= x >> shift;
    }
  } while (x >= n);
  return x;
}

// ---------------------------------------------------------------- model

PlantedCriteoModel::PlantedCriteoModel(const CriteoSynthOptions& options) : options_(options) {}

double PlantedCriteoModel::FieldWeight(int field, int64_t id) const {
  return options_.field_sigma * NormalOf(KeyOf(options_.seed, kFieldWeight, field, static_cast<uint64_t>(id)));
}
double PlantedCriteoModel::DenseWeight(int j) const {
  return options_.dense_sigma * NormalOf(KeyOf(options_.seed, kDenseWeight, j));
}
double PlantedCriteoModel::FactorComponent(int field, int64_t id, int r) const {
  return options_.factor_sigma * NormalOf(KeyOf(options_.seed, kFactor, field, static_cast<uint64_t>(id), r));
}

double PlantedCriteoModel::Logit(const int64_t* ids, const float* dense) const {
  double logit = options_.bias;
  for (int f = 0; f < kCriteoSparseFields; ++f) logit += FieldWeight(f, ids[f]);
  for (int j = 0; j < kCriteoDenseFields; ++j) logit += DenseWeight(j) * dense[j];
  const int k = options_.factor_fields, rank = options_.factor_rank;
  std::vector<double> u(static_cast<size_t>(k * rank));
  for (int f = 0; f < k; ++f) {
    for (int r = 0; r < rank; ++r) u[f * rank + r] = FactorComponent(f, ids[f], r);
  }
  for (int f = 0; f < k; ++f) {
    for (int g = f + 1; g < k; ++g) {
      for (int r = 0; r < rank; ++r) logit += u[f * rank + r] * u[g * rank + r];
    }
  }
  return logit;
}
double PlantedCriteoModel::Probability(const int64_t* ids, const float* dense) const {
  return Sigmoid(Logit(ids, dense));
}

// ---------------------------------------------------------------- files

namespace {

struct DrawnExample {
  std::string line;
  double probability;
  bool label;
};

// Draws example `index` of a split into `out` (its line without '\n').
void DrawExample(const CriteoSynthOptions& o, const PlantedCriteoModel& model,
                 const std::vector<ZipfSampler>& zipf, Salt split, int64_t index, DrawnExample* out) {
  Stream rng(KeyOf(o.seed, split, static_cast<uint64_t>(index)));
  auto uniform = [&rng] { return rng.Uniform(); };
  float dense[kCriteoDenseFields];
  int64_t ids[kCriteoSparseFields];
  std::string& line = out->line;
  line.clear();
  for (int j = 0; j < kCriteoDenseFields; ++j) {
    dense[j] = 0;
    line += '\t';
    if (rng.Uniform() < o.missing_rate) continue;
    const int64_t x = static_cast<int64_t>(std::floor(std::expm1(std::max(0.0, 1 + 1.5 * rng.Normal()))));
    // Exactly the reader's transform, so the logit a test recomputes from
    // the parsed file matches this one bit for bit.
    dense[j] = static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(x, 0))));
    absl::StrAppend(&line, x);
  }
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    line += '\t';
    if (rng.Uniform() < o.missing_rate) {
      ids[f] = kCriteoMissingId;
      continue;
    }
    const uint64_t rank = zipf[f].Sample(uniform);
    ids[f] = static_cast<int64_t>(ScrambleId(rank, o.id_space[f], KeyOf(o.seed, kScramble, f)));
    absl::StrAppend(&line, absl::Hex(ids[f], absl::kZeroPad8));
  }
  out->probability = model.Probability(ids, dense);
  out->label = rng.Uniform() < out->probability;
  line.insert(0, out->label ? "1" : "0");
}

// Draws a split; writes it to `path` unless empty. Appends the
// probabilities and labels when `probabilities` is not null.
absl::Status WriteSplit(const CriteoSynthOptions& o, Salt split, int64_t examples, const std::string& path,
                        int64_t* positives, std::vector<double>* probabilities, std::vector<float>* labels) {
  const PlantedCriteoModel model(o);
  std::vector<ZipfSampler> zipf;
  for (int f = 0; f < kCriteoSparseFields; ++f) zipf.emplace_back(o.id_space[f], o.zipf);
  const std::string tmp = path + ".tmp";
  gzFile out = nullptr;
  if (!path.empty()) {
    // "T": zlib writes the bytes as they are (no gzip), one code path for both.
    out = gzopen(tmp.c_str(), o.gzip ? "wb6" : "wbT");
    if (out == nullptr) return ErrnoToStatus(errno != 0 ? errno : ENOMEM, "cannot create", tmp);
    gzbuffer(out, 1 << 20);
  }
  *positives = 0;
  DrawnExample ex;
  for (int64_t i = 0; i < examples; ++i) {
    DrawExample(o, model, zipf, split, i, &ex);
    *positives += ex.label;
    if (probabilities != nullptr) {
      probabilities->push_back(ex.probability);
      labels->push_back(ex.label ? 1.0f : 0.0f);
    }
    if (out == nullptr) continue;
    ex.line += '\n';
    if (gzwrite(out, ex.line.data(), static_cast<unsigned>(ex.line.size())) != static_cast<int>(ex.line.size())) {
      int err = 0;
      const std::string msg = gzerror(out, &err);
      gzclose(out);
      return absl::ResourceExhaustedError(absl::StrCat("cannot write ", Quote(tmp, 200), ": ", msg));
    }
  }
  if (out == nullptr) return absl::OkStatus();
  if (gzclose(out) != Z_OK) return absl::ResourceExhaustedError(absl::StrCat("cannot finish ", Quote(tmp, 200)));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoToStatus(errno, "cannot rename into place", path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CriteoSynthMeta> WriteCriteoSynth(const CriteoSynthOptions& options, const std::string& train_path,
                                                 const std::string& test_path, const std::string& meta_path) {
  if (absl::Status s = ValidateCriteoSynthOptions(options); !s.ok()) return s;
  CriteoSynthMeta meta;
  meta.options = options;
  if (absl::Status s = WriteSplit(options, kTrain, options.train_examples, train_path, &meta.train_positives,
                                  nullptr, nullptr);
      !s.ok()) {
    return s;
  }
  // The test set's probabilities are kept (12 bytes an example, bounded by
  // kMaxCriteoSynthTestExamples) for the exact Bayes AUC.
  std::vector<double> probabilities;
  std::vector<float> labels;
  probabilities.reserve(static_cast<size_t>(options.test_examples));
  labels.reserve(static_cast<size_t>(options.test_examples));
  if (absl::Status s = WriteSplit(options, kTest, options.test_examples, test_path, &meta.test_positives,
                                  &probabilities, &labels);
      !s.ok()) {
    return s;
  }
  double sum = 0;
  for (double p : probabilities) sum += p;
  meta.test_mean_probability = probabilities.empty() ? 0 : sum / static_cast<double>(probabilities.size());
  // Undefined (one class, or no examples) is written as nan, not refused:
  // a tiny smoke-test set is still a data set.
  absl::StatusOr<double> auc = Auc(probabilities, labels);
  meta.bayes_auc = auc.ok() ? *auc : std::nan("");
  absl::StatusOr<double> log_loss = LogLoss(probabilities, labels);
  meta.bayes_log_loss = log_loss.ok() ? *log_loss : std::nan("");
  if (meta_path.empty()) return meta;
  if (absl::Status s = WriteFileAtomically(meta_path, FormatCriteoSynthMeta(meta)); !s.ok()) return s;
  return meta;
}

// ---------------------------------------------------------------- meta

namespace {

// One line of the meta file: its name, how it prints and how it parses.
struct MetaField {
  const char* name;
  std::function<std::string()> format;
  std::function<bool(absl::string_view)> parse;
};

MetaField DoubleField(const char* name, double* v) {
  return {name, [v] { return absl::StrFormat("%.17g", *v); },
          [v](absl::string_view s) { return absl::SimpleAtod(s, v); }};
}
template <typename Int>
MetaField IntField(const char* name, Int* v) {
  return {name, [v] { return absl::StrCat(*v); }, [v](absl::string_view s) { return absl::SimpleAtoi(s, v); }};
}

// Every field, in the order they are written; both directions use it, so
// a field added here is written and read back.
std::vector<MetaField> MetaFields(CriteoSynthMeta* m) {
  CriteoSynthOptions* o = &m->options;
  return {
      DoubleField("bayes_auc", &m->bayes_auc),
      DoubleField("bayes_log_loss", &m->bayes_log_loss),
      DoubleField("test_mean_probability", &m->test_mean_probability),
      IntField("test_positives", &m->test_positives),
      IntField("train_positives", &m->train_positives),
      IntField("train_examples", &o->train_examples),
      IntField("test_examples", &o->test_examples),
      {"id_space", [o] { return absl::StrJoin(o->id_space, ","); },
       [o](absl::string_view s) {
         std::vector<absl::string_view> parts = absl::StrSplit(s, ',');
         if (parts.size() != o->id_space.size()) return false;
         for (size_t f = 0; f < parts.size(); ++f) {
           if (!absl::SimpleAtoi(parts[f], &o->id_space[f])) return false;
         }
         return true;
       }},
      DoubleField("zipf", &o->zipf),
      IntField("seed", &o->seed),
      DoubleField("missing_rate", &o->missing_rate),
      DoubleField("bias", &o->bias),
      DoubleField("field_sigma", &o->field_sigma),
      DoubleField("dense_sigma", &o->dense_sigma),
      IntField("factor_fields", &o->factor_fields),
      IntField("factor_rank", &o->factor_rank),
      DoubleField("factor_sigma", &o->factor_sigma),
      {"gzip", [o] { return std::string(o->gzip ? "1" : "0"); },
       [o](absl::string_view s) {
         if (s != "0" && s != "1") return false;
         o->gzip = s == "1";
         return true;
       }},
  };
}

}  // namespace

std::string FormatCriteoSynthMeta(const CriteoSynthMeta& meta) {
  CriteoSynthMeta copy = meta;
  std::string out =
      "# A Criteo-format data set drawn from a planted model (worker/criteo_synth.h).\n"
      "# bayes_auc, bayes_log_loss: those of the test file's true probabilities, the best any model can do.\n";
  for (const MetaField& field : MetaFields(&copy)) absl::StrAppend(&out, field.name, " ", field.format(), "\n");
  return out;
}

absl::StatusOr<CriteoSynthMeta> ReadCriteoSynthMeta(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, 64 << 10);
  if (!text.ok()) return text.status();
  CriteoSynthMeta meta;
  std::vector<MetaField> fields = MetaFields(&meta);
  std::vector<bool> seen(fields.size(), false);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quote(path, 200), ":", line_number, ": ", what, ": \"", Quote(line, 80), "\""));
    };
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos) return error("not \"name value\"");
    const absl::string_view name = line.substr(0, space);
    const absl::string_view value = absl::StripLeadingAsciiWhitespace(line.substr(space + 1));
    size_t k = 0;
    while (k < fields.size() && name != fields[k].name) ++k;
    if (k == fields.size()) return error("unknown name");
    if (!fields[k].parse(value)) return error("bad value");
    seen[k] = true;
  }
  for (size_t k = 0; k < fields.size(); ++k) {
    if (!seen[k]) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(path, 200), ": has no ", fields[k].name, " line"));
    }
  }
  return meta;
}

}  // namespace pstrain
