#include "rpc/health_check.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include <future>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_channel.h"
#include "rpc/status_util.h"

namespace pstrain {

// The two messages, HealthCheckRequest {string service = 1;} and
// HealthCheckResponse {ServingStatus status = 1;}, are coded by hand: their
// wire format is fixed by the protocol, and this needs no generated code.
absl::StatusOr<std::string> CheckHealth(const std::string& target, const std::string& service,
                                        absl::Duration timeout) {
  if (service.size() > 127) return absl::InvalidArgumentError("service name too long");
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);  // field 1, length-delimited
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1), response_buffer;
  grpc::GenericStub stub(CreateChannel(target, 1 << 20));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", {}, &request_buffer, &response_buffer,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status s = done.get_future().get();
  if (!s.ok()) return FromGrpcStatus(s);
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  int status = 0;  // UNKNOWN unless the field is present
  if (bytes.size() == 2 && bytes[0] == 0x08) status = static_cast<unsigned char>(bytes[1]);
  else if (!bytes.empty()) return absl::InternalError("unexpected health response");
  switch (status) {
    case 1: return std::string("SERVING");
    case 2: return std::string("NOT_SERVING");
    case 3: return std::string("SERVICE_UNKNOWN");
    default: return std::string("UNKNOWN");
  }
}

}  // namespace pstrain
