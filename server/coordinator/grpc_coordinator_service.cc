#include "server/coordinator/grpc_coordinator_service.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "rpc/security.h"
#include "rpc/status_util.h"

namespace pstrain {
namespace {

// The earlier of the call's deadline and now + `cap`.
absl::Time WaitUntil(const grpc::ServerContext* ctx, absl::Duration cap) {
  absl::Time limit = absl::Now() + cap;
  const auto d = ctx->deadline();
  if (d < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    limit = std::min(limit, absl::FromChrono(d));
  }
  return limit;
}

template <typename T>
grpc::Status Fill(absl::StatusOr<T> v, T* out) {
  if (!v.ok()) return ToGrpcStatus(v.status());
  *out = std::move(*v);
  return grpc::Status::OK;
}

// The names a peer's verified certificate carries.
struct CertificateNames {
  explicit CertificateNames(const grpc::AuthContext& auth) {
    if (!auth.IsPeerAuthenticated()) return;
    for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
      for (const grpc::string_ref& v : auth.FindPropertyValues(property)) names.emplace_back(v.data(), v.size());
    }
  }
  bool Covers(const std::string& name) const {
    if (name.empty()) return false;
    for (const std::string& n : names) {
      if (n == name) return true;
      // *.d covers x.d (one label, as TLS itself matches wildcards).
      if (n.size() > 2 && n[0] == '*' && n[1] == '.' && name.size() > n.size() - 1 &&
          name.compare(name.size() - (n.size() - 1), n.size() - 1, n, 1) == 0 &&
          name.find('.') == name.size() - (n.size() - 1)) {
        return true;
      }
    }
    return false;
  }
  std::vector<std::string> names;
};

// Member ids and the job secret are members' credentials: never shown to
// JobService callers.
void ScrubCredentials(JobStatus* st) {
  for (MemberStatus& m : *st->mutable_members()) m.clear_member_id();
  st->clear_job_secret();
}

// Fill for a job's status, scrubbed, as JobService callers get it.
grpc::Status FillScrubbed(absl::StatusOr<JobStatus> v, JobStatus* out) {
  grpc::Status s = Fill(std::move(v), out);
  ScrubCredentials(out);
  return s;
}

}  // namespace

#define PSTRAIN_UNARY(Service, Method, Request, Response)                                          \
  AddUnary<Request, Response>("/pstrain." #Service "/" #Method,                                     \
                              [this](grpc::ServerContext* ctx, const Request& req, Response* resp) { \
                                return Method(ctx, req, resp);                                       \
                              })

GrpcJobService::GrpcJobService(Coordinator* coordinator, std::shared_ptr<TokenTable> tokens)
    : coordinator_(coordinator), tokens_(std::move(tokens)) {
  PSTRAIN_UNARY(JobService, SubmitJob, SubmitJobRequest, SubmitJobResponse);
  PSTRAIN_UNARY(JobService, GetJob, GetJobRequest, JobStatus);
  PSTRAIN_UNARY(JobService, ListJobs, ListJobsRequest, ListJobsResponse);
  AddServerStreaming<WatchJobRequest, JobStatus>(
      "/pstrain.JobService/WatchJob",
      [this](grpc::ServerContext* ctx, const WatchJobRequest& req, const std::function<bool(const JobStatus&)>& w) {
        return WatchJob(ctx, req, w);
      });
  PSTRAIN_UNARY(JobService, CancelJob, CancelJobRequest, CancelJobResponse);
  PSTRAIN_UNARY(JobService, ScaleJob, ScaleJobRequest, JobStatus);
  PSTRAIN_UNARY(JobService, Checkpoint, CheckpointRequest, CheckpointResponse);
  PSTRAIN_UNARY(JobService, ListMembers, ListMembersRequest, ListMembersResponse);
}

GrpcClusterService::GrpcClusterService(Coordinator* coordinator, bool names_from_certificates,
                                       std::shared_ptr<TokenTable> tokens)
    : coordinator_(coordinator), names_from_certificates_(names_from_certificates), tokens_(std::move(tokens)) {
  PSTRAIN_UNARY(ClusterService, Register, RegisterRequest, RegisterResponse);
  PSTRAIN_UNARY(ClusterService, Heartbeat, HeartbeatRequest, HeartbeatResponse);
  PSTRAIN_UNARY(ClusterService, GetAssignment, GetAssignmentRequest, Assignment);
  PSTRAIN_UNARY(ClusterService, ReportProgress, ReportProgressRequest, ReportProgressResponse);
  PSTRAIN_UNARY(ClusterService, KvSet, KvSetRequest, KvSetResponse);
  PSTRAIN_UNARY(ClusterService, KvGet, KvGetRequest, KvGetResponse);
  PSTRAIN_UNARY(ClusterService, KvAdd, KvAddRequest, KvAddResponse);
}

#undef PSTRAIN_UNARY

grpc::Status GrpcJobService::Authorize(const grpc::ServerContext& ctx, const std::string& job_id) {
  return ToGrpcStatus(coordinator_->Authorize(job_id, CallerOf(ctx, tokens_.get())));
}

