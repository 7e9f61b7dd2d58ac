#include "rpc/grpc_tensor_coding.h"

#include <grpcpp/support/slice.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

constexpr int kDtypeField = 1;
constexpr int kShapeField = 2;
constexpr int kDataField = 3;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(int field, WireType wt, std::string* out) {
  PutVarint((static_cast<uint64_t>(field) << 3) | wt, out);
}

// Metadata of one TensorProto up to and including the length prefix of its
// data field; the data bytes follow in their own slice.
std::string TensorMetadata(const TensorBuffer& t) {
  std::string m;
  if (t.dtype != DT_INVALID) {
    PutTag(kDtypeField, kVarint, &m);
    PutVarint(static_cast<uint64_t>(t.dtype), &m);
  }
  if (!t.shape.empty()) {
    std::string packed;
    for (int64_t d : t.shape) PutVarint(static_cast<uint64_t>(d), &packed);
    PutTag(kShapeField, kLengthDelimited, &m);
    PutVarint(packed.size(), &m);
    m += packed;
  }
  if (t.nbytes > 0) {
    PutTag(kDataField, kLengthDelimited, &m);
    PutVarint(t.nbytes, &m);
  }
  return m;
}

void ReleaseOwner(void* user_data) { delete static_cast<std::shared_ptr<const void>*>(user_data); }

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

// More dimensions than any tensor has: a shape of millions of one-byte
// varints would otherwise cost 8 bytes of memory per byte received.
constexpr size_t kMaxDims = 64;

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

// Float dtypes, whose readers (the shards' push path) take pieces.
bool Pieceable(DataType dtype) {
  return dtype == DT_FLOAT32 || dtype == DT_FLOAT64 || IsNarrowFloat(dtype);
}

// Pieces are worth it when they are large: at most one span per 4 KiB on
// average (gRPC's reads make 64 KiB slices; a sender trickling bytes makes
// tiny ones, whose spans would cost more memory than a copy).
constexpr size_t kMinBytesPerPiece = 4096;

// What keeps a tensor's pieces valid: references to the slices they lie in.
struct PieceOwner {
  std::vector<grpc::Slice> slices;
  BytePieces pieces;
};

// The next n bytes as t's pieces (data null), if they lie in few enough
// slices; false (nothing read, t unchanged) otherwise.
bool TakePieces(SliceReader* r, size_t n, TensorBuffer* t) {
  auto owner = std::make_shared<PieceOwner>();
  if (!r->Pieces(n, n / kMinBytesPerPiece, &owner->pieces, &owner->slices)) return false;
  t->pieces = std::shared_ptr<const BytePieces>(owner, &owner->pieces);
  t->owner = std::move(owner);
  t->data = nullptr;
  t->nbytes = n;
  return true;
}

