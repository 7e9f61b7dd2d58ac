// GrpcParameterService: ParameterService over gRPC in front of any
// ParameterStore. It only decodes (tensor bytes referenced, not copied),
// calls the store, encodes (value bytes sent from the snapshot buffers, not
// copied again) and maps the status. Uses gRPC's callback API, so a call that
// waits (a SYNC PushPull for the slowest worker) holds no thread. A job's
// table is served only to callers with the job's secret (JobSecrets).
#ifndef PSTRAIN_SERVER_PS_GRPC_PARAMETER_SERVICE_H_
#define PSTRAIN_SERVER_PS_GRPC_PARAMETER_SERVICE_H_

#include "proto/parameter.grpc.pb.h"
#include "table/parameter_store.h"
#include "server/ps/job_secrets.h"
#include "server/ps/parameter_service_metrics.h"

namespace pstrain {

class GrpcParameterService final
    : public ParameterService::WithRawCallbackMethod_SetWorkers<
          ParameterService::WithRawCallbackMethod_DropTable<
          ParameterService::WithRawCallbackMethod_SaveTable<
          ParameterService::WithRawCallbackMethod_LoadTable<
          ParameterService::WithRawCallbackMethod_InitTable<
          ParameterService::WithRawCallbackMethod_Pull<
              ParameterService::WithRawCallbackMethod_Push<
                  ParameterService::WithRawCallbackMethod_PushPull<
                      ParameterService::WithRawCallbackMethod_Stats<ParameterService::Service>>>>>>>>> {
 public:
  // `store` (and `metrics`, if given) are not owned and must outlive the
  // service.
  explicit GrpcParameterService(ParameterStore* store, ParameterServiceMetrics* metrics = nullptr)
      : store_(store), metrics_(metrics) {}

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

 private:
  ParameterStore* const store_;
  ParameterServiceMetrics* const metrics_;
  JobSecrets secrets_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_GRPC_PARAMETER_SERVICE_H_