grpc::Status GrpcJobService::SubmitJob(grpc::ServerContext* ctx, const SubmitJobRequest& req,
                                       SubmitJobResponse* resp) {
  auto id = coordinator_->SubmitJob(req, CallerOf(*ctx, tokens_.get()));
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status GrpcJobService::GetJob(grpc::ServerContext* ctx, const GetJobRequest& req, JobStatus* resp) {
  grpc::Status allowed = Authorize(*ctx, req.job_id());
  if (!allowed.ok()) return allowed;
  return FillScrubbed(coordinator_->GetJob(req.job_id()), resp);
}

grpc::Status GrpcJobService::ListJobs(grpc::ServerContext* ctx, const ListJobsRequest&,
                                      ListJobsResponse* resp) {
  const Caller caller = CallerOf(*ctx, tokens_.get());
  for (auto& j : coordinator_->ListJobs()) {
    if (!caller.MayActOn(j.owner())) continue;
    ScrubCredentials(&j);
    *resp->add_jobs() = std::move(j);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcJobService::WatchJob(grpc::ServerContext* ctx, const WatchJobRequest& req,
                                      const std::function<bool(const JobStatus&)>& write) {
  const Caller caller = CallerOf(*ctx, tokens_.get());
  grpc::Status allowed = ToGrpcStatus(coordinator_->Authorize(req.job_id(), caller));
  if (!allowed.ok()) return allowed;
  // This call holds a server thread for as long as it streams: counted.
  auto watch = coordinator_->OpenWatch(caller);
  if (!watch.ok()) return ToGrpcStatus(watch.status());
  uint64_t version = 0;
  while (!ctx->IsCancelled()) {
    // Wake up at least every second to notice a client that went away.
    auto st = coordinator_->WaitJob(req.job_id(), &version, WaitUntil(ctx, absl::Seconds(1)));
    if (!st.ok()) return ToGrpcStatus(st.status());
    ScrubCredentials(&*st);
    if (!write(*st)) return grpc::Status::OK;  // client gone
    if (IsTerminal(st->state())) return grpc::Status::OK;
    if (absl::Now() >= WaitUntil(ctx, absl::Hours(1e6))) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "watch deadline reached");
    }
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
}

grpc::Status GrpcJobService::CancelJob(grpc::ServerContext* ctx, const CancelJobRequest& req,
                                       CancelJobResponse* resp) {
  grpc::Status allowed = Authorize(*ctx, req.job_id());
  if (!allowed.ok()) return allowed;
  auto st = coordinator_->CancelJob(req.job_id());
  if (!st.ok()) return ToGrpcStatus(st.status());
  resp->set_state(*st);
  return grpc::Status::OK;
}

grpc::Status GrpcJobService::ScaleJob(grpc::ServerContext* ctx, const ScaleJobRequest& req, JobStatus* resp) {
  grpc::Status allowed = Authorize(*ctx, req.job_id());
  if (!allowed.ok()) return allowed;
  return FillScrubbed(coordinator_->ScaleJob(req.job_id(), req.workers()), resp);
}

grpc::Status GrpcJobService::ListMembers(grpc::ServerContext*, const ListMembersRequest&,
                                         ListMembersResponse* resp) {
  for (auto& m : coordinator_->Members()) {
    m.clear_member_id();
    *resp->add_members() = std::move(m);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcJobService::Checkpoint(grpc::ServerContext* ctx, const CheckpointRequest& req,
                                        CheckpointResponse* resp) {
  grpc::Status allowed = Authorize(*ctx, req.job_id());
  if (!allowed.ok()) return allowed;
  return Fill(coordinator_->Checkpoint(req.job_id()), resp);
}

grpc::Status GrpcClusterService::Register(grpc::ServerContext* ctx, const RegisterRequest& req,
                                          RegisterResponse* resp) {
  if (names_from_certificates_ && !CertificateNames(*ctx->auth_context()).Covers(req.name())) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("member name ", Quote(req.name()),
                                     " is not one the client certificate carries (its common name or a DNS "
                                     "subject alternative name): register under the name the certificate names"));
  }
  return Fill(coordinator_->Register(req, CallerOf(*ctx, tokens_.get())), resp);
}

grpc::Status GrpcClusterService::Heartbeat(grpc::ServerContext*, const HeartbeatRequest& req,
                                           HeartbeatResponse* resp) {
  return Fill(coordinator_->Heartbeat(req), resp);
}

grpc::Status GrpcClusterService::GetAssignment(grpc::ServerContext* ctx,
                                               const GetAssignmentRequest& req, Assignment* resp) {
  const absl::Duration wait = absl::Milliseconds(std::clamp<int64_t>(req.wait_ms(), 0, 60000));
  return Fill(coordinator_->GetAssignment(req.member_id(), WaitUntil(ctx, wait)), resp);
}

grpc::Status GrpcClusterService::ReportProgress(grpc::ServerContext*,
                                                const ReportProgressRequest& req,
                                                ReportProgressResponse* resp) {
  return Fill(coordinator_->ReportProgress(req), resp);
}

grpc::Status GrpcClusterService::KvSet(grpc::ServerContext*, const KvSetRequest& req, KvSetResponse*) {
  return ToGrpcStatus(coordinator_->KvSet(req.member_id(), req.job_id(), req.attempt(), req.key(), req.value()));
}

grpc::Status GrpcClusterService::KvGet(grpc::ServerContext* ctx, const KvGetRequest& req,
                                       KvGetResponse* resp) {
  const absl::Duration wait = absl::Milliseconds(std::clamp<int64_t>(req.wait_ms(), 0, 600000));
  auto v = coordinator_->KvGet(req.member_id(), req.job_id(), req.attempt(), req.key(), WaitUntil(ctx, wait));
  if (!v.ok()) return ToGrpcStatus(v.status());
  resp->set_value(*v);
  return grpc::Status::OK;
}

grpc::Status GrpcClusterService::KvAdd(grpc::ServerContext*, const KvAddRequest& req, KvAddResponse* resp) {
  auto v = coordinator_->KvAdd(req.member_id(), req.job_id(), req.attempt(), req.key(), req.delta());
  if (!v.ok()) return ToGrpcStatus(v.status());
  resp->set_value(*v);
  return grpc::Status::OK;
}

}  // namespace pstrain
