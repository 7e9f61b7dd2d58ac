// TensorBuffer: the transport's view of a dense tensor -- element type, shape
// and a span of little-endian bytes -- kept alive by a shared owner. Both the
// LibTorch side (worker) and the shard side (plain float arrays) speak it, so
// the shard server never needs LibTorch headers.
#ifndef PSTRAIN_TABLE_TENSOR_BUFFER_H_
#define PSTRAIN_TABLE_TENSOR_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "proto/tensor.pb.h"

namespace pstrain {

// A tensor's bytes left in the pieces they arrived in (gRPC reads a socket
// into 64 KiB slices): spans, in order, adding up to the tensor's nbytes.
// A span may end inside an element and start at any address.
struct BytePieces {
  struct Span {
    const uint8_t* data;
    size_t nbytes;
  };
  std::vector<Span> spans;
};

// An immutable view of tensor bytes. Copying a TensorBuffer copies the view,
// not the bytes; `owner` keeps `data` valid for as long as any copy lives.
// Thread-safe to read from many threads.
//
// The bytes are either contiguous at `data`, or -- only where a reader asked
// for it (the shards' push path: DecodeOptions.pieces) -- in `pieces`, with
// `data` null; ForEachRun reads both.
struct TensorBuffer {
  DataType dtype = DT_INVALID;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> owner;
  // Set instead of `data` for bytes left in pieces (kept alive by `owner`).
  std::shared_ptr<const BytePieces> pieces;
  // Set by whoever produced the bytes and already checked them (the decoder
  // does, while copying): every element is finite. False means "not known".
  bool known_finite = false;

  // Product of `shape` (1 for a 0-dim tensor).
  int64_t NumElements() const;
  std::string ShapeString() const;  // "[2, 3]"

  // A buffer of `nbytes` bytes, aligned for any element type, that this
  // TensorBuffer owns. The caller fills it through MutableData() before
  // sharing the buffer.
  // Throws std::bad_alloc when memory runs out: servers use TryAllocate.
  static TensorBuffer Allocate(DataType dtype, std::vector<int64_t> shape);
  // As Allocate, RESOURCE_EXHAUSTED instead of a throw.
  static absl::StatusOr<TensorBuffer> TryAllocate(DataType dtype, std::vector<int64_t> shape);
  uint8_t* MutableData() const { return const_cast<uint8_t*>(data); }

  // A buffer holding a copy of `bytes`.
  static TensorBuffer CopyOf(DataType dtype, std::vector<int64_t> shape,
                             const void* bytes, size_t nbytes);
};

// True if no element of a float32/float64 buffer is NaN or Inf (always true
// for other dtypes). `nbytes` is rounded down to whole elements.
bool AllFinite(DataType dtype, const uint8_t* data, size_t nbytes);
// AllFinite of a buffer's bytes, contiguous or in pieces.
bool AllFinite(const TensorBuffer& t);

// Visits a buffer's whole elements of `elem_size` bytes in order, as runs:
// f(first, p, n) for elements [first, first + n) at p. Contiguous bytes are
// one run; pieces are read where they lie, so p may be at any address (read
// elements with memcpy); an element split between two pieces is put
// together on the stack and visited on its own. elem_size: 1..16 (any
// DataType's size).
void ForEachRun(const TensorBuffer& t, size_t elem_size,
                absl::FunctionRef<void(size_t first, const uint8_t* p, size_t n)> f);
// A contiguous copy of a buffer in pieces (anything else: unchanged).
absl::StatusOr<TensorBuffer> Contiguous(const TensorBuffer& t);

// Checks that dtype is known, no dimension is negative, the element count does
// not overflow, and nbytes == elements x element size. The message names
// `what` (e.g. "grads[3] (key fc1.weight#0)") so a person can find the culprit.
absl::Status ValidateTensorBuffer(const TensorBuffer& t, const std::string& what);

// The narrow wire dtypes (a job's wire_dtype): bfloat16 and float16 carry
// float32 values over the wire; shards keep float32 and widen on arrival.
bool IsNarrowFloat(DataType dtype);
// A float32 copy of a bfloat16 or float16 buffer, its finiteness found in
// the same pass (known_finite).
absl::StatusOr<TensorBuffer> WidenToFloat32(const TensorBuffer& t);
// A bfloat16 or float16 copy of a float32 buffer, rounded to nearest even
// (as LibTorch's .to() rounds): values beyond float16's range become Inf.
absl::StatusOr<TensorBuffer> NarrowFloat32(const TensorBuffer& t, DataType to);
// The element loops: `n` elements of `from` (bf16/fp16, at any address)
// into float32, and returns whether all were finite; float32 into `to`, optionally with error
// feedback: `residual` (n floats, or null) is added to src first and left
// holding what the rounding lost.
bool WidenElements(DataType from, const uint8_t* src, size_t n, float* dst);
void NarrowElements(DataType to, const float* src, float* residual, size_t n, uint8_t* dst);
// float32 values as they arrive after travelling as `narrow`: narrowed and
// widened again (src and dst may be the same).
void RoundThrough(DataType narrow, const float* src, size_t n, float* dst);

}  // namespace pstrain

#endif  // PSTRAIN_TABLE_TENSOR_BUFFER_H_
