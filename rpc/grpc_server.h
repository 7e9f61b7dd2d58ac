// Server scaffolding shared by every pstrain server: explicit message size
// limits, the standard gRPC health service (grpc.health.v1, for Kubernetes
// probes) and server reflection, port 0 binding with the chosen port read
// back, and the credentials of rpc/security.h.
//
// Lifecycle: Create() builds and starts (STARTED); Shutdown() marks every
// service NOT_SERVING, stops accepting calls and waits for in-flight ones up
// to a deadline (STOPPED). Shutdown() is idempotent and thread-safe.
#ifndef PSTRAIN_RPC_GRPC_SERVER_H_
#define PSTRAIN_RPC_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/security.h"

namespace pstrain {

// Default for both ends: large enough for a 4 MiB-chunked model push of
// 64 chunks, small enough that a bad client cannot make a server allocate
// gigabytes. Configurable per server and per channel.
constexpr int kDefaultMaxMessageBytes = 256 << 20;

// HTTP/2 and TCP settings for bulk tensor traffic, used on both ends: the
// defaults (16 KiB frames, small read chunks) cost a lot of per-byte CPU when
// messages are megabytes.
std::vector<std::pair<std::string, int>> BulkTransferChannelArgs();

struct GrpcServerOptions {
  // "host:port"; port 0 picks a free port.
  std::string address = "0.0.0.0:0";
  int max_message_bytes = kDefaultMaxMessageBytes;
  // If set, local_target() is written here (atomically) once serving: how
  // scripts and tests learn a port 0 picked.
  std::string port_file;
  // TLS and the token check (ServerSecurityFor); default: plaintext, no
  // tokens -- with a warning unless the address is a loopback one.
  ServerSecurity security;
  // >= 0: also serve grpc.health.v1 alone, in plaintext, on this port of the
  // same host (0 picks one): for Kubernetes' gRPC probes, which cannot speak
  // TLS. It reports the main server's status and nothing else.
  int health_port = -1;
  // > 0: at most this many threads serve calls (grpc::ResourceQuota). A
  // synchronous server holds one per call in progress; past the bound a
  // call is refused RESOURCE_EXHAUSTED ("Server Threadpool Exhausted")
  // instead of the process running out of threads. 0: gRPC's default, no
  // bound.
  int max_threads = 0;
};

class GrpcServer {
 public:
  // Registers `services` (not owned; they must outlive the server), starts
  // serving and reports every service SERVING.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Create(
      const GrpcServerOptions& options, const std::vector<grpc::Service*>& services);
  ~GrpcServer();

  int port() const { return port_; }
  // The plaintext health port, or -1.
  int health_port() const { return health_port_; }
  // "127.0.0.1:<port>" style target for clients on this machine.
  std::string local_target() const;

  void Shutdown(absl::Duration grace = absl::Seconds(5));
  void Wait();

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;
  std::vector<std::string> service_names_;
  int port_ = 0;
  int health_port_ = -1;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_SERVER_H_
