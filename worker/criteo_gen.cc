// criteo_gen: writes a Criteo-format data set drawn from a planted model
// (worker/criteo_synth.h), for tests and benchmarks with no network.
//
//   criteo_gen --out_train=train.tsv --out_test=test.tsv --out_meta=meta.txt
//              --train_examples=1000000 --test_examples=100000 --id_space=1e6 --zipf=1.05 --seed=1 [--gzip]
//
// The meta file holds the options, the label counts and the test file's
// Bayes AUC and log loss. Exit status 0 on success, 2 on bad flags, 1 when
// a file cannot be written.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/criteo_synth.h"

// The flags' defaults are the options' own, stated once (criteo_synth.h).
static const pstrain::CriteoSynthOptions kDefaults;

ABSL_FLAG(std::string, out_train, "", "The training file (empty: not written).");
ABSL_FLAG(std::string, out_test, "", "The held-out file (empty: not written).");
ABSL_FLAG(std::string, out_meta, "", "The meta file: options, counts, Bayes AUC and log loss (empty: not written).");
ABSL_FLAG(int64_t, train_examples, kDefaults.train_examples, "Lines of the training file.");
ABSL_FLAG(int64_t, test_examples, kDefaults.test_examples, "Lines of the held-out file.");
ABSL_FLAG(std::string, id_space, "1e6",
          "Ids per categorical field, in [1, 2^32]: one number for every field, or 26 comma-separated.");
ABSL_FLAG(double, zipf, kDefaults.zipf, "The Zipf exponent of each field's id popularity (> 0).");
ABSL_FLAG(uint64_t, seed, kDefaults.seed, "Everything drawn is a function of the seed and the options.");
ABSL_FLAG(double, missing_rate, kDefaults.missing_rate, "The chance that a feature cell is left empty.");
ABSL_FLAG(double, bias, kDefaults.bias, "The planted model's bias (logit).");
ABSL_FLAG(double, field_sigma, kDefaults.field_sigma, "The standard deviation of the per-id weights.");
ABSL_FLAG(double, dense_sigma, kDefaults.dense_sigma, "The standard deviation of the dense features' weights.");
ABSL_FLAG(int, factor_fields, kDefaults.factor_fields, "The first this many fields interact pairwise (0: no interaction).");
ABSL_FLAG(int, factor_rank, kDefaults.factor_rank, "The rank of the interaction's factors.");
ABSL_FLAG(double, factor_sigma, kDefaults.factor_sigma, "The standard deviation of the factors' components.");
ABSL_FLAG(bool, gzip, kDefaults.gzip, "Write the data files gzip-compressed.");

namespace {

// "1e6" or 26 such numbers, each a whole number in [1, 2^32].
bool ParseIdSpace(const std::string& text, std::array<uint64_t, pstrain::kCriteoSparseFields>* out,
                  std::string* error) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 1 && parts.size() != out->size()) {
    *error = absl::StrCat("--id_space has ", parts.size(), " values; give 1 or ", out->size());
    return false;
  }
  for (size_t f = 0; f < out->size(); ++f) {
    const std::string& part = parts[parts.size() == 1 ? 0 : f];
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !(v >= 1 && v <= 4294967296.0) || v != std::floor(v)) {
      *error = absl::StrCat("--id_space value \"", part.substr(0, 40), "\" is not a whole number in [1, 2^32]");
      return false;
    }
    (*out)[f] = static_cast<uint64_t>(v);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pstrain::CriteoSynthOptions options;
  options.train_examples = absl::GetFlag(FLAGS_train_examples);
  options.test_examples = absl::GetFlag(FLAGS_test_examples);
  options.zipf = absl::GetFlag(FLAGS_zipf);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.missing_rate = absl::GetFlag(FLAGS_missing_rate);
  options.bias = absl::GetFlag(FLAGS_bias);
  options.field_sigma = absl::GetFlag(FLAGS_field_sigma);
  options.dense_sigma = absl::GetFlag(FLAGS_dense_sigma);
  options.factor_fields = absl::GetFlag(FLAGS_factor_fields);
  options.factor_rank = absl::GetFlag(FLAGS_factor_rank);
  options.factor_sigma = absl::GetFlag(FLAGS_factor_sigma);
  options.gzip = absl::GetFlag(FLAGS_gzip);
  std::string error;
  if (!ParseIdSpace(absl::GetFlag(FLAGS_id_space), &options.id_space, &error)) {
    std::fprintf(stderr, "criteo_gen: %s\n", error.c_str());
    return 2;
  }
  if (absl::Status s = pstrain::ValidateCriteoSynthOptions(options); !s.ok()) {
    std::fprintf(stderr, "criteo_gen: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<pstrain::CriteoSynthMeta> meta = pstrain::WriteCriteoSynth(
      options, absl::GetFlag(FLAGS_out_train), absl::GetFlag(FLAGS_out_test), absl::GetFlag(FLAGS_out_meta));
  if (!meta.ok()) {
    std::fprintf(stderr, "criteo_gen: %s\n", std::string(meta.status().message()).c_str());
    return 1;
  }
  std::printf("train: %lld examples, %lld positive; test: %lld examples, %lld positive; "
              "Bayes AUC %.4f, Bayes log loss %.4f\n",
              static_cast<long long>(options.train_examples), static_cast<long long>(meta->train_positives),
              static_cast<long long>(options.test_examples), static_cast<long long>(meta->test_positives),
              meta->bayes_auc, meta->bayes_log_loss);
  return 0;
}
