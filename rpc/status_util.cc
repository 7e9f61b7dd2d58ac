#include "rpc/status_util.h"

#include <string>

namespace pstrain {
namespace {

struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

constexpr CodePair kCodes[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  for (const CodePair& p : kCodes) {
    if (p.absl_code == s.code()) return grpc::Status(p.grpc_code, std::string(s.message()));
  }
  return grpc::Status(grpc::StatusCode::UNKNOWN, std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  for (const CodePair& p : kCodes) {
    if (p.grpc_code == s.error_code()) return absl::Status(p.absl_code, s.error_message());
  }
  return absl::UnknownError(s.error_message());
}

}  // namespace pstrain
