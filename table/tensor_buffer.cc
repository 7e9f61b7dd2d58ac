#include "table/tensor_buffer.h"

#include <algorithm>
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

// The float32 scan runs over every pushed gradient: AVX2 where the CPU has
// it (chosen when the program loads; the build targets any x86-64).
#if defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
bool NoneAllOnesExponent32(const uint8_t* data, size_t n) {
  return NoneAllOnesExponent<uint32_t, 0x7f800000u>(data, n);
}
}  // namespace

bool AllFinite(DataType dtype, const uint8_t* data, size_t nbytes) {
  if (dtype == DT_FLOAT32) return NoneAllOnesExponent32(data, nbytes / 4);
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
  if (t.pieces != nullptr) {
    size_t sum = 0;
    for (const BytePieces::Span& s : t.pieces->spans) {
      if (s.data == nullptr || s.nbytes == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": an empty piece"));
      sum += s.nbytes;
    }
    if (t.data != nullptr || sum != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": pieces of ", sum, " bytes for ", t.nbytes));
    }
    return absl::OkStatus();
  }
  if (t.nbytes > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no data"));
  }
  return absl::OkStatus();
}

void ForEachRun(const TensorBuffer& t, size_t elem_size,
                absl::FunctionRef<void(size_t first, const uint8_t* p, size_t n)> f) {
  if (elem_size == 0) return;
  if (t.pieces == nullptr) {
    if (t.nbytes >= elem_size) f(0, t.data, t.nbytes / elem_size);
    return;
  }
  // An element split between two pieces is put together here (every
  // DataType is at most 8 bytes; the contract says elem_size <= 16).
  alignas(16) uint8_t stage[16];
  if (elem_size > sizeof(stage)) std::abort();
  size_t staged = 0;  // bytes of the split element so far
  size_t done = 0;    // elements handed to f
  for (const BytePieces::Span& span : t.pieces->spans) {
    const uint8_t* p = span.data;
    size_t left = span.nbytes;
    if (staged > 0) {
      const size_t take = std::min(left, elem_size - staged);
      std::memcpy(stage + staged, p, take);
      staged += take;
      p += take;
      left -= take;
      if (staged < elem_size) continue;
      f(done++, stage, 1);
      staged = 0;
    }
    const size_t n = left / elem_size;
    if (n > 0) f(done, p, n);
    done += n;
    p += n * elem_size;
    left -= n * elem_size;
    std::memcpy(stage, p, left);
    staged = left;
  }
}

bool AllFinite(const TensorBuffer& t) {
  if (t.pieces == nullptr) return AllFinite(t.dtype, t.data, t.nbytes);
  const size_t elem = DataTypeSize(t.dtype);
  if (t.dtype != DT_FLOAT32 && t.dtype != DT_FLOAT64) return true;
  bool ok = true;
  ForEachRun(t, elem, [&](size_t, const uint8_t* p, size_t n) { ok = ok && AllFinite(t.dtype, p, n * elem); });
  return ok;
}

absl::StatusOr<TensorBuffer> Contiguous(const TensorBuffer& t) {
  if (t.pieces == nullptr) return t;
  absl::StatusOr<TensorBuffer> out = TensorBuffer::TryAllocate(DT_UINT8, {static_cast<int64_t>(t.nbytes)});
  if (!out.ok()) return out.status();
  out->dtype = t.dtype;
  out->shape = t.shape;
  size_t at = 0;
  for (const BytePieces::Span& s : t.pieces->spans) {
    if (at + s.nbytes > t.nbytes) break;
    std::memcpy(out->MutableData() + at, s.data, s.nbytes);
    at += s.nbytes;
  }
  out->known_finite = t.known_finite;
  return out;
}

namespace {

// The conversions are written without branches (each case computed, one
// selected by a mask) so that the element loops below vectorize: they run
// over every gradient a worker sends and every value a shard answers with
// when the wire dtype is narrow. (A ternary leaves control flow that GCC
// 12's vectorizer refuses in the float16 loops.)
inline uint32_t Select(bool c, uint32_t if_true, uint32_t if_false) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (if_true & mask) | (if_false & ~mask);
}

inline uint16_t FloatToBf16(uint32_t x) {
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  // Signed compares: AVX2 has no unsigned ones, and |x| fits.
  return static_cast<uint16_t>(Select(static_cast<int32_t>(x & 0x7fffffffu) > 0x7f800000, quiet_nan, rounded));
}

// F. Giesen's round-to-nearest-even float -> half, no tables.
inline uint16_t FloatToHalf(uint32_t x) {
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  const int32_t magnitude = static_cast<int32_t>(x);
  // >= 65520: Inf (NaN stays NaN).
  const uint32_t inf_nan = Select(magnitude > 0x7f800000, 0x7e00u, 0x7c00u);
  // A float16 subnormal or zero: the float adder rounds.
  float f;
  std::memcpy(&f, &x, 4);
  f += 0.5f;
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t subnormal = b - 0x3f000000u;
  // Normal: rebias the exponent, round the 13 bits dropped to nearest even.
  const uint32_t normal = (x + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  const uint32_t o = Select(magnitude >= 0x47800000, inf_nan, Select(magnitude < 0x38800000, subnormal, normal));
  return static_cast<uint16_t>((o & 0xffffu) | (sign >> 16));
}

inline uint32_t HalfToFloat(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;
  const uint32_t shifted = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = kShiftedExp & shifted;
  const uint32_t normal = shifted + (static_cast<uint32_t>(127 - 15) << 23);
  const uint32_t inf_nan = normal + (static_cast<uint32_t>(128 - 16) << 23);
  // Zero and subnormals: let the float unit renormalise.
  const uint32_t biased = normal + (1u << 23);
  float f;
  std::memcpy(&f, &biased, 4);
  f -= 6.103515625e-05f;  // 2^-14
  uint32_t subnormal;
  std::memcpy(&subnormal, &f, 4);
  const uint32_t o = Select(exp == kShiftedExp, inf_nan, Select(exp == 0, subnormal, normal));
  return o | (static_cast<uint32_t>(h & 0x8000u) << 16);
}

}  // namespace

