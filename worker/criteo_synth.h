// A Criteo-format data set drawn from a planted model, so that tests and
// benchmarks have click logs with no network and with a known best answer.
//
// Each example (line) is drawn from its own counter-based stream of
// (seed, split, index): the files depend only on the options, and any
// example can be redrawn alone. Per example:
//  - each of the 13 counts is missing with probability missing_rate, else
//    floor(expm1(max(0, 1 + 1.5 z))) for z ~ N(0, 1): heavy-tailed counts,
//    as Criteo's are;
//  - each of the 26 ids is missing with probability missing_rate, else a
//    Zipf(zipf) rank over [0, id_space[f]) (rank 0 most popular), mapped
//    through ScrambleId so that popular ids are spread over the id space,
//    written as 8 lower-case hex digits, as Criteo writes its hashes;
//  - the label is Bernoulli(sigmoid(logit)), with the planted logit
//      bias + sum_f w_f(id_f) + v . dense
//           + sum_{f < g < factor_fields} <u_f(id_f), u_g(id_g)>
//    where dense is what CriteoReader yields (log(1 + x), 0 when missing),
//    a missing id is kCriteoMissingId with weights of its own, and w_f(id)
//    ~ N(0, field_sigma^2), v_j ~ N(0, dense_sigma^2), u_f(id) ~
//    N(0, factor_sigma^2 I) of factor_rank dimensions are functions of
//    (seed, field, id) alone (PlantedCriteoModel), never stored.
// The Bayes AUC and log loss of the test file (those of the true
// probabilities: the best any model can do) go to the meta file.
#ifndef PSTRAIN_WORKER_CRITEO_SYNTH_H_
#define PSTRAIN_WORKER_CRITEO_SYNTH_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/criteo_data.h"

namespace pstrain {

struct CriteoSynthOptions {
  int64_t train_examples = 100000;
  int64_t test_examples = 20000;  // at most kMaxCriteoSynthTestExamples
  std::array<uint64_t, kCriteoSparseFields> id_space;  // per field, in [1, 2^32]; 10^6 each by default
  double zipf = 1.05;     // the exponent, > 0
  uint64_t seed = 1;
  double missing_rate = 0.02;
  // The defaults give about what Criteo's Kaggle set has: 25% of labels 1,
  // and a Bayes AUC near 0.79 and log loss near 0.45 (the best published
  // models reach about 0.80 and 0.44 on the real data).
  double bias = -1.5;
  double field_sigma = 0.2;
  double dense_sigma = 0.1;
  int factor_fields = 4;  // the first factor_fields fields interact pairwise; 0: none
  int factor_rank = 4;
  double factor_sigma = 0.35;
  bool gzip = false;

  CriteoSynthOptions() { id_space.fill(1000000); }
};

// The test set's probabilities are kept in memory (8 bytes each) for the
// exact Bayes AUC.
inline constexpr int64_t kMaxCriteoSynthTestExamples = int64_t{100} << 20;

// INVALID_ARGUMENT naming the first option out of range.
absl::Status ValidateCriteoSynthOptions(const CriteoSynthOptions& options);

// Ranks in [0, n) with P(k) proportional to (k + 1)^-exponent, by
// Hörmann and Derflinger's rejection-inversion (as Apache Commons RNG's
// RejectionInversionZipfSampler): O(1) per draw and no table, so n may be
// 2^32. Needs n >= 1 and exponent > 0.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double exponent);
  // `uniform` returns independent draws from [0, 1).
  template <typename Uniform>
  uint64_t Sample(Uniform&& uniform) const {
    while (true) {
      const double u = h_integral_n_ + uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double k = std::floor(x + 0.5);
      k = k < 1 ? 1 : k > static_cast<double>(n_) ? static_cast<double>(n_) : k;
      if (k - x <= s_ || u >= HIntegral(k + 0.5) - H(k)) return static_cast<uint64_t>(k) - 1;
    }
  }

 private:
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;
  uint64_t n_;
  double exponent_, h_integral_x1_, h_integral_n_, s_;
};

// A bijection of [0, n) onto itself keyed by `key` (an invertible mix on
// the smallest power of two >= n, cycle-walked back into range), so Zipf's
// popular ranks land anywhere in the id space. n in [1, 2^32].
uint64_t ScrambleId(uint64_t rank, uint64_t n, uint64_t key);

// The planted model's parameters and logit; cheap to construct (nothing is
// stored: every weight is recomputed from the seed).
class PlantedCriteoModel {
 public:
  explicit PlantedCriteoModel(const CriteoSynthOptions& options);
  double FieldWeight(int field, int64_t id) const;
  double DenseWeight(int j) const;
  double FactorComponent(int field, int64_t id, int r) const;
  // `ids` and `dense` as one example of a CriteoBatch holds them.
  double Logit(const int64_t* ids, const float* dense) const;
  double Probability(const int64_t* ids, const float* dense) const;

 private:
  CriteoSynthOptions options_;
};

struct CriteoSynthMeta {
  CriteoSynthOptions options;
  int64_t train_positives = 0;
  int64_t test_positives = 0;
  double test_mean_probability = 0;
  double bayes_auc = 0;       // of the test file's true probabilities
  double bayes_log_loss = 0;  // likewise (natural log)
};

// Writes the train and test files (gzip when options.gzip) and the meta
// file, each to a temporary name renamed into place when complete. An empty
// path skips that file; the test set is drawn either way, and its Bayes
// figures returned (nan when undefined: no examples, or one class only).
absl::StatusOr<CriteoSynthMeta> WriteCriteoSynth(const CriteoSynthOptions& options, const std::string& train_path,
                                                 const std::string& test_path, const std::string& meta_path);

// The meta file: one "name value" per line, '#' comments; what
// ReadCriteoSynthMeta takes back (unknown names are refused).
std::string FormatCriteoSynthMeta(const CriteoSynthMeta& meta);
absl::StatusOr<CriteoSynthMeta> ReadCriteoSynthMeta(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CRITEO_SYNTH_H_
