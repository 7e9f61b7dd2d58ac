#include "rpc/grpc_channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

namespace pstrain {

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Each client talks to each shard over its own connection; sharing one
  // subchannel between clients in the same process would serialize them.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [key, value] : BulkTransferChannelArgs()) args.SetInt(key, value);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace pstrain
