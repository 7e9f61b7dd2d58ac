#include "common/dtype.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pstrain {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DT_FLOAT32: return 4;
    case DT_FLOAT64: return 8;
    case DT_FLOAT16: return 2;
    case DT_BFLOAT16: return 2;
    case DT_INT32: return 4;
    case DT_INT64: return 8;
    case DT_UINT8: return 1;
    case DT_BOOL: return 1;
    default: return 0;
  }
}

std::string DataTypeName(DataType dtype) {
  switch (dtype) {
    case DT_FLOAT32: return "float32";
    case DT_FLOAT64: return "float64";
    case DT_FLOAT16: return "float16";
    case DT_BFLOAT16: return "bfloat16";
    case DT_INT32: return "int32";
    case DT_INT64: return "int64";
    case DT_UINT8: return "uint8";
    case DT_BOOL: return "bool";
    default: return absl::StrCat("invalid(", static_cast<int>(dtype), ")");
  }
}

absl::StatusOr<size_t> ExpectedBytes(DataType dtype, const std::vector<int64_t>& shape) {
  size_t elem = DataTypeSize(dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", DataTypeName(dtype)));
  }
  // Keep the total below 2^62 bytes so no product overflows.
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t n = elem;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d, " in shape [",
                                                     absl::StrJoin(shape, ", "), "]"));
    }
    if (d != 0 && n > kLimit / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] is too large"));
    }
    n *= static_cast<uint64_t>(d);
  }
  return static_cast<size_t>(n);
}

}  // namespace pstrain
