#include "server/ps/grpc_embedding_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/caller.h"
#include "common/quote.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/security.h"
#include "rpc/status_util.h"

namespace pstrain {
namespace {

std::string MetadataValue(const grpc::ServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace

#define PSTRAIN_UNARY(Method, Request, Response)                                                        \
  AddUnary<Request, Response>("/pstrain.EmbeddingService/" #Method,                                    \
                              [this](grpc::ServerContext* ctx, const Request& req, Response* resp) { \
                                return Method(ctx, req, resp);                                       \
                              })

GrpcEmbeddingService::GrpcEmbeddingService(EmbeddingStore* store, Options options)
    : store_(store), options_(std::move(options)) {
  PSTRAIN_UNARY(InitEmbeddings, InitEmbeddingsRequest, InitEmbeddingsResponse);
  PSTRAIN_UNARY(Lookup, EmbeddingLookupRequest, EmbeddingLookupResponse);
  PSTRAIN_UNARY(Update, EmbeddingUpdateRequest, EmbeddingUpdateResponse);
  PSTRAIN_UNARY(DropEmbeddings, DropEmbeddingsRequest, DropEmbeddingsResponse);
  PSTRAIN_UNARY(Stats, EmbeddingStatsRequest, EmbeddingStatsResponse);
}

#undef PSTRAIN_UNARY

grpc::Status GrpcEmbeddingService::InitEmbeddings(grpc::ServerContext* context, const InitEmbeddingsRequest& request,
                                                  InitEmbeddingsResponse* response) {
  const std::string secret = MetadataValue(*context, kJobSecretMetadata);
  if (absl::Status s = secrets_.Check(request.job(), secret); !s.ok()) return ToGrpcStatus(s);
  if (options_.grants != nullptr && !options_.grants->Valid(request.job(), request.attempt(), secret,
                                                            MetadataValue(*context, kTableGrantMetadata))) {
    return ToGrpcStatus(absl::PermissionDeniedError(
        absl::StrCat("InitEmbeddings of job ", Quote(request.job()), " attempt ", request.attempt(),
                     ": no table grant of this shard's coordinator for the job, attempt and secret (is this shard's "
                     "--table_grant_public_key_file the public key of the coordinator's --table_grant_key_file?)")));
  }
  secrets_.BeginMake(request.job());
  absl::Status s = store_->Init(request, response);
  secrets_.EndMake(request.job(), s.ok(), secret);
  return ToGrpcStatus(s);
}

grpc::Status GrpcEmbeddingService::Lookup(grpc::ServerContext* context, const EmbeddingLookupRequest& request,
                                          EmbeddingLookupResponse* response) {
  if (absl::Status s = secrets_.Check(request.job(), MetadataValue(*context, kJobSecretMetadata)); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(store_->Lookup(request, DeadlineOf(*context), response));
}

grpc::Status GrpcEmbeddingService::Update(grpc::ServerContext* context, const EmbeddingUpdateRequest& request,
                                          EmbeddingUpdateResponse*) {
  if (absl::Status s = secrets_.Check(request.job(), MetadataValue(*context, kJobSecretMetadata)); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(store_->Update(request));
}

grpc::Status GrpcEmbeddingService::DropEmbeddings(grpc::ServerContext* context, const DropEmbeddingsRequest& request,
                                                  DropEmbeddingsResponse*) {
  const Caller caller = CallerOf(*context, options_.tokens.get());
  if (!caller.IsCoordinator()) {
    return ToGrpcStatus(absl::PermissionDeniedError(
        absl::StrCat("DropEmbeddings is the coordinator's to call, and this is a ", CallerRoleName(caller.role),
                     " token (it takes one of group pstrain:coordinator)")));
  }
  const JobSecrets::DropTicket ticket = secrets_.BeginDrop(request.job());
  absl::Status s = store_->Drop(request);
  secrets_.EndDrop(request.job(), ticket, s.ok());
  return ToGrpcStatus(s);
}

grpc::Status GrpcEmbeddingService::Stats(grpc::ServerContext* context, const EmbeddingStatsRequest& request,
                                         EmbeddingStatsResponse* response) {
  if (absl::Status s = secrets_.Check(request.job(), MetadataValue(*context, kJobSecretMetadata)); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(store_->Stats(request, response));
}

}  // namespace pstrain
