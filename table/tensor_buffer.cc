#include "table/tensor_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pstrain {


int64_t TensorBuffer::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorBuffer::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {
// 64-byte alignment suits every element type and vector loads.
constexpr size_t kAlignment = 64;

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
}  // namespace

TensorBuffer TensorBuffer::Allocate(DataType dtype, std::vector<int64_t> shape) {
  TensorBuffer t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.nbytes = static_cast<size_t>(t.NumElements()) * DataTypeSize(dtype);
  size_t rounded = (t.nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::shared_ptr<void> owner(p, AlignedFree());
  t.data = static_cast<const uint8_t*>(p);
  t.owner = std::move(owner);
  return t;
}

absl::StatusOr<TensorBuffer> TensorBuffer::TryAllocate(DataType dtype, std::vector<int64_t> shape) {
  try {
    return Allocate(dtype, std::move(shape));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory for a tensor buffer");
  }
}

TensorBuffer TensorBuffer::CopyOf(DataType dtype, std::vector<int64_t> shape,
                                  const void* bytes, size_t nbytes) {
  TensorBuffer t = Allocate(dtype, std::move(shape));
  t.nbytes = nbytes;
  if (nbytes > 0) std::memcpy(t.MutableData(), bytes, nbytes);
  return t;
}

namespace {
// Non-finite exactly when the exponent bits are all ones. An integer
// OR-reduction vectorizes, unlike a branch on std::isfinite per element.
template <typename Bits, Bits kExponent>
bool NoneAllOnesExponent(const uint8_t* data, size_t n) {
  Bits bad = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
    bad |= static_cast<Bits>((v & kExponent) == kExponent);
  }
  return bad == 0;
}
}  // namespace

bool AllFinite(DataType dtype, const uint8_t* data, size_t nbytes) {
  if (dtype == DT_FLOAT32) return NoneAllOnesExponent<uint32_t, 0x7f800000u>(data, nbytes / 4);
  if (dtype == DT_FLOAT64) {
    return NoneAllOnesExponent<uint64_t, 0x7ff0000000000000ull>(data, nbytes / 8);
  }
  return true;
}


absl::Status ValidateTensorBuffer(const TensorBuffer& t, const std::string& what) {
  absl::StatusOr<size_t> expected = ExpectedBytes(t.dtype, t.shape);
  if (!expected.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", expected.status().message()));
  }
  if (*expected != t.nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", t.nbytes, " bytes of data, but shape ", t.ShapeString(), " of ",
                     DataTypeName(t.dtype), " needs ", *expected));
  }
  if (t.nbytes > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no data"));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
