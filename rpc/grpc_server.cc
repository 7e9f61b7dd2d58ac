#include "rpc/grpc_server.h"

#include "common/file_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace pstrain {

std::vector<std::pair<std::string, int>> BulkTransferChannelArgs() {
  return {
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 * 1024 * 1024 - 1},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024 * 1024},
      {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 * 1024},
      {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 * 1024 * 1024},
  };
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Create(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services) {
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_message_bytes must be positive");
  }
  if (options.max_threads < 0) return absl::InvalidArgumentError("max_threads must not be negative");
  // Both are process-wide switches that must be set before the builder runs.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<GrpcServer> s(new GrpcServer());
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials = options.security.credentials;
  if (credentials == nullptr) {
    credentials = grpc::InsecureServerCredentials();
    const std::string host = options.address.substr(0, options.address.rfind(':'));
    if (!IsLoopbackHost(host)) {
      spdlog::warn("serving {} in plaintext without authentication: anyone who reaches it can call it; "
                   "set --tls_cert, --tls_key, --tls_ca and --token_auth_file (see deploy/README.md)",
                   options.address);
    }
  }
  builder.AddListeningPort(options.address, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (const auto& [key, value] : BulkTransferChannelArgs()) builder.AddChannelArgument(key, value);
  if (options.max_threads > 0) {
    grpc::ResourceQuota quota("pstrain-server");
    quota.SetMaxThreads(options.max_threads);
    builder.SetResourceQuota(quota);
  }
  for (grpc::Service* service : services) builder.RegisterService(service);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options.address,
                     ": the address is in use or not local to this machine"));
  }
  if (options.health_port >= 0) {
    const std::string host = options.address.substr(0, options.address.rfind(':'));
    const std::string address = absl::StrCat(host, ":", options.health_port);
    grpc::ServerBuilder health_builder;
    health_builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &s->health_port_);
    s->health_server_ = health_builder.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ <= 0) {
      return absl::UnavailableError(absl::StrCat("could not listen on ", address, " (health port)"));
    }
  }
  for (grpc::Server* server : {s->server_.get(), s->health_server_.get()}) {
    if (server == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(true);
  }
  if (!options.port_file.empty()) {
    absl::Status written = WriteFileAtomically(options.port_file, s->local_target() + "\n");
    if (!written.ok()) return written;
  }
  return s;
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

std::string GrpcServer::local_target() const { return absl::StrCat("127.0.0.1:", port_); }

void GrpcServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(false);
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  if (health_server_ != nullptr) health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
}

void GrpcServer::Wait() { server_->Wait(); }

}  // namespace pstrain
