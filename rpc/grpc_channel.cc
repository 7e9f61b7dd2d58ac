#include "rpc/grpc_channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>

#include <chrono>

#include "absl/synchronization/notification.h"

namespace pstrain {
namespace {

// gRPC 1.51 (on Linux) runs every callback-API completion of a process on
// one completion queue and its "nexting" threads, created when the first
// channel makes a callback call and shut down when the last such channel is
// destroyed -- even while gRPC is still finishing a callback of a call made
// on it. Destroying a process's last client right after its last call
// returned (a test's or a worker's shard clients, a health check's channel)
// then aborted the process: "ref_counted.h: assertion failed: prior > 0" in
// grpc_cq_internal_unref on a nexting thread (multiprocess_ps_test, about 1
// run in 60 on a loaded machine; a worker once). One channel that has made a
// callback call and is never destroyed keeps that queue for the process's
// life. Its one call has a deadline already past: it fails at once and
// never needs the (unused) address it names.
void KeepCallbackQueueForTheProcess() {
  static const bool kept = [] {
    auto* channel = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
    auto* stub = new grpc::GenericStub(*channel);
    auto* context = new grpc::ClientContext();
    context->set_deadline(std::chrono::system_clock::now());
    grpc::Slice empty;
    auto* request = new grpc::ByteBuffer(&empty, 1);  // an empty message (a null buffer cannot be sent)
    auto* response = new grpc::ByteBuffer();
    absl::Notification done;
    stub->UnaryCall(context, "/pstrain.Anchor/Keep", grpc::StubOptions(), request, response,
                    [&done](grpc::Status) { done.Notify(); });
    done.WaitForNotification();
    return true;  // all of it stays allocated: it must outlive every other channel
  }();
  (void)kept;
}

}  // namespace

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target, int max_message_bytes) {
  return CreateChannel(target, max_message_bytes, ProcessSecurity());
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target, int max_message_bytes,
                                             const SecurityOptions& security) {
  KeepCallbackQueueForTheProcess();
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
