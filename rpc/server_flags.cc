#include "rpc/server_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "If set, write the chosen host:port here (atomically) once serving.");
ABSL_FLAG(int, health_port, -1,
          "Also serve the gRPC health service alone, in plaintext, on this port (for Kubernetes probes when "
          "the main port needs TLS; 0 picks one; -1 off).");
ABSL_FLAG(int, metrics_port, -1, "Prometheus /metrics HTTP port (0 picks one; -1 off).");
ABSL_FLAG(std::string, metrics_host, "", "Address of the Prometheus /metrics endpoint (default: --host).");

namespace pstrain {

GrpcServerOptions GrpcServerOptionsFromFlags(const ServerSecurity& security) {
  GrpcServerOptions options;
  options.security = security;
  options.health_port = absl::GetFlag(FLAGS_health_port);
  options.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  options.port_file = absl::GetFlag(FLAGS_port_file);
  return options;
}

std::string MetricsHostFromFlags() {
  const std::string host = absl::GetFlag(FLAGS_metrics_host);
  return host.empty() ? absl::GetFlag(FLAGS_host) : host;
}

}  // namespace pstrain
