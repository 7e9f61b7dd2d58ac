// A job's final weights files, which rank 0 writes at the job's end:
// model.pt, and the int8 model (spec `quantization: {export:
// dynamic|static}`): rank 0 converts its final weights with quantize/int8_export --
// a QAT job's with its learned scales, others' static ones calibrated on
// the first `calibration` training examples -- and writes the TorchScript
// module beside model.pt, as `pstrain export --quantize` would.
#ifndef PSTRAIN_WORKER_INT8_JOB_EXPORT_H_
#define PSTRAIN_WORKER_INT8_JOB_EXPORT_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/weights_file.h"
#include "worker/dataset.h"

namespace pstrain {

// Writes `path` from `weights` (the parameters and any QAT quantizers);
// `calibration`: the first training examples (N, ...), as the model sees
// them (normalised), for a static export without learned scales. A line
// that says what was written.
absl::StatusOr<std::string> WriteInt8Export(const JobSpec& spec, const NamedTensors& weights,
                                            const at::Tensor& calibration, const std::string& path);

// <output_dir>/model.pt from `weights` (the parameters and any QAT
// quantizers), and model-int8.pt beside it where the spec asks, calibrated
// on the first training examples of `train`. Returns model.pt's path.
absl::StatusOr<std::string> WriteJobWeights(const JobSpec& spec, const NamedTensors& weights, const Dataset& train);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_INT8_JOB_EXPORT_H_
