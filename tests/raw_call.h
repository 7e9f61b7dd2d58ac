// One gRPC call with raw request bytes, for tests that call every method of
// a service by name (unary or server-streaming alike: one message out, read
// until the end). Returns the final status.
#ifndef PSTRAIN_TESTS_RAW_CALL_H_
#define PSTRAIN_TESTS_RAW_CALL_H_

#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <string>

#include "rpc/grpc_channel.h"
#include "rpc/security.h"

namespace pstrain {

inline grpc::Status RawCall(const std::string& target, const std::string& method, const std::string& bytes,
                            const SecurityOptions& security = ProcessSecurity()) {
  grpc::GenericStub stub(CreateChannel(target, 64 << 20, security));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer response;
  do {
    call->Read(&response, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
  } while (ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_RAW_CALL_H_
