#include "rpc/grpc_tensor_coding.h"

#include <grpcpp/support/slice.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_slice_reader.h"

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

// Bytes left of a record ending at `end`; 0 once a varint has run past it
// (which the caller then reports): never a wrapped-around size_t.
size_t BytesLeft(const SliceReader& r, size_t end) { return r.pos() < end ? end - r.pos() : 0; }

// One dimension of a tensor's shape field, appended to t->shape.
absl::Status ReadDim(SliceReader* r, const std::string& what, TensorBuffer* t) {
  uint64_t d;
  if (!r->ReadVarint(&d)) return Malformed(what + ": truncated shape");
  t->shape.push_back(static_cast<int64_t>(d));
  if (t->shape.size() > kMaxDims) return Malformed(absl::StrCat(what, ": more than ", kMaxDims, " dimensions"));
  return absl::OkStatus();
}

// The `n` bytes of a tensor's data field, at the reader's position, into t
// (see ReadTensor for `dest` and `pieces`). `checked_as` is set to the
// dtype a NaN/Inf check of the bytes ran with, if one did.
absl::Status ReadData(SliceReader* r, size_t n, const std::string& what, const TensorBuffer* dest, bool pieces,
                      TensorBuffer* t, DataType* checked_as) {
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
    *checked_as = DT_FLOAT32;
    t->data = dest->data;
    t->nbytes = dest->nbytes;
    t->owner = dest->owner;
  } else if (dest != nullptr) {
    if (n != dest->nbytes) {
      return Malformed(absl::StrCat(what, " has ", n, " bytes where ", dest->nbytes, " were expected"));
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
    *checked_as = t->dtype;
    t->data = copy.data;
    t->nbytes = n;
    t->owner = std::move(copy.owner);
  }
  return absl::OkStatus();
}

// Skips an unknown field of wire type `wt` (its tag read) in a record
// ending at `end`.
absl::Status SkipField(SliceReader* r, uint32_t wt, size_t end, const std::string& what) {
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
  if (skip > BytesLeft(*r, end) || !r->Skip(skip)) return Malformed(what + ": truncated field");
  return absl::OkStatus();
}

// Parses one TensorProto of `len` bytes at the reader's position.
// With `dest`, the bytes are copied into dest's buffer, which must have
// exactly the received size. With `pieces`, float bytes spread over
// several slices are left there (TensorBuffer.pieces).
absl::Status ReadTensor(SliceReader* r, size_t len, size_t index, const TensorBuffer* dest, bool pieces,
                        TensorBuffer* t) {
  const size_t end = r->pos() + len;
  const std::string what = absl::StrCat("tensor ", index);
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
    absl::Status s;
    if (field == kDtypeField && wt == kVarint) {
      uint64_t v;
      if (!r->ReadVarint(&v)) return Malformed(what + ": truncated dtype");
      t->dtype = static_cast<DataType>(static_cast<int>(v));
    } else if (field == kShapeField && wt == kLengthDelimited) {
      uint64_t n;
      if (!r->ReadVarint(&n) || n > BytesLeft(*r, end)) return Malformed(what + ": truncated shape");
      const size_t shape_end = r->pos() + n;
      while (s.ok() && r->pos() < shape_end) s = ReadDim(r, what, t);
      if (s.ok() && r->pos() != shape_end) return Malformed(what + ": shape overruns its length");
    } else if (field == kShapeField && wt == kVarint) {
      s = ReadDim(r, what, t);
    } else if (field == kDataField && wt == kLengthDelimited) {
      uint64_t n;
      if (!r->ReadVarint(&n) || n > BytesLeft(*r, end)) return Malformed(what + ": truncated data");
      have_data = true;  // protobuf semantics: the last occurrence wins
      s = ReadData(r, n, what, dest, pieces, t, &checked_as);
    } else {
      s = SkipField(r, wt, end, what);
    }
    if (!s.ok()) return s;
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
