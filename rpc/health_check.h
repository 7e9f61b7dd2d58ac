// A client of the standard gRPC health service (grpc.health.v1.Health/Check)
// that every pstrain server answers: what Kubernetes' gRPC probes ask, for
// `pstrain health` and the image's smoke check.
#ifndef PSTRAIN_RPC_HEALTH_CHECK_H_
#define PSTRAIN_RPC_HEALTH_CHECK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pstrain {

// The serving status of `service` ("" = the whole server) at `target`
// (host:port): "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN";
// an error when the server cannot be reached in time.
absl::StatusOr<std::string> CheckHealth(const std::string& target, const std::string& service,
                                        absl::Duration timeout);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_HEALTH_CHECK_H_
