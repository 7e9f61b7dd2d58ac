// LibTorch tensor <-> TensorBuffer, without copying where it can:
// a contiguous CPU tensor is viewed in place (the buffer keeps the tensor
// alive), and a received buffer becomes a tensor over the same bytes when
// they are aligned for the element type. Knows LibTorch, not gRPC.
// Exceptions from LibTorch stop here and come back as a Status.
#ifndef PSTRAIN_RPC_TENSOR_CODEC_H_
#define PSTRAIN_RPC_TENSOR_CODEC_H_

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "table/tensor_buffer.h"

namespace pstrain {

absl::StatusOr<DataType> ToDataType(c10::ScalarType t);
absl::StatusOr<c10::ScalarType> ToScalarType(DataType t);

// Views `tensor` as wire bytes. A non-contiguous tensor is made contiguous
// (a copy) and a GPU tensor is copied to the CPU first; otherwise no copy.
absl::StatusOr<TensorBuffer> TensorToBuffer(const at::Tensor& tensor);

// A CPU tensor over `buffer`'s bytes (sharing its owner) when they are
// aligned for the element type, else over a copy. The caller moves it to the
// device it wants.
absl::StatusOr<at::Tensor> BufferToTensor(const TensorBuffer& buffer);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_TENSOR_CODEC_H_
