#include "rpc/status_util.h"

#include <gtest/gtest.h>

namespace pstrain {
namespace {

struct Row {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

// Every canonical code, both directions. A remap that a later line silently
// overrides (a real bug in TensorFlow's grpc_util.h) fails here.
const Row kRows[] = {
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

class StatusUtilTest : public ::testing::TestWithParam<Row> {};

TEST_P(StatusUtilTest, MapsBothWaysKeepingTheMessage) {
  const Row& row = GetParam();
  const std::string msg = row.absl_code == absl::StatusCode::kOk ? "" : "key 'w#0' is not here";
  grpc::Status g = ToGrpcStatus(absl::Status(row.absl_code, msg));
  EXPECT_EQ(g.error_code(), row.grpc_code);
  EXPECT_EQ(g.error_message(), msg);
  absl::Status a = FromGrpcStatus(grpc::Status(row.grpc_code, msg));
  EXPECT_EQ(a.code(), row.absl_code);
  EXPECT_EQ(std::string(a.message()), msg);
}

INSTANTIATE_TEST_SUITE_P(AllCodes, StatusUtilTest, ::testing::ValuesIn(kRows));

TEST(StatusUtilTest, UnknownCodesBecomeUnknown) {
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "x")).error_code(),
            grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(99), "x")).code(),
            absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace pstrain
