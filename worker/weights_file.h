// A model's final weights as a file Python's torch.load reads.
#ifndef PSTRAIN_WORKER_WEIGHTS_FILE_H_
#define PSTRAIN_WORKER_WEIGHTS_FILE_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace pstrain {

// torch.save's format (a zip archive: the pickle in data.pkl, each tensor's
// bytes in data/<n>) of a dict of parameter name to tensor, written
// atomically to `path`.
absl::Status SaveWeights(const std::vector<std::pair<std::string, at::Tensor>>& params, const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_WEIGHTS_FILE_H_
