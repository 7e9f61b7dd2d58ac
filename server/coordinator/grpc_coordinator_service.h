// JobService and ClusterService over gRPC, in front of a Coordinator. They
// translate only: protos in, Coordinator call, protos or a mapped status out.
// Waiting calls (WatchJob, GetAssignment, KvGet) wait at most until the
// call's deadline, in steps, and stop early when the client goes away.
#ifndef PSTRAIN_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
#define PSTRAIN_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_

#include "proto/control.grpc.pb.h"
#include "server/coordinator/coordinator.h"

namespace pstrain {

class GrpcJobService final : public JobService::Service {
 public:
  explicit GrpcJobService(Coordinator* coordinator) : coordinator_(coordinator) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const SubmitJobRequest*, SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const GetJobRequest*, JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const ListJobsRequest*, ListJobsResponse*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const WatchJobRequest*,
                        grpc::ServerWriter<JobStatus>*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const CancelJobRequest*, CancelJobResponse*) override;
  grpc::Status ListMembers(grpc::ServerContext*, const ListMembersRequest*,
                           ListMembersResponse*) override;
  grpc::Status Checkpoint(grpc::ServerContext*, const CheckpointRequest*, CheckpointResponse*) override;

 private:
  Coordinator* const coordinator_;
};

class GrpcClusterService final : public ClusterService::Service {
 public:
  explicit GrpcClusterService(Coordinator* coordinator) : coordinator_(coordinator) {}
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*, RegisterResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest*, HeartbeatResponse*) override;
  grpc::Status GetAssignment(grpc::ServerContext*, const GetAssignmentRequest*, Assignment*) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const ReportProgressRequest*,
                              ReportProgressResponse*) override;
  grpc::Status KvSet(grpc::ServerContext*, const KvSetRequest*, KvSetResponse*) override;
  grpc::Status KvGet(grpc::ServerContext*, const KvGetRequest*, KvGetResponse*) override;
  grpc::Status KvAdd(grpc::ServerContext*, const KvAddRequest*, KvAddResponse*) override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
