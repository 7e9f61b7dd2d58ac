#include "rpc/grpc_server.h"

#include "common/file_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

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
  // Both are process-wide switches that must be set before the builder runs.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<GrpcServer> s(new GrpcServer());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (const auto& [key, value] : BulkTransferChannelArgs()) builder.AddChannelArgument(key, value);
  for (grpc::Service* service : services) builder.RegisterService(service);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options.address,
                     ": the address is in use or not local to this machine"));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(true);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void GrpcServer::Wait() { server_->Wait(); }

}  // namespace pstrain
