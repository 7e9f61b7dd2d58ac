#include "worker/int8_job_export.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "quantize/int8_export.h"
#include "spdlog/spdlog.h"

namespace pstrain {

absl::StatusOr<std::string> WriteInt8Export(const JobSpec& spec, const NamedTensors& weights,
                                            const at::Tensor& calibration, const std::string& path) {
  auto mode = ParseInt8Mode(spec.quantization.export_mode);
  if (!mode.ok()) return mode.status();
  const std::string model = spec.model == "lenet" ? "lenet" : "mlp";  // mlp_wide: an mlp of other widths
  Int8Options options;
  options.per_channel_weights = spec.quantization.weights == "per_channel";
  bool learned = false;
  if (*mode == Int8Mode::kStatic) {
    auto qat = UseLearnedQParams(model, weights, &options);
    if (!qat.ok()) return qat.status();
    learned = *qat;
    if (!learned) options.calibration = calibration.to(at::kCPU, at::kFloat).contiguous();
  }
  auto int8 = BuildInt8Module(model, weights, *mode, options);
  if (!int8.ok()) return int8.status();
  if (absl::Status s = WriteFileAtomically(path, int8->bytes); !s.ok()) return s;
  return absl::StrCat(spec.quantization.export_mode, " int8 model ", path, " (", int8->bytes.size(), " bytes, ",
                      *mode != Int8Mode::kStatic ? "weights only"
                      : learned                  ? "the QAT job's learned scales"
                                                 : absl::StrCat(options.calibration.size(0), " examples calibrated"),
                      ", engine ", options.engine, ")");
}

absl::StatusOr<std::string> WriteJobWeights(const JobSpec& spec, const NamedTensors& weights, const Dataset& train) {
  std::filesystem::create_directories(spec.output_dir);
  const std::string path = spec.output_dir + "/model.pt";
  if (absl::Status s = SaveWeights(weights, path); !s.ok()) return s;
  if (spec.quantization.export_mode.empty()) return path;
  const int64_t n = std::min<int64_t>(spec.quantization.calibration, train.size());
  auto int8 = WriteInt8Export(spec, weights, train.Normalize(train.inputs.narrow(0, 0, n)),
                              spec.output_dir + "/model-int8.pt");
  if (!int8.ok()) return int8.status();
  spdlog::info("rank 0: {}", *int8);
  return path;
}

}  // namespace pstrain
