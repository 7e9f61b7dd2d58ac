// GrpcEmbeddingService: the shard's EmbeddingService (proto/embedding.proto)
// in front of an EmbeddingStore. Who may do what, as for dense tables
// (server/ps/grpc_parameter_service.h):
// - a job's embeddings are served only to callers with the job's secret
//   (JobSecrets: recorded by the first InitEmbeddings, forgotten by a drop);
// - with a grant key, InitEmbeddings needs the coordinator's table grant for
//   the job, attempt and secret (rpc/table_grant.h);
// - ReplicateEmbeddings is other shards' (a shard token, and the job's
//   secret), as ParameterService.Replicate;
// - DropEmbeddings, SaveEmbeddings and LoadEmbeddings are the coordinator's
//   (a coordinator token); checkpoint files are read and written only under
//   the shard's checkpoint root, and written only in a directory named after
//   the job.
// Synchronous handlers (a ParsingService: bytes that are not the request get
// INVALID_ARGUMENT): a SYNC lookup waits on its thread, bounded by the
// store's max_waiters and the call's deadline.
#ifndef PSTRAIN_SERVER_PS_GRPC_EMBEDDING_SERVICE_H_
#define PSTRAIN_SERVER_PS_GRPC_EMBEDDING_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "embedding/embedding_store.h"
#include "proto/embedding.pb.h"
#include "rpc/grpc_parsing_service.h"
#include "rpc/table_grant.h"
#include "rpc/token_table.h"
#include "server/ps/job_secrets.h"
#include "table/shard_store.h"

namespace pstrain {

class GrpcEmbeddingService final : public ParsingService {
 public:
  struct Options {
    std::shared_ptr<TokenTable> tokens;                // null: authentication off
    std::shared_ptr<const TableGrantVerifier> grants;  // null: no grants checked
    // Absolute, symlink-free (CanonicalRoot); empty: checkpoints refused.
    std::string checkpoint_root;
  };
  // `store` is not owned and must outlive the service.
  GrpcEmbeddingService(EmbeddingStore* store, Options options);

  // The jobs' secrets as the callers presented them: what this shard
  // presents when it forwards a job's rows to its other shards.
  const JobSecrets& secrets() const { return secrets_; }

 private:
  grpc::Status InitEmbeddings(grpc::ServerContext* context, const InitEmbeddingsRequest& request,
                              InitEmbeddingsResponse* response);
  grpc::Status Lookup(grpc::ServerContext* context, const EmbeddingLookupRequest& request,
                      EmbeddingLookupResponse* response);
  grpc::Status Update(grpc::ServerContext* context, const EmbeddingUpdateRequest& request,
                      EmbeddingUpdateResponse* response);
  grpc::Status DropEmbeddings(grpc::ServerContext* context, const DropEmbeddingsRequest& request,
                              DropEmbeddingsResponse* response);
  grpc::Status Stats(grpc::ServerContext* context, const EmbeddingStatsRequest& request,
                     EmbeddingStatsResponse* response);
  grpc::Status SaveEmbeddings(grpc::ServerContext* context, const SaveEmbeddingsRequest& request,
                              SaveEmbeddingsResponse* response);
  grpc::Status LoadEmbeddings(grpc::ServerContext* context, const LoadEmbeddingsRequest& request,
                              LoadEmbeddingsResponse* response);
  // A slot leader's forward to this backup (replicated tables).
  grpc::Status ReplicateEmbeddings(grpc::ServerContext* context, const ReplicateEmbeddingsRequest& request,
                                   ReplicateEmbeddingsResponse* response);
  // OK for a coordinator's call, PERMISSION_DENIED naming the method else.
  absl::Status CoordinatorOnly(const grpc::ServerContext& context, const char* method) const;
  // `name` resolved under the checkpoint root (FAILED_PRECONDITION without
  // one; as ResolveUnderRoot otherwise).
  absl::StatusOr<std::string> Resolve(const std::string& name) const;

  EmbeddingStore* const store_;
  const Options options_;
  JobSecrets secrets_;
};

// The coordinator's SetWorkers on a shard, after its dense store took it
// (GrpcParameterService::Options::on_set_workers): the embedding tables
// learn the seats and the routing too. A hybrid job (all-reduce with
// embeddings) has no dense table here: its call is answered by its
// embedding tables, for a caller with the secret they recorded
// (PERMISSION_DENIED otherwise), and keeps the dense store's answer when
// they do not hold the job either.
std::function<absl::Status(const SetWorkersRequest&, const std::string& secret, absl::Status dense)>
SetWorkersOnEmbeddings(ShardStore* dense, EmbeddingStore* embeddings, const GrpcEmbeddingService* service);

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_GRPC_EMBEDDING_SERVICE_H_
