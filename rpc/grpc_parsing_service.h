// ParsingService: a grpc::Service whose handlers parse their own requests.
//
// gRPC's generated synchronous services parse the request before the
// handler runs and answer bytes that do not parse with INTERNAL and an empty
// message -- a code that says "our bug" and a message nobody can act on.
// A ParsingService registers each method with raw ByteBuffer handlers,
// parses the request itself, and answers INVALID_ARGUMENT naming the
// message type; the typed handler then runs as before. The wire format is
// unchanged: clients use the generated stubs.
//
// Thread-safety: as grpc::Service; handlers run on gRPC's sync threads.
#ifndef PSTRAIN_RPC_GRPC_PARSING_SERVICE_H_
#define PSTRAIN_RPC_GRPC_PARSING_SERVICE_H_

#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "google/protobuf/message_lite.h"

namespace pstrain {

class ParsingService : public grpc::Service {
 public:
  // Full method names ("/pstrain.JobService/SubmitJob") in registration order.
  const std::vector<std::string>& method_names() const { return method_names_; }

 protected:
  template <class Request, class Response>
  using UnaryFn = std::function<grpc::Status(grpc::ServerContext*, const Request&, Response*)>;
  template <class Request, class Response>
  using StreamFn = std::function<grpc::Status(grpc::ServerContext*, const Request&,
                                              const std::function<bool(const Response&)>& write)>;

  template <class Request, class Response>
  void AddUnary(const std::string& full_name, UnaryFn<Request, Response> fn) {
    auto handler = [fn = std::move(fn), name = full_name](ParsingService*, grpc::ServerContext* ctx,
                                                          const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
      Request request;
      grpc::Status parsed = Parse(*in, &request, name);
      if (!parsed.ok()) return parsed;
      Response response;
      grpc::Status s = fn(ctx, request, &response);
      if (!s.ok()) return s;
      return Serialize(response, out);
    };
    AddMethod(new grpc::internal::RpcServiceMethod(
        Keep(full_name), grpc::internal::RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<ParsingService, grpc::ByteBuffer, grpc::ByteBuffer>(handler, this)));
  }

  template <class Request, class Response>
  void AddServerStreaming(const std::string& full_name, StreamFn<Request, Response> fn) {
    auto handler = [fn = std::move(fn), name = full_name](ParsingService*, grpc::ServerContext* ctx,
                                                          const grpc::ByteBuffer* in,
                                                          grpc::ServerWriter<grpc::ByteBuffer>* writer) {
      Request request;
      grpc::Status parsed = Parse(*in, &request, name);
      if (!parsed.ok()) return parsed;
      return fn(ctx, request, [writer](const Response& r) {
        grpc::ByteBuffer bytes;
        return Serialize(r, &bytes).ok() && writer->Write(bytes);
      });
    };
    AddMethod(new grpc::internal::RpcServiceMethod(
        Keep(full_name), grpc::internal::RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<ParsingService, grpc::ByteBuffer, grpc::ByteBuffer>(handler,
                                                                                                      this)));
  }

  static grpc::Status Parse(const grpc::ByteBuffer& in, google::protobuf::MessageLite* out, const std::string& method);
  static grpc::Status Serialize(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out);

 private:
  const char* Keep(const std::string& name) {
    method_names_.push_back(name);
    return names_.emplace_back(name).c_str();
  }
  std::deque<std::string> names_;  // RpcServiceMethod keeps the pointer
  std::vector<std::string> method_names_;
};

}  // namespace pstrain

#endif  // PSTRAIN_RPC_GRPC_PARSING_SERVICE_H_
