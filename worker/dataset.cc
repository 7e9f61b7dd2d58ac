#include "worker/dataset.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>

#include <cstring>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"

namespace pstrain {
namespace {

uint32_t BigEndian32(const std::string& s, size_t off) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + off);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Parses an IDX header; returns the dimensions after checking that the data
// that follows has exactly the size they imply.
absl::StatusOr<std::vector<int64_t>> IdxDims(const std::string& data, const std::string& path,
                                             int want_dims) {
  if (data.size() < 4) return absl::DataLossError(absl::StrCat(path, ": too short for an IDX file"));
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  if (p[0] != 0 || p[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an IDX file (bad magic number)"));
  }
  if (p[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": element type 0x", absl::Hex(p[2]), " is not unsigned byte (0x08)"));
  }
  if (p[3] != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": has ", int{p[3]}, " dimensions, expected ",
                                                   want_dims));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(want_dims);
  if (data.size() < header) return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  std::vector<int64_t> dims;
  uint64_t total = 1;
  for (int i = 0; i < want_dims; ++i) {
    dims.push_back(BigEndian32(data, 4 + 4 * i));
    total *= static_cast<uint64_t>(dims.back());
  }
  if (data.size() - header != total) {
    return absl::DataLossError(absl::StrCat(path, ": holds ", data.size() - header,
                                            " bytes of data but its header promises ", total,
                                            data.size() - header < total ? " (truncated)" : ""));
  }
  return dims;
}

Dataset Limit(Dataset d, int64_t limit) {
  if (limit > 0 && limit < d.size()) {
    d.inputs = d.inputs.narrow(0, 0, limit).clone();
    d.labels = d.labels.narrow(0, 0, limit).clone();
  }
  return d;
}

}  // namespace

at::Tensor Dataset::Normalize(const at::Tensor& rows) const {
  if (rows.scalar_type() != at::kByte) return rows;
  return rows.to(at::kFloat).div_(255.0).sub_(mean).div_(std);
}

absl::StatusOr<Dataset> LoadIdx(const DataRoot& root, const std::string& images_path,
                                const std::string& labels_path, double mean, double std, int64_t limit,
                                int64_t num_classes) {
  absl::StatusOr<std::string> images = ReadDataFile(root, images_path, /*maybe_gzip=*/true);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels = ReadDataFile(root, labels_path, /*maybe_gzip=*/true);
  if (!labels.ok()) return labels.status();
  auto idims = IdxDims(*images, images_path, 3);
  if (!idims.ok()) return idims.status();
  auto ldims = IdxDims(*labels, labels_path, 1);
  if (!ldims.ok()) return ldims.status();
  const int64_t n = (*idims)[0], rows = (*idims)[1], cols = (*idims)[2];
  if ((*ldims)[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, " has ", (*ldims)[0], " labels but ",
                                                   images_path, " has ", n, " images"));
  }
  const auto* lp = reinterpret_cast<const uint8_t*>(labels->data() + 8);
  for (int64_t i = 0; i < n; ++i) {
    if (lp[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{lp[i]}, " at index ",
                                                     i, " is not below num_classes ", num_classes));
    }
  }
  Dataset d;
  at::Tensor raw = at::from_blob(const_cast<char*>(images->data() + 16), {n, 1, rows, cols}, at::kByte);
  d.inputs = raw.clone();  // the bytes; Normalize makes floats of a batch
  d.mean = mean;
  d.std = std;
  d.labels = at::from_blob(const_cast<uint8_t*>(lp), {n}, at::kByte).to(at::kLong);
  return Limit(std::move(d), limit);
}

