// The built-in models of worker/model.cc as layer lists, for the code that
// rebuilds their forward with quantization (quantize/int8_export,
// quantize/qat_network). No LibTorch.
#ifndef PSTRAIN_QUANTIZE_BUILTIN_LAYERS_H_
#define PSTRAIN_QUANTIZE_BUILTIN_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

// One Linear or Conv2d layer, in forward order, with what follows it.
struct QuantLayer {
  std::string name;             // its parameters are <name>.weight, <name>.bias
  bool conv = false;            // Conv2d (stride 1) or Linear
  int64_t padding = 0;          // Conv2d
  bool relu = false;            // a ReLU after it
  bool pool = false;            // then a 2x2 max-pool
  bool flatten_before = false;  // x.flatten(1) before it
};

// "mlp", "mlp_wide", "lenet"; INVALID_ARGUMENT naming the known ones.
inline absl::StatusOr<std::vector<QuantLayer>> BuiltinLayers(const std::string& model) {
  if (model == "mlp" || model == "mlp_wide") {
    return std::vector<QuantLayer>{{"fc1", false, 0, true, false, true}, {"fc2", false, 0, true}, {"fc3"}};
  }
  if (model == "lenet") {
    return std::vector<QuantLayer>{{"conv1", true, 2, true, true},
                                   {"conv2", true, 0, true, true},
                                   {"fc1", false, 0, true, false, true},
                                   {"fc2", false, 0, true},
                                   {"fc3"}};
  }
  std::string shown = model.substr(0, 64);
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return absl::InvalidArgumentError(
      absl::StrCat("quantization knows the built-in models mlp, mlp_wide and lenet, not '", shown,
                   "' (a torchscript model's layers are not known to it yet)"));
}

}  // namespace pstrain

#endif  // PSTRAIN_QUANTIZE_BUILTIN_LAYERS_H_
