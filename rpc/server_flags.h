// The listening flags both gRPC server binaries (pstrain-ps,
// pstrain-coordinator) take, defined once so that they mean the same in
// both (each also a PSTRAIN_* variable, see common/env_flags.h):
//   --host --port --port_file   the gRPC server's address; port 0 picks a
//                               free one, written to the port file
//   --health_port               plaintext grpc.health.v1 alone (probes)
//   --metrics_port --metrics_host  the Prometheus endpoint (host default:
//                               --host)
// Each binary validates the ranges it needs (--port in 0..65535).
#ifndef PSTRAIN_RPC_SERVER_FLAGS_H_
#define PSTRAIN_RPC_SERVER_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "rpc/grpc_server.h"
#include "rpc/security.h"

ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(int, health_port);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, metrics_host);

namespace pstrain {

// The server's address, port file and health port from the flags, with
// `security`; the caller sets the rest (message size, threads).
GrpcServerOptions GrpcServerOptionsFromFlags(const ServerSecurity& security);

// --metrics_host, or --host when it is empty.
std::string MetricsHostFromFlags();

}  // namespace pstrain

#endif  // PSTRAIN_RPC_SERVER_FLAGS_H_
