// JobService and ClusterService over gRPC, in front of a Coordinator. They
// translate only: protos in, Coordinator call, protos or a mapped status out.
// Requests are parsed by ParsingService, so bytes that are not the method's
// message get INVALID_ARGUMENT with a message, not gRPC's empty INTERNAL.
// Waiting calls (WatchJob, GetAssignment, KvGet) wait at most until the
// call's deadline, in steps, and stop early when the client goes away; how
// many may wait at once is bounded (Coordinator::OpenWatch and
// wait_limits.h), so that they never take the server's last threads.
#ifndef PSTRAIN_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
#define PSTRAIN_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_

#include "proto/control.pb.h"
#include "rpc/grpc_parsing_service.h"
#include "rpc/token_table.h"
#include "server/coordinator/coordinator.h"

namespace pstrain {

// pstrain.JobService: for people and tools.
//
// Who may do what: the server's token check (rpc/security.h) lets only user
// and admin tokens in; here a user sees and changes only the jobs they
// submitted (`tokens`: the server's table, null with authentication off).
class GrpcJobService final : public ParsingService {
 public:
  explicit GrpcJobService(Coordinator* coordinator, std::shared_ptr<TokenTable> tokens = nullptr);

 private:
  grpc::Status SubmitJob(grpc::ServerContext*, const SubmitJobRequest&, SubmitJobResponse*);
  grpc::Status GetJob(grpc::ServerContext*, const GetJobRequest&, JobStatus*);
  grpc::Status ListJobs(grpc::ServerContext*, const ListJobsRequest&, ListJobsResponse*);
  grpc::Status WatchJob(grpc::ServerContext*, const WatchJobRequest&,
                        const std::function<bool(const JobStatus&)>& write);
  grpc::Status CancelJob(grpc::ServerContext*, const CancelJobRequest&, CancelJobResponse*);
  grpc::Status ScaleJob(grpc::ServerContext*, const ScaleJobRequest&, JobStatus*);
  grpc::Status ListMembers(grpc::ServerContext*, const ListMembersRequest&, ListMembersResponse*);
  grpc::Status Checkpoint(grpc::ServerContext*, const CheckpointRequest&, CheckpointResponse*);

  // OK when the caller may see and change `job_id`.
  grpc::Status Authorize(const grpc::ServerContext& ctx, const std::string& job_id);

  Coordinator* const coordinator_;
  const std::shared_ptr<TokenTable> tokens_;
};

// pstrain.ClusterService: for the shards and workers of the pool.
//
// With `names_from_certificates` (and mutual TLS), a member registers only
// under a name its client certificate carries (its common name or a DNS
// subject alternative name; a wildcard *.d covers x.d): one certificate per
// member (cert-manager's CSI driver issues one per pod) binds the name to
// the key. Without it, names are bound by member ids (see Membership).
class GrpcClusterService final : public ParsingService {
 public:
  // `tokens`: the server's table (null with authentication off), for the
  // role a registering member's token carries.
  explicit GrpcClusterService(Coordinator* coordinator, bool names_from_certificates = false,
                              std::shared_ptr<TokenTable> tokens = nullptr);

 private:
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest&, RegisterResponse*);
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest&, HeartbeatResponse*);
  grpc::Status GetAssignment(grpc::ServerContext*, const GetAssignmentRequest&, Assignment*);
  grpc::Status ReportProgress(grpc::ServerContext*, const ReportProgressRequest&, ReportProgressResponse*);
  grpc::Status KvSet(grpc::ServerContext*, const KvSetRequest&, KvSetResponse*);
  grpc::Status KvGet(grpc::ServerContext*, const KvGetRequest&, KvGetResponse*);
  grpc::Status KvAdd(grpc::ServerContext*, const KvAddRequest&, KvAddResponse*);

  Coordinator* const coordinator_;
  const bool names_from_certificates_;
  const std::shared_ptr<TokenTable> tokens_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_GRPC_COORDINATOR_SERVICE_H_
