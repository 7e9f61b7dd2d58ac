#include "rpc/status_util.h"

#include <gtest/gtest.h>

#include <string>

namespace pstrain {
namespace {

// absl::StatusCode and grpc::StatusCode number the same canonical codes
// (google.rpc.Code: 0 OK .. 16 UNAUTHENTICATED), so the expected answer for
// every code is the same number: no second copy of status_util.cc's table to
// keep in step with it. Every code, both directions: a missing row (it would
// give UNKNOWN) or a remap that a later line silently overrides (a real bug
// in TensorFlow's grpc_util.h) fails here.
constexpr int kFirstCode = 0;  // OK
constexpr int kLastCode = 16;  // UNAUTHENTICATED

class StatusUtilTest : public ::testing::TestWithParam<int> {};

TEST_P(StatusUtilTest, MapsBothWaysToTheSameCodeKeepingTheMessage) {
  const int code = GetParam();
  const std::string msg = code == 0 ? "" : "key 'w#0' is not here";
  grpc::Status g = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(code), msg));
  EXPECT_EQ(static_cast<int>(g.error_code()), code);
  EXPECT_EQ(g.error_message(), msg);
  absl::Status a = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), msg));
  EXPECT_EQ(static_cast<int>(a.code()), code);
  EXPECT_EQ(std::string(a.message()), msg);
}

INSTANTIATE_TEST_SUITE_P(AllCodes, StatusUtilTest, ::testing::Range(kFirstCode, kLastCode + 1));

// The codes callers act on (see STYLE.md, Errors), by name: a reader's check
// that the numbering above is the one both libraries use.
TEST(StatusUtilTest, NamedCodesCallersActOn) {
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::AbortedError("x")).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("x")).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x")).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "x")).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(StatusUtilTest, UnknownCodesBecomeUnknown) {
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "x")).error_code(),
            grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(99), "x")).code(),
            absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace pstrain
