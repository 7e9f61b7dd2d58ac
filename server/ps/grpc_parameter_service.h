// GrpcParameterService: ParameterService over gRPC in front of any
// ParameterStore. It only decodes (tensor bytes referenced, not copied),
// calls the store, encodes (value bytes sent from the snapshot buffers, not
// copied again) and maps the status. Uses gRPC's callback API, so a call that
// waits (a SYNC PushPull for the slowest worker) holds no thread.
//
// Who may do what (with tokens; with authentication off, everyone may):
// - a job's table is served only to callers with the job's secret
//   (JobSecrets);
// - with a grant key, a table is made (InitTable, LoadTable) only with the
//   coordinator's grant for its job, attempt and secret (rpc/table_grant.h);
// - the coordinator's own calls -- DropTable, SaveTable, LoadTable,
//   SetWorkers and Stats of every table -- take a coordinator token (or the
//   any-member cluster token): a worker cannot drop, overwrite or list
//   tables;
// - SaveTable writes only under a directory named after the job (its
//   <output_dir>/<job>/), never over another job's checkpoint.
#ifndef PSTRAIN_SERVER_PS_GRPC_PARAMETER_SERVICE_H_
#define PSTRAIN_SERVER_PS_GRPC_PARAMETER_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "proto/parameter.grpc.pb.h"
#include "rpc/table_grant.h"
#include "rpc/token_table.h"
#include "table/parameter_store.h"
#include "server/ps/job_secrets.h"
#include "server/ps/parameter_service_metrics.h"

namespace pstrain {

class GrpcParameterService final
    : public ParameterService::WithRawCallbackMethod_Replicate<
          ParameterService::WithRawCallbackMethod_SetWorkers<
          ParameterService::WithRawCallbackMethod_DropTable<
          ParameterService::WithRawCallbackMethod_SaveTable<
          ParameterService::WithRawCallbackMethod_LoadTable<
          ParameterService::WithRawCallbackMethod_InitTable<
          ParameterService::WithRawCallbackMethod_Pull<
              ParameterService::WithRawCallbackMethod_Push<
                  ParameterService::WithRawCallbackMethod_PushPull<
                      ParameterService::WithRawCallbackMethod_Stats<ParameterService::Service>>>>>>>>>> {
 public:
  struct Options {
    ParameterServiceMetrics* metrics = nullptr;  // not owned; may be null
    // The server's token table (null: authentication off, every caller
    // may do everything).
    std::shared_ptr<TokenTable> tokens;
    // Checks the coordinator's table grants (null: tables are made without).
    std::shared_ptr<const TableGrantVerifier> grants;
    // Told of each SetWorkers after the store (the shard's embedding tables
    // learn which ranks are active and the routing), with the secret the
    // caller presented and the store's answer; returns the call's answer
    // (a hybrid job's shard holds no dense table, and its embedding tables
    // answer: SetWorkersOnEmbeddings). May be empty.
    std::function<absl::Status(const SetWorkersRequest&, const std::string& secret, absl::Status dense)>
        on_set_workers;
  };
  // `store` (and options.metrics) are not owned and must outlive the
  // service.
  explicit GrpcParameterService(ParameterStore* store, ParameterServiceMetrics* metrics = nullptr)
      : GrpcParameterService(store, Options{metrics, nullptr, nullptr, {}}) {}
  GrpcParameterService(ParameterStore* store, Options options)
      : store_(store), metrics_(options.metrics), options_(std::move(options)) {}

  grpc::ServerUnaryReactor* InitTable(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SaveTable(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LoadTable(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DropTable(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetWorkers(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  // A primary shard's forward to this backup (shard tokens only).
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

  // The jobs' secrets as the callers presented them: what this shard
  // presents when it forwards a job's updates to its other shards.
  const JobSecrets& secrets() const { return secrets_; }

 private:
  // What a call needs besides the job secret: the coordinator's token,
  // its grant, a path in the job's directory. OK or PERMISSION_DENIED.
  absl::Status CoordinatorOnly(const grpc::CallbackServerContext* context, const char* method) const;
  absl::Status Granted(const grpc::CallbackServerContext* context, const std::string& job, uint64_t attempt,
                       const char* method) const;

  ParameterStore* const store_;
  ParameterServiceMetrics* const metrics_;
  const Options options_;
  JobSecrets secrets_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_GRPC_PARAMETER_SERVICE_H_