bool IsNarrowFloat(DataType dtype) { return dtype == DT_BFLOAT16 || dtype == DT_FLOAT16; }

// The element loops run over every byte a narrow wire dtype carries, on both
// ends: AVX2 where the CPU has it (chosen when the program loads; the build
// targets any x86-64). Integer arithmetic and one float add or subtract per
// element, no FMA, so both builds compute the same bits; wire_dtype_test
// checks the one the machine picks against LibTorch's conversions.
#if defined(__x86_64__)
#define PSTRAIN_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PSTRAIN_AVX2_CLONES
#endif

PSTRAIN_AVX2_CLONES
bool WidenElements(DataType from, const uint8_t* src_bytes, size_t n, float* dst_float) {
  // src at any address (a received slice): unaligned loads.
  auto src = [src_bytes](size_t i) {
    uint16_t v;
    std::memcpy(&v, src_bytes + 2 * i, 2);
    return v;
  };
  uint32_t* dst = reinterpret_cast<uint32_t*>(dst_float);
  uint32_t all_ones_exponent = 0;  // any element with an Inf/NaN exponent
  if (from == DT_BFLOAT16) {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t v = static_cast<uint32_t>(src(i)) << 16;
      dst[i] = v;
      all_ones_exponent |= static_cast<uint32_t>((v & 0x7f800000u) == 0x7f800000u);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = src(i);
      all_ones_exponent |= static_cast<uint32_t>((h & 0x7c00u) == 0x7c00u);
      dst[i] = HalfToFloat(h);
    }
  }
  return all_ones_exponent == 0;
}

PSTRAIN_AVX2_CLONES
void NarrowElements(DataType to, const float* src_float, float* residual, size_t n, uint8_t* dst_bytes) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(src_float);
  uint16_t* dst = reinterpret_cast<uint16_t*>(dst_bytes);
  const bool bf16 = to == DT_BFLOAT16;
  if (residual == nullptr) {
    if (bf16) {
      for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
    } else {
      for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
    }
    return;
  }
  // One loop per dtype, so each is a straight line the vectorizer takes.
  auto with_feedback = [&](auto narrow, auto widen) {
    for (size_t i = 0; i < n; ++i) {
      const float want = src_float[i] + residual[i];
      uint32_t bits;
      std::memcpy(&bits, &want, 4);
      const uint16_t narrowed = narrow(bits);
      const uint32_t back = widen(narrowed);
      float sent;
      std::memcpy(&sent, &back, 4);
      dst[i] = narrowed;
      // An Inf or NaN sent leaves no residual to carry (it would poison every
      // later step); the shard's non-finite policy deals with the step.
      const float lost = want - sent;
      uint32_t lost_bits;
      std::memcpy(&lost_bits, &lost, 4);
      lost_bits = Select(lost - lost == 0.0f, lost_bits, 0u);
      std::memcpy(&residual[i], &lost_bits, 4);
    }
  };
  if (bf16) {
    with_feedback(FloatToBf16, [](uint16_t h) { return static_cast<uint32_t>(h) << 16; });
  } else {
    with_feedback(FloatToHalf, HalfToFloat);
  }
}

PSTRAIN_AVX2_CLONES
void RoundThrough(DataType narrow, const float* src_float, size_t n, float* dst_float) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(src_float);
  uint32_t* dst = reinterpret_cast<uint32_t*>(dst_float);
  if (narrow == DT_BFLOAT16) {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint32_t>(FloatToBf16(src[i])) << 16;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(FloatToHalf(src[i]));
  }
}

#undef PSTRAIN_AVX2_CLONES

absl::StatusOr<TensorBuffer> WidenToFloat32(const TensorBuffer& t) {
  if (!IsNarrowFloat(t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot widen ", DataTypeName(t.dtype), " to float32"));
  }
  absl::StatusOr<TensorBuffer> out = TensorBuffer::TryAllocate(DT_FLOAT32, t.shape);
  if (!out.ok()) return out.status();
  float* dst = reinterpret_cast<float*>(out->MutableData());
  bool finite = true;
  ForEachRun(t, 2, [&](size_t first, const uint8_t* p, size_t n) {
    finite = WidenElements(t.dtype, p, n, dst + first) && finite;
  });
  out->known_finite = finite;
  return out;
}

absl::StatusOr<TensorBuffer> NarrowFloat32(const TensorBuffer& t, DataType to) {
  if (t.dtype != DT_FLOAT32 || !IsNarrowFloat(to)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot narrow ", DataTypeName(t.dtype), " to ", DataTypeName(to)));
  }
  absl::StatusOr<TensorBuffer> out = TensorBuffer::TryAllocate(to, t.shape);
  if (!out.ok()) return out.status();
  NarrowElements(to, reinterpret_cast<const float*>(t.data), nullptr, t.nbytes / 4, out->MutableData());
  return out;
}

}  // namespace pstrain
