#include "server/ps/grpc_embedding_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/caller.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/security.h"
#include "rpc/status_util.h"
#include "server/ps/job_paths.h"
#include "spdlog/spdlog.h"

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
  PSTRAIN_UNARY(SaveEmbeddings, SaveEmbeddingsRequest, SaveEmbeddingsResponse);
  PSTRAIN_UNARY(LoadEmbeddings, LoadEmbeddingsRequest, LoadEmbeddingsResponse);
  PSTRAIN_UNARY(ReplicateEmbeddings, ReplicateEmbeddingsRequest, ReplicateEmbeddingsResponse);
}

absl::Status GrpcEmbeddingService::CoordinatorOnly(const grpc::ServerContext& context, const char* method) const {
  const Caller caller = CallerOf(context, options_.tokens.get());
  if (caller.IsCoordinator()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(method, " is the coordinator's to call, and this is a ",
                                                  CallerRoleName(caller.role),
                                                  " token (it takes one of group pstrain:coordinator)"));
}

absl::StatusOr<std::string> GrpcEmbeddingService::Resolve(const std::string& name) const {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError("this shard has no --checkpoint_root: embedding checkpoints are refused");
  }
  return ResolveUnderRoot(options_.checkpoint_root, name);
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

grpc::Status GrpcEmbeddingService::ReplicateEmbeddings(grpc::ServerContext* context,
                                                       const ReplicateEmbeddingsRequest& request,
                                                       ReplicateEmbeddingsResponse* response) {
  // Shard tokens only (rpc/security.cc), and the job's secret.
  const std::string secret = MetadataValue(*context, kJobSecretMetadata);
  if (absl::Status s = secrets_.Check(request.job(), secret); !s.ok()) return ToGrpcStatus(s);
  if (!request.has_copy_init()) return ToGrpcStatus(store_->Replicate(request, response));
  // A spare's first copy of a slot makes the job here: its secret is
  // recorded as InitEmbeddings records it.
  secrets_.BeginMake(request.job());
  absl::Status s = store_->Replicate(request, response);
  secrets_.EndMake(request.job(), s.ok(), secret);
  return ToGrpcStatus(s);
}

grpc::Status GrpcEmbeddingService::DropEmbeddings(grpc::ServerContext* context, const DropEmbeddingsRequest& request,
                                                  DropEmbeddingsResponse*) {
  if (absl::Status s = CoordinatorOnly(*context, "DropEmbeddings"); !s.ok()) return ToGrpcStatus(s);
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

grpc::Status GrpcEmbeddingService::SaveEmbeddings(grpc::ServerContext* context, const SaveEmbeddingsRequest& request,
                                                  SaveEmbeddingsResponse* response) {
  absl::Status s = CoordinatorOnly(*context, "SaveEmbeddings");
  if (s.ok()) s = secrets_.Check(request.job(), MetadataValue(*context, kJobSecretMetadata));
  if (s.ok() && !InJobDirectory(request.path(), request.job())) {
    s = absl::PermissionDeniedError(absl::StrCat("SaveEmbeddings of job ", Quote(request.job()), ": ",
                                                 Quote(request.path(), 128),
                                                 " is not in a directory named after the job (its <output_dir>/<job>/)"));
  }
  if (!s.ok()) return ToGrpcStatus(s);
  auto path = Resolve(request.path());
  if (!path.ok()) return ToGrpcStatus(path.status());
  auto info = store_->Save(request.job(), request.attempt(), *path, request.checkpoint_id(), request.base_id());
  if (!info.ok()) return ToGrpcStatus(info.status());
  response->set_bytes(info->bytes);
  response->set_crc32(info->crc32);
  response->set_rows(info->rows);
  response->set_unchanged_rows(info->unchanged_rows);
  response->set_incremental(info->incremental);
  return grpc::Status::OK;
}

grpc::Status GrpcEmbeddingService::LoadEmbeddings(grpc::ServerContext* context, const LoadEmbeddingsRequest& request,
                                                  LoadEmbeddingsResponse*) {
  const std::string& job = request.init().job();
  const std::string secret = MetadataValue(*context, kJobSecretMetadata);
  absl::Status s = CoordinatorOnly(*context, "LoadEmbeddings");
  if (s.ok()) s = secrets_.Check(job, secret);
  int files = request.paths_size();
  for (const auto& base : request.bases()) files += base.paths_size();
  if (s.ok() && (files > 4096 || request.bases_size() > 64)) {
    s = absl::InvalidArgumentError(absl::StrCat("LoadEmbeddings names ", files, " files of ", request.bases_size() + 1,
                                                " checkpoints; at most 4096 files of 65 checkpoints"));
  }
  // The bases, oldest first, then the checkpoint itself.
  std::vector<std::vector<std::string>> chain;
  for (int k = 0; s.ok() && k <= request.bases_size(); ++k) {
    chain.emplace_back();
    for (const std::string& name : k < request.bases_size() ? request.bases(k).paths() : request.paths()) {
      auto path = Resolve(name);
      if (!path.ok()) {
        s = path.status();
        break;
      }
      chain.back().push_back(*path);
    }
  }
  if (!s.ok()) return ToGrpcStatus(s);
  secrets_.BeginMake(job);
  s = store_->Load(request.init(), chain, request.start_step());
  secrets_.EndMake(job, s.ok(), secret);
  return ToGrpcStatus(s);
}

std::function<absl::Status(const SetWorkersRequest&, const std::string& secret, absl::Status dense)>
SetWorkersOnEmbeddings(ShardStore* dense, EmbeddingStore* embeddings, const GrpcEmbeddingService* service) {
  return [dense, embeddings, service](const SetWorkersRequest& r, const std::string& secret, absl::Status answer) {
    if (answer.ok()) {
      // A job without embeddings: nothing to tell (FAILED_PRECONDITION).
      // A SYNC step SetWorkers completed may fail its update: the step is
      // done all the same, as when a worker's arrival completes it.
      absl::Status s = embeddings->SetWorkers(r);
      if (!s.ok() && !absl::IsFailedPrecondition(s)) {
        spdlog::warn("job {}: the embedding step SetWorkers completed: {}", Quote(r.job(), 64), s.ToString());
      }
      return answer;
    }
    if (dense->HoldsTable(r.job())) return answer;
    if (absl::Status s = service->secrets().Check(r.job(), secret); !s.ok()) return s;
    if (!embeddings->SetWorkers(r).ok()) return answer;
    return absl::OkStatus();
  };
}

}  // namespace pstrain
