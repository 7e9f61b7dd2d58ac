// A set of named tensors as a file Python's torch.load reads (torch.save's
// format): a model's final weights, a QAT checkpoint's quantizers.
#ifndef PSTRAIN_COMMON_WEIGHTS_FILE_H_
#define PSTRAIN_COMMON_WEIGHTS_FILE_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// torch.save's format (a zip archive: the pickle in data.pkl, each tensor's
// bytes in data/<n>) of a dict of parameter name to tensor.
absl::StatusOr<std::string> SerializeWeights(const NamedTensors& params);
// The same, written atomically to `path`.
absl::Status SaveWeights(const NamedTensors& params, const std::string& path);

// A torch.save file of a dict of name -> tensor (what SaveWeights writes, or
// torch.save(model.state_dict()) in Python); INVALID_ARGUMENT for anything
// else. `what` names the bytes in errors.
absl::StatusOr<NamedTensors> ParseWeights(absl::string_view bytes, const std::string& what);
absl::StatusOr<NamedTensors> ReadWeightsFile(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_WEIGHTS_FILE_H_