// Parses one TensorProto of `len` bytes at the reader's position.
// With `dest`, the bytes are copied into dest's buffer, which must have
// exactly the received size. With `pieces`, float bytes spread over
// several slices are left there (TensorBuffer.pieces).
absl::Status ReadTensor(SliceReader* r, size_t len, size_t index, const TensorBuffer* dest, bool pieces,
                        TensorBuffer* t) {
  const size_t end = r->pos() + len;
  const std::string what = absl::StrCat("tensor ", index);
  // Bytes left in this record; 0 once a varint has run past its end (which
  // the loop then reports): never a wrapped-around size_t.
  auto left = [&] { return r->pos() < end ? end - r->pos() : 0; };
  bool have_data = false;
  // The dtype the NaN/Inf check of the data ran with: fields may come in
  // any order (a dtype after the data is valid protobuf), so the check
  // counts only if the final dtype is the one it used.
  DataType checked_as = DT_INVALID;
  while (r->pos() < end) {
    uint64_t tag;
    if (!r->ReadVarint(&tag)) return Malformed(what + ": truncated field tag");
    const uint64_t field = tag >> 3;
    const uint32_t wt = tag & 7;
    if (field == kDtypeField && wt == kVarint) {
      uint64_t v;
      if (!r->ReadVarint(&v)) return Malformed(what + ": truncated dtype");
      t->dtype = static_cast<DataType>(static_cast<int>(v));
    } else if (field == kShapeField && wt == kLengthDelimited) {
      uint64_t n;
      if (!r->ReadVarint(&n) || n > left()) return Malformed(what + ": truncated shape");
      const size_t shape_end = r->pos() + n;
      while (r->pos() < shape_end) {
        uint64_t d;
        if (!r->ReadVarint(&d)) return Malformed(what + ": truncated shape");
        t->shape.push_back(static_cast<int64_t>(d));
        if (t->shape.size() > kMaxDims) return Malformed(absl::StrCat(what, ": more than ", kMaxDims, " dimensions"));
      }
      if (r->pos() != shape_end) return Malformed(what + ": shape overruns its length");
    } else if (field == kShapeField && wt == kVarint) {
      uint64_t d;
      if (!r->ReadVarint(&d)) return Malformed(what + ": truncated shape");
      t->shape.push_back(static_cast<int64_t>(d));
      if (t->shape.size() > kMaxDims) return Malformed(absl::StrCat(what, ": more than ", kMaxDims, " dimensions"));
    } else if (field == kDataField && wt == kLengthDelimited) {
      uint64_t n;
      if (!r->ReadVarint(&n) || n > left()) return Malformed(what + ": truncated data");
      // Protobuf semantics: the last occurrence wins.
      have_data = true;
      t->known_finite = false;
      t->pieces.reset();
      // Resolve the bytes now, while the reader is here.
      size_t elem = DataTypeSize(t->dtype);
      size_t offset = 0;
      std::shared_ptr<grpc::Slice> slice = dest != nullptr ? nullptr : r->Contiguous(n, &offset);
      const uint8_t* p = slice != nullptr ? slice->begin() + offset : nullptr;
      // Narrow values (a job's wire_dtype) for a float32 destination are
      // widened as they are copied in.
      const bool widen = dest != nullptr && IsNarrowFloat(t->dtype) && dest->dtype == DT_FLOAT32 &&
                         n * 2 == dest->nbytes;
      if (widen) {
        bool finite = false;
        if (!r->CopyWidening(n, reinterpret_cast<float*>(dest->MutableData()), t->dtype, &finite)) {
          return Malformed(what + ": truncated data");
        }
        t->dtype = DT_FLOAT32;
        t->known_finite = finite;
        checked_as = DT_FLOAT32;
        t->data = dest->data;
        t->nbytes = dest->nbytes;
        t->owner = dest->owner;
      } else if (dest != nullptr) {
        if (n != dest->nbytes) {
          return Malformed(absl::StrCat(what, " has ", n, " bytes where ", dest->nbytes,
                                        " were expected"));
        }
        if (!r->CopyTo(n, dest->MutableData())) return Malformed(what + ": truncated data");
        t->data = dest->data;
        t->nbytes = n;
        t->owner = dest->owner;
      } else if (p != nullptr && elem != 0 && reinterpret_cast<uintptr_t>(p) % elem == 0) {
        t->data = p;
        t->nbytes = n;
        t->owner = std::move(slice);  // a reference, not a copy
        r->Skip(n);
      } else if (pieces && p == nullptr && Pieceable(t->dtype) && TakePieces(r, n, t)) {
        // Left in the slices they arrived in.
      } else {
        absl::StatusOr<TensorBuffer> buffer = TensorBuffer::TryAllocate(DT_UINT8, {static_cast<int64_t>(n)});
        if (!buffer.ok()) return buffer.status();
        TensorBuffer& copy = *buffer;
        bool finite = false;
        if (!r->CopyToCheckingFinite(n, copy.MutableData(), t->dtype, &finite)) {
          return Malformed(what + ": truncated data");
        }
        t->known_finite = finite;
        checked_as = t->dtype;
        t->data = copy.data;
        t->nbytes = n;
        t->owner = std::move(copy.owner);
      }
    } else {
      // Unknown field: skip it by wire type.
      uint64_t skip = 0;
      switch (wt) {
        case kVarint: {
          uint64_t v;
          if (!r->ReadVarint(&v)) return Malformed(what + ": truncated varint");
          break;
        }
        case kFixed64: skip = 8; break;
        case kFixed32: skip = 4; break;
        case kLengthDelimited:
          if (!r->ReadVarint(&skip)) return Malformed(what + ": truncated length");
          break;
        default:
          return Malformed(absl::StrCat(what, ": unsupported wire type ", wt));
      }
      if (skip > left() || !r->Skip(skip)) return Malformed(what + ": truncated field");
    }
    if (r->pos() > end) return Malformed(what + ": field overruns the tensor");
  }
  if (!have_data) {
    t->data = nullptr;
    t->nbytes = 0;
  }
  // Decided only now that the whole record is parsed.
  if (t->known_finite && t->dtype != checked_as) t->known_finite = false;
  if (t->pieces != nullptr && !Pieceable(t->dtype)) {  // a dtype field after the data
    absl::StatusOr<TensorBuffer> whole = Contiguous(*t);
    if (!whole.ok()) return whole.status();
    *t = std::move(*whole);
  }
  if (dest != nullptr && (t->dtype != dest->dtype || (!have_data && dest->nbytes != 0))) {
    return Malformed(absl::StrCat(what, " is ", DataTypeName(t->dtype), " of ", t->nbytes,
                                  " bytes where ", DataTypeName(dest->dtype), " of ",
                                  dest->nbytes, " bytes were expected"));
  }
  return ValidateTensorBuffer(*t, what);
}

}  // namespace

