#include "rpc/tensor_codec.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<DataType> ToDataType(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DT_FLOAT32;
    case c10::ScalarType::Double: return DT_FLOAT64;
    case c10::ScalarType::Half: return DT_FLOAT16;
    case c10::ScalarType::BFloat16: return DT_BFLOAT16;
    case c10::ScalarType::Int: return DT_INT32;
    case c10::ScalarType::Long: return DT_INT64;
    case c10::ScalarType::Byte: return DT_UINT8;
    case c10::ScalarType::Bool: return DT_BOOL;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensors of type ", c10::toString(t), " cannot be sent"));
  }
}

absl::StatusOr<c10::ScalarType> ToScalarType(DataType t) {
  switch (t) {
    case DT_FLOAT32: return c10::ScalarType::Float;
    case DT_FLOAT64: return c10::ScalarType::Double;
    case DT_FLOAT16: return c10::ScalarType::Half;
    case DT_BFLOAT16: return c10::ScalarType::BFloat16;
    case DT_INT32: return c10::ScalarType::Int;
    case DT_INT64: return c10::ScalarType::Long;
    case DT_UINT8: return c10::ScalarType::Byte;
    case DT_BOOL: return c10::ScalarType::Bool;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", DataTypeName(t)));
  }
}

absl::StatusOr<TensorBuffer> TensorToBuffer(const at::Tensor& tensor) {
  absl::StatusOr<DataType> dtype = ToDataType(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  try {
    at::Tensor t = tensor;
    if (!t.device().is_cpu()) t = t.cpu();
    if (!t.is_contiguous()) t = t.contiguous();
    TensorBuffer b;
    b.dtype = *dtype;
    b.shape.assign(t.sizes().begin(), t.sizes().end());
    b.nbytes = t.numel() * t.element_size();
    b.data = static_cast<const uint8_t*>(t.data_ptr());
    b.owner = std::make_shared<at::Tensor>(std::move(t));
    return b;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> BufferToTensor(const TensorBuffer& buffer) {
  absl::Status valid = ValidateTensorBuffer(buffer, "tensor");
  if (!valid.ok()) return valid;
  absl::StatusOr<c10::ScalarType> type = ToScalarType(buffer.dtype);
  if (!type.ok()) return type.status();
  try {
    auto options = at::TensorOptions().dtype(*type);
    const size_t elem = DataTypeSize(buffer.dtype);
    const bool aligned = reinterpret_cast<uintptr_t>(buffer.data) % elem == 0;
    if (buffer.nbytes == 0 || !aligned) {
      at::Tensor t = at::empty(buffer.shape, options);
      if (buffer.nbytes > 0) std::memcpy(t.data_ptr(), buffer.data, buffer.nbytes);
      return t;
    }
    std::shared_ptr<const void> owner = buffer.owner;
    return at::from_blob(
        const_cast<uint8_t*>(buffer.data), buffer.shape, [owner](void*) mutable { owner.reset(); },
        options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  }
}

}  // namespace pstrain
