// The one place that converts between absl::Status and grpc::Status. The
// numeric codes of the two are the same canonical codes; converting through
// this table rather than a cast keeps an unknown value from leaking through.
#ifndef PSTRAIN_RPC_STATUS_UTIL_H_
#define PSTRAIN_RPC_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pstrain {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_STATUS_UTIL_H_