absl::Status EncodeTensorMessage(const google::protobuf::MessageLite& header,
                                 const std::vector<TensorBuffer>& tensors, grpc::ByteBuffer* out,
                                 int tensor_field) {
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + 2 * tensors.size());
  std::string pending;
  if (!header.AppendToString(&pending)) {
    return absl::InternalError("could not serialize the message header");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorBuffer& t = tensors[i];
    absl::Status valid = ValidateTensorBuffer(t, absl::StrCat("tensor ", i));
    if (!valid.ok()) return valid;
    const std::string meta = TensorMetadata(t);
    PutTag(tensor_field, kLengthDelimited, &pending);
    PutVarint(meta.size() + t.nbytes, &pending);
    pending += meta;
    if (t.nbytes < kZeroCopyMinBytes) {
      pending.append(reinterpret_cast<const char*>(t.data), t.nbytes);
      continue;
    }
    slices.emplace_back(pending.data(), pending.size());
    pending.clear();
    // The slice points into the tensor's memory; its destroy callback drops
    // our reference to the owner once gRPC has written the bytes.
    auto* owner = new std::shared_ptr<const void>(t.owner);
    slices.emplace_back(const_cast<uint8_t*>(t.data), t.nbytes, &ReleaseOwner, owner);
  }
  if (!pending.empty() || slices.empty()) slices.emplace_back(pending.data(), pending.size());
  grpc::ByteBuffer bb(slices.data(), slices.size());
  out->Swap(&bb);
  return absl::OkStatus();
}

absl::Status DecodeTensorMessage(const grpc::ByteBuffer& in, google::protobuf::MessageLite* header,
                                 std::vector<TensorBuffer>* tensors,
                                 const std::vector<TensorBuffer>* destinations, int tensor_field) {
  return DecodeTensorMessage(in, header, tensors, destinations, tensor_field, DecodeOptions{});
}

absl::Status DecodeTensorMessage(const grpc::ByteBuffer& in, google::protobuf::MessageLite* header,
                                 std::vector<TensorBuffer>* tensors, const DecodeOptions& options) {
  return DecodeTensorMessage(in, header, tensors, nullptr, kTensorField, options);
}

absl::Status DecodeTensorMessage(const grpc::ByteBuffer& in, google::protobuf::MessageLite* header,
                                 std::vector<TensorBuffer>* tensors,
                                 const std::vector<TensorBuffer>* destinations, int tensor_field,
                                 const DecodeOptions& options) {
  std::vector<grpc::Slice> slices;
  if (in.Valid()) {
    grpc::Status dumped = in.Dump(&slices);
    if (!dumped.ok()) return absl::InternalError("could not read the received message");
  }
  SliceReader r(std::move(slices));
  std::string header_bytes;
  std::vector<TensorBuffer> out;
  while (!r.AtEnd()) {
    uint64_t tag;
    if (!r.ReadVarint(&tag)) return Malformed("truncated field tag");
    const uint64_t field = tag >> 3;
    const uint32_t wt = tag & 7;
    if (field == 0) return Malformed("field number 0");
    if (field == static_cast<uint64_t>(tensor_field) && wt == kLengthDelimited) {
      uint64_t len;
      if (!r.ReadVarint(&len) || len > r.size() - r.pos()) {
        return Malformed(absl::StrCat("tensor ", out.size(), " is truncated"));
      }
      TensorBuffer t;
      const TensorBuffer* dest = nullptr;
      if (destinations != nullptr) {
        if (out.size() >= destinations->size()) {
          return Malformed(absl::StrCat("more than the ", destinations->size(),
                                        " expected tensors"));
        }
        dest = &(*destinations)[out.size()];
      }
      absl::Status s = ReadTensor(&r, len, out.size(), dest, options.pieces && dest == nullptr, &t);
      if (!s.ok()) return s;
      out.push_back(std::move(t));
      continue;
    }
    PutVarint(tag, &header_bytes);
    switch (wt) {
      case kVarint: {
        uint64_t v;
        if (!r.ReadVarint(&v)) return Malformed("truncated varint");
        PutVarint(v, &header_bytes);
        break;
      }
      case kFixed64:
        if (!r.ReadInto(8, &header_bytes)) return Malformed("truncated fixed64");
        break;
      case kFixed32:
        if (!r.ReadInto(4, &header_bytes)) return Malformed("truncated fixed32");
        break;
      case kLengthDelimited: {
        uint64_t len;
        if (!r.ReadVarint(&len) || len > r.size() - r.pos()) return Malformed("truncated field");
        PutVarint(len, &header_bytes);
        if (!r.ReadInto(len, &header_bytes)) return Malformed("truncated field");
        break;
      }
      default:
        return Malformed(absl::StrCat("unsupported wire type ", wt));
    }
  }
  if (!header->ParseFromString(header_bytes)) return Malformed("could not parse the header");
  if (destinations != nullptr && out.size() != destinations->size()) {
    return Malformed(absl::StrCat(out.size(), " tensors where ", destinations->size(),
                                  " were expected"));
  }
  *tensors = std::move(out);
  return absl::OkStatus();
}

}  // namespace pstrain
