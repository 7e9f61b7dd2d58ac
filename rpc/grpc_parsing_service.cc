#include "rpc/grpc_parsing_service.h"

#include "absl/strings/str_cat.h"

namespace pstrain {

grpc::Status ParsingService::Parse(const grpc::ByteBuffer& in, google::protobuf::MessageLite* out,
                                   const std::string& method) {
  std::vector<grpc::Slice> slices;
  if (!in.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat(method, ": unreadable request"));
  }
  std::string bytes;
  bytes.reserve(in.Length());
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!out->ParseFromString(bytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(method, ": the request (", bytes.size(), " bytes) is not a valid ",
                                     out->GetTypeName(),
                                     " message (malformed protobuf, or a string field that is not UTF-8)"));
  }
  return grpc::Status::OK;
}

grpc::Status ParsingService::Serialize(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out) {
  std::string bytes;
  if (!message.SerializeToString(&bytes)) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the response ", message.GetTypeName(), " is too large to send"));
  }
  grpc::Slice slice(bytes);
  *out = grpc::ByteBuffer(&slice, 1);
  return grpc::Status::OK;
}

}  // namespace pstrain
