#include "rpc/grpc_channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

namespace pstrain {

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target, int max_message_bytes) {
  return CreateChannel(target, max_message_bytes, ProcessSecurity());
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target, int max_message_bytes,
                                             const SecurityOptions& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Each client talks to each shard over its own connection; sharing one
  // subchannel between clients in the same process would serialize them.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [key, value] : BulkTransferChannelArgs()) args.SetInt(key, value);
  // Reconnect quickly after a peer restarts (the default backoff starts at
  // 1 s and grows to 2 minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Despite its name, gRPC reads this as the least time a connection attempt
  // (TCP, TLS, HTTP/2 settings) is given, its "min connect timeout". It was
  // 100 ms here: on a loaded machine attempts were abandoned and calls failed
  // with "tcp handshaker shutdown" (grpc_channel_test). gRPC's default.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  if (security.client_tls() && !security.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(security.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, ChannelCredentialsFor(security), args);
}

}  // namespace pstrain