absl::StatusOr<Dataset> LoadCsv(const DataRoot& root, const std::string& path, double mean, double std,
                                int64_t limit, int64_t num_classes) {
  absl::StatusOr<std::string> text = ReadDataFile(root, path, /*maybe_gzip=*/true);
  if (!text.ok()) return text.status();
  std::istringstream in(std::move(*text));
  std::vector<float> values;
  std::vector<int64_t> labels;
  size_t columns = 0;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty()) continue;
    std::vector<absl::string_view> cells = absl::StrSplit(text, ',');
    std::vector<double> row;
    bool numeric = true;
    for (absl::string_view c : cells) {
      double v;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(c), &v)) {
        numeric = false;
        break;
      }
      row.push_back(v);
    }
    if (!numeric) {
      if (labels.empty() && columns == 0) {
        columns = cells.size();  // a header row
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": not a number"));
    }
    if (columns == 0) columns = row.size();
    if (row.size() != columns || columns < 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", row.size(),
                                                     " columns where the file has ", columns));
    }
    const double label = row.back();
    if (label != static_cast<int64_t>(label) || label < 0 || label >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": label ", label,
                                                     " is not an integer in [0, ", num_classes, ")"));
    }
    for (size_t i = 0; i + 1 < row.size(); ++i) values.push_back(static_cast<float>((row[i] - mean) / std));
    labels.push_back(static_cast<int64_t>(label));
    if (limit > 0 && static_cast<int64_t>(labels.size()) >= limit) break;
  }
  if (labels.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows"));
  Dataset d;
  const int64_t n = static_cast<int64_t>(labels.size());
  d.inputs = at::from_blob(values.data(), {n, static_cast<int64_t>(columns - 1)}, at::kFloat).clone();
  d.labels = at::from_blob(labels.data(), {n}, at::kLong).clone();
  return d;
}

Dataset MakeSynthetic(int64_t n, int64_t classes, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor prototypes = at::randn({classes, 1, 28, 28}, gen);
  Dataset d;
  d.labels = at::arange(n, at::kLong).remainder(classes);
  d.inputs = prototypes.index_select(0, d.labels).add_(at::randn({n, 1, 28, 28}, gen).mul_(1.5));
  return d;
}

absl::StatusOr<TrainTest> LoadData(const DataSpec& spec, uint64_t seed, const DataRoot& root) {
  TrainTest out;
  if (spec.format == "synthetic") {
    // Train and test come from the same class prototypes (same seed), with
    // different noise (the test set is the tail of one larger draw).
    Dataset all = MakeSynthetic(spec.synthetic_train + spec.synthetic_test, spec.num_classes, seed);
    out.train.inputs = all.inputs.narrow(0, 0, spec.synthetic_train);
    out.train.labels = all.labels.narrow(0, 0, spec.synthetic_train);
    out.test.inputs = all.inputs.narrow(0, spec.synthetic_train, spec.synthetic_test);
    out.test.labels = all.labels.narrow(0, spec.synthetic_train, spec.synthetic_test);
    return out;
  }
  if (spec.format == "csv") {
    auto train = LoadCsv(root, spec.train_csv, spec.mean, spec.std, spec.limit_train, spec.num_classes);
    if (!train.ok()) return train.status();
    auto test = LoadCsv(root, spec.test_csv, spec.mean, spec.std, spec.limit_test, spec.num_classes);
    if (!test.ok()) return test.status();
    if (train->inputs.size(1) != test->inputs.size(1)) {
      return absl::InvalidArgumentError(absl::StrCat(spec.test_csv, " has ", test->inputs.size(1),
                                                     " features but ", spec.train_csv, " has ",
                                                     train->inputs.size(1)));
    }
    out.train = std::move(*train);
    out.test = std::move(*test);
    return out;
  }
  // data.dir relative to the root ("." the root itself), the files in it,
  // each checked before they are joined ("dir" + "/abs" is no absolute name).
  for (const auto& [field, name] : {std::pair<const char*, const std::string&>{"data.dir", spec.dir},
                                    {"data.train_images", spec.train_images},
                                    {"data.train_labels", spec.train_labels},
                                    {"data.test_images", spec.test_images},
                                    {"data.test_labels", spec.test_labels}}) {
    if (name == "." && std::string(field) == "data.dir") continue;
    absl::Status s = CheckRelativeName(name, kDataRootName);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
  }
  auto path = [&](const std::string& f) { return spec.dir == "." ? f : spec.dir + "/" + f; };
  auto train = LoadIdx(root, path(spec.train_images), path(spec.train_labels), spec.mean, spec.std,
                       spec.limit_train, spec.num_classes);
  if (!train.ok()) return train.status();
  auto test = LoadIdx(root, path(spec.test_images), path(spec.test_labels), spec.mean, spec.std,
                      spec.limit_test, spec.num_classes);
  if (!test.ok()) return test.status();
  out.train = std::move(*train);
  out.test = std::move(*test);
  return out;
}

}  // namespace pstrain
