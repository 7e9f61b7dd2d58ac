// Client channels with the same explicit message size limits as the servers.
#ifndef PSTRAIN_RPC_GRPC_CHANNEL_H_
#define PSTRAIN_RPC_GRPC_CHANNEL_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "rpc/grpc_server.h"
#include "rpc/security.h"

namespace pstrain {

// With this process's security (ProcessSecurity()): TLS and the token when
// configured.
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                             int max_message_bytes = kDefaultMaxMessageBytes);
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target, int max_message_bytes,
                                             const SecurityOptions& security);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_CHANNEL_H_
