// SliceReader: reads a protobuf-encoded message as gRPC received it, spread
// over slices, without joining them: varints, copies (checking floats for
// NaN/Inf, or widening narrow floats, as they go), and references into the
// slices for bytes that lie in one or a few. The decoder of
// rpc/grpc_tensor_coding.cc is its user.
#ifndef PSTRAIN_RPC_GRPC_SLICE_READER_H_
#define PSTRAIN_RPC_GRPC_SLICE_READER_H_

#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "table/tensor_buffer.h"

namespace pstrain {

// Reads a message spread over gRPC slices. Positions are absolute offsets.
class SliceReader {
 public:
  explicit SliceReader(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) {
    for (const grpc::Slice& s : slices_) size_ += s.size();
  }

  size_t size() const { return size_; }
  size_t pos() const { return pos_; }
  bool AtEnd() const { return pos_ >= size_; }

  bool ReadByte(uint8_t* b) {
    if (pos_ >= size_) return false;
    Normalize();
    *b = slices_[slice_].begin()[offset_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      result |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }

  // Copies n bytes into out (appending).
  bool ReadInto(size_t n, std::string* out) {
    if (n > size_ - pos_) return false;
    while (n > 0) {
      Normalize();
      size_t take = std::min(n, slices_[slice_].size() - offset_);
      out->append(reinterpret_cast<const char*>(slices_[slice_].begin() + offset_), take);
      Advance(take);
      n -= take;
    }
    return true;
  }

  bool CopyTo(size_t n, uint8_t* dst) {
    if (n > size_ - pos_) return false;
    while (n > 0) {
      Normalize();
      size_t take = std::min(n, slices_[slice_].size() - offset_);
      std::memcpy(dst, slices_[slice_].begin() + offset_, take);
      dst += take;
      Advance(take);
      n -= take;
    }
    return true;
  }

  // CopyTo that also checks float32/float64 elements for NaN/Inf, block by
  // block while each block is still in cache, so the check costs no extra
  // pass over memory. *finite is false if any element is not finite.
  bool CopyToCheckingFinite(size_t n, uint8_t* dst, DataType dtype, bool* finite) {
    constexpr size_t kBlock = 64 << 10;
    const size_t elem = DataTypeSize(dtype);
    size_t done = 0, checked = 0;
    bool ok = true;
    while (done < n) {
      const size_t take = std::min(kBlock, n - done);
      if (!CopyTo(take, dst + done)) return false;
      done += take;
      const size_t whole = elem == 0 ? checked : done / elem * elem;
      if (ok && whole > checked) ok = AllFinite(dtype, dst + checked, whole - checked);
      checked = whole;
    }
    *finite = ok && (elem == 0 || n % elem == 0);
    return true;
  }

  // Copies n bytes of bfloat16/float16 elements into float32 `dst`, through
  // a small staging block (in cache), so widening costs no extra pass over
  // memory. *finite is false if any element is not finite.
  bool CopyWidening(size_t n, float* dst, DataType from, bool* finite) {
    constexpr size_t kBlock = 32 << 10;
    alignas(64) uint8_t staging[kBlock];
    bool ok = true;
    for (size_t done = 0; done < n;) {
      const size_t take = std::min(kBlock, n - done);
      if (!CopyTo(take, staging)) return false;
      ok = WidenElements(from, staging, take / 2, dst + done / 2) && ok;
      done += take;
    }
    *finite = ok;
    return true;
  }

  // If the next n bytes lie in one slice, returns a reference to that slice
  // and sets *offset to where they start in it; otherwise nullptr. Point
  // into the returned slice's bytes, not this reader's: a slice of a few
  // bytes holds them inline, inside the grpc::Slice object, so a copy of
  // the slice has them at another address.
  std::shared_ptr<grpc::Slice> Contiguous(size_t n, size_t* offset) {
    if (n > size_ - pos_ || n == 0) return nullptr;
    Normalize();
    if (slices_[slice_].size() - offset_ < n) return nullptr;
    *offset = offset_;
    return std::make_shared<grpc::Slice>(slices_[slice_]);
  }

  // The next n bytes as spans of the slices they lie in, with a reference
  // to each of those slices; false (and nothing read) if they are not all
  // there or lie in more than max_spans slices.
  bool Pieces(size_t n, size_t max_spans, BytePieces* out, std::vector<grpc::Slice>* refs) {
    if (n > size_ - pos_) return false;
    Normalize();
    size_t spans = 0;
    for (size_t k = slice_, off = offset_, left = n; left > 0; ++k, off = 0) {
      const size_t take = std::min(left, slices_[k].size() - off);
      if (take > 0 && ++spans > max_spans) return false;
      left -= take;
    }
    out->spans.reserve(spans);
    refs->reserve(spans);
    while (n > 0) {
      Normalize();
      const size_t take = std::min(n, slices_[slice_].size() - offset_);
      // Into the reference's bytes, not ours: a small slice keeps its bytes
      // inline, in the grpc::Slice object itself (see Contiguous).
      refs->push_back(slices_[slice_]);
      out->spans.push_back({refs->back().begin() + offset_, take});
      Advance(take);
      n -= take;
    }
    return true;
  }

  bool Skip(size_t n) {
    if (n > size_ - pos_) return false;
    while (n > 0) {
      Normalize();
      size_t take = std::min(n, slices_[slice_].size() - offset_);
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Normalize() {
    while (slice_ < slices_.size() && offset_ >= slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }
  void Advance(size_t n) {
    offset_ += n;
    pos_ += n;
  }

  std::vector<grpc::Slice> slices_;
  size_t size_ = 0;
  size_t pos_ = 0;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_SLICE_READER_H_
