// Element types of the wire (pstrain.DataType): sizes, names, and the byte
// count a shape needs, with overflow and negative dimensions refused. Plain
// arithmetic that the partition plan, the tensor buffer and the codecs share.
#ifndef PSTRAIN_COMMON_DTYPE_H_
#define PSTRAIN_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

namespace pstrain {

// Bytes per element of `dtype`; 0 for DT_INVALID or an unknown value.
size_t DataTypeSize(DataType dtype);
// "float32", "int64", ...; "invalid(N)" for anything else.
std::string DataTypeName(DataType dtype);
// Number of bytes that `shape` of `dtype` needs, or an error on overflow,
// negative dimension or unknown dtype.
absl::StatusOr<size_t> ExpectedBytes(DataType dtype, const std::vector<int64_t>& shape);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_DTYPE_H_
