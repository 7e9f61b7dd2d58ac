// Training data for the worker: MNIST-format IDX files (gzip or raw), CSV
// files, or synthetic class blobs. Inputs are (N, 1, 28, 28) for images or
// (N, F) for CSV; labels int64 (N). IDX images stay the file's bytes (uint8:
// 47 MB for Fashion-MNIST's training set instead of 188 MB as float32) and
// are normalised per batch, on the training device, by Normalize.
// A truncated, corrupt or mismatched file is refused with a message that
// names the file and what is wrong.
#ifndef PSTRAIN_WORKER_DATASET_H_
#define PSTRAIN_WORKER_DATASET_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/data_root.h"

namespace pstrain {

struct Dataset {
  at::Tensor inputs;  // float32, normalised; or uint8 (IDX images), see Normalize
  at::Tensor labels;  // int64
  double mean = 0, std = 1;  // uint8 inputs become (x / 255 - mean) / std
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  // Rows of `inputs` (gathered, then copied wherever they train) as float32
  // model inputs.
  at::Tensor Normalize(const at::Tensor& rows) const;
};

// Files are named relative to `root` and read by ReadDataFile's rules
// (worker/data_root.h), gunzipped when they are gzip.
//
// Reads an IDX images file (magic 0x00000803, ubyte, N x rows x cols) and an
// IDX labels file (0x00000801, ubyte, N). `limit` > 0 keeps the first N.
absl::StatusOr<Dataset> LoadIdx(const DataRoot& root, const std::string& images_path,
                                const std::string& labels_path, double mean, double std, int64_t limit,
                                int64_t num_classes);

// Numeric CSV: every row the same number of columns, the last one the label
// (an integer in [0, num_classes)). A first row that is not numeric is taken
// as a header and skipped.
absl::StatusOr<Dataset> LoadCsv(const DataRoot& root, const std::string& path, double mean, double std,
                                int64_t limit, int64_t num_classes);

// `n` 28x28 images in `classes` classes: a fixed random prototype per class
// plus noise, deterministic in `seed`.
Dataset MakeSynthetic(int64_t n, int64_t classes, uint64_t seed);

struct TrainTest {
  Dataset train;
  Dataset test;
};
// idx: <data.dir>/<file> under `root` ("." for data.dir: the root itself);
// csv: data.train_csv and data.test_csv under `root`; synthetic reads no
// file (the default root, with no directory, refuses every file).
absl::StatusOr<TrainTest> LoadData(const DataSpec& spec, uint64_t seed, const DataRoot& root = DataRoot{});

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATASET_H_
