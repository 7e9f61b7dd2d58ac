// Tensor-carrying protobuf messages <-> grpc::ByteBuffer without copying the
// tensor bytes.
//
// A message is sent as its "header" (the protobuf message with its tensor
// field left empty, serialized normally) followed by one TensorProto record
// per tensor in field `tensor_field`. Each record is a few bytes of metadata
// plus a slice that points at the tensor's own memory, so encoding copies no
// tensor bytes. Protobuf lets fields come in any order and repeated fields be
// split, so the result is exactly what the plain protobuf parser accepts.
//
// Decoding walks the top-level fields itself: tensor records are taken out
// (each tensor's bytes referenced in place when they sit in one received slice
// with suitable alignment, otherwise copied once into an aligned buffer), and
// everything else is handed to protobuf as the header.
#ifndef PSTRAIN_RPC_GRPC_TENSOR_CODING_H_
#define PSTRAIN_RPC_GRPC_TENSOR_CODING_H_

#include <grpcpp/support/byte_buffer.h>

#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "table/tensor_buffer.h"

namespace pstrain {

// The metadata key that carries CallOptions::job_secret on ParameterService
// calls.
inline constexpr char kJobSecretMetadata[] = "x-pstrain-job-secret";
// The coordinator's grant for making a job's table (rpc/table_grant.h).
inline constexpr char kTableGrantMetadata[] = "x-pstrain-table-grant";

// Field number that carries tensors in every message of proto/ that has them.
constexpr int kTensorField = 15;

// Tensors smaller than this are copied into the metadata slice: a separate
// slice per tiny tensor costs more than the copy.
constexpr size_t kZeroCopyMinBytes = 4096;

// Encodes `header` (its field `tensor_field` must be empty) and `tensors`.
// The ByteBuffer keeps every tensor's owner alive until gRPC is done with it.
absl::Status EncodeTensorMessage(const google::protobuf::MessageLite& header,
                                 const std::vector<TensorBuffer>& tensors, grpc::ByteBuffer* out,
                                 int tensor_field = kTensorField);

// Decodes `in` into `header` (tensor field left empty) and `tensors`. Every
// tensor is validated (known dtype, byte count matching the shape). Malformed
// input yields INVALID_ARGUMENT and leaves no partial result in `tensors`.
//
// With `destinations`, the message must carry exactly that many tensors of
// the same dtypes and byte sizes, and their bytes are written straight into
// the destination buffers (e.g. a model's parameters) -- the one copy that
// receiving needs. On error the destinations' contents are unspecified.
absl::Status DecodeTensorMessage(const grpc::ByteBuffer& in, google::protobuf::MessageLite* header,
                                 std::vector<TensorBuffer>* tensors,
                                 const std::vector<TensorBuffer>* destinations = nullptr,
                                 int tensor_field = kTensorField);

struct DecodeOptions {
  // Float tensors whose bytes span several received slices are left in
  // them (TensorBuffer.pieces, read with ForEachRun) instead of copied into
  // one buffer: for a reader that reads each byte once anyway (a shard
  // applying a gradient), the copy would be a second pass over memory.
  // Few large slices only (at least 4 KiB each on average); otherwise, and
  // for other dtypes, the bytes are copied as without this option.
  bool pieces = false;
};
absl::Status DecodeTensorMessage(const grpc::ByteBuffer& in, google::protobuf::MessageLite* header,
                                 std::vector<TensorBuffer>* tensors, const DecodeOptions& options);
absl::Status DecodeTensorMessage(const grpc::ByteBuffer& in, google::protobuf::MessageLite* header,
                                 std::vector<TensorBuffer>* tensors,
                                 const std::vector<TensorBuffer>* destinations, int tensor_field,
                                 const DecodeOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_TENSOR_CODING_H_
