#include "rpc/cluster_member.h"

#include <unistd.h>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "common/member_role.h"
#include "rpc/grpc_channel.h"
#include "rpc/status_util.h"
#include "spdlog/spdlog.h"

namespace pstrain {

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

std::string MemberName(const std::string& flag_name) {
  return flag_name.empty() ? absl::StrCat(HostName(), "-", getpid()) : flag_name;
}
namespace {

constexpr size_t kMaxQueuedEvents = 1000;

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

}  // namespace

ClusterMember::ClusterMember(ClusterMemberOptions options)
    : options_(std::move(options)),
      stub_(ClusterService::NewStub(CreateChannel(options_.coordinator, 64 << 20))) {}

ClusterMember::~ClusterMember() { Stop(); }

void ClusterMember::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (sender_.joinable()) sender_.join();
}

std::string ClusterMember::member_id() {
  absl::MutexLock lock(&mu_);
  return member_id_;
}

template <typename Request, typename Response>
absl::Status ClusterMember::CallCoordinator(
    grpc::Status (ClusterService::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, Response* response, absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  return FromGrpcStatus((stub_.get()->*method)(&ctx, request, response));
}

absl::Status ClusterMember::RegisterOnce() {
  RegisterRequest req;
  req.set_role(options_.role);
  req.set_name(options_.name);
  req.set_address(options_.address);
  {
    absl::MutexLock lock(&mu_);
    req.set_job_id(job_id_);
    req.set_rank(rank_);
    req.set_attempt(attempt_);
    req.set_previous_member_id(member_id_);
  }
  RegisterResponse resp;
  absl::Status s = CallCoordinator(&ClusterService::Stub::Register, req, &resp, options_.rpc_timeout);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  member_id_ = resp.member_id();
  interval_ = absl::Milliseconds(std::max<int64_t>(10, resp.heartbeat_interval_ms()));
  return absl::OkStatus();
}

absl::Status ClusterMember::Start(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status s;
  while (true) {
    s = RegisterOnce();
    if (s.ok()) break;
    // ALREADY_EXISTS: our name is still held by a live member (this pod's
    // previous process, until its lease runs out).
    if (s.code() != absl::StatusCode::kUnavailable && s.code() != absl::StatusCode::kDeadlineExceeded &&
        s.code() != absl::StatusCode::kAlreadyExists) {
      return s;
    }
    if (absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", options_.coordinator,
                                                 ": ", s.message()));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  // Not the member id: it is this member's credential.
  spdlog::info("{} {} registered with the coordinator at {}", RoleName(options_.role), options_.name,
               options_.coordinator);
  started_ = true;
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  sender_ = std::thread([this] { SenderLoop(); });
  return absl::OkStatus();
}

void ClusterMember::HeartbeatLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    cv_.WaitWithTimeout(&mu_, interval_);
    if (stop_) break;
    HeartbeatRequest req;
    req.set_member_id(member_id_);
    req.set_running_job_id(job_id_);
    req.set_running_attempt(attempt_);
    const std::function<WorkerActivity()> activity = activity_;
    mu_.Unlock();
    if (activity && !req.running_job_id().empty()) *req.mutable_activity() = activity();
    HeartbeatResponse resp;
    const absl::Status s = CallCoordinator(&ClusterService::Stub::Heartbeat, req, &resp, options_.rpc_timeout);
    if (s.code() == absl::StatusCode::kNotFound) {
      // The coordinator forgot us (it restarted): register again, saying
      // what we are running so the job can carry on.
      absl::Status r = RegisterOnce();
      spdlog::info("{} {}: registered again with the coordinator: {}", RoleName(options_.role), options_.name,
                   r.ToString());
    }
    if (s.ok() && !resp.exit_reason().empty()) {
      spdlog::error("{} {}: the coordinator asks this member to exit: {}", RoleName(options_.role), options_.name,
                    resp.exit_reason());
      if (options_.on_exit_request) options_.on_exit_request(resp.exit_reason());
    }
    mu_.Lock();
    if (!s.ok()) continue;
    pause_id_ = resp.pause_id();
    pause_ = resp.pause();
    if (options_.role == MEMBER_ROLE_SHARD) {
      // A shard serves whatever job it is assigned; remembering it lets a
      // restarted coordinator re-attach the shard to its running job.
      job_id_ = resp.job_id();
      attempt_ = resp.attempt();
    }
    if (resp.cancel_job() && !cancelled_.exchange(true)) {
      spdlog::warn("{} {}: job {} is no longer assigned here; stopping it", RoleName(options_.role),
                   options_.name, req.running_job_id());
    }
  }
}

void ClusterMember::SetRunning(const std::string& job_id, int rank, uint64_t attempt) {
  absl::MutexLock lock(&mu_);
  job_id_ = job_id;
  rank_ = rank;
  attempt_ = attempt;
  cancelled_ = false;
}

void ClusterMember::SetActivitySource(std::function<WorkerActivity()> source) {
  absl::MutexLock lock(&mu_);
  activity_ = std::move(source);
}

void ClusterMember::Report(const WorkerEvent& event) {
  absl::MutexLock lock(&mu_);
  if (events_.size() >= kMaxQueuedEvents) {
    // Drop the oldest progress report, never a result.
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      if (it->event.has_progress()) {
        events_.erase(it);
        break;
      }
    }
  }
  events_.push_back(Event{job_id_, attempt_, event});
  cv_.SignalAll();
}

bool ClusterMember::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (!events_.empty() && !stop_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  return events_.empty() || stop_;
}

void ClusterMember::SenderLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && events_.empty()) cv_.Wait(&mu_);
    if (events_.empty() && stop_) break;
    if (stop_ && !started_) break;
    const Event event = events_.front();
    ReportProgressRequest req;
    req.set_member_id(member_id_);
    req.set_job_id(event.job);
    req.set_attempt(event.attempt);
    *req.mutable_event() = event.event;
    mu_.Unlock();
    ReportProgressResponse resp;
    const absl::Status s =
        CallCoordinator(&ClusterService::Stub::ReportProgress, req, &resp, options_.rpc_timeout);
    mu_.Lock();
    const bool progress = event.event.has_progress();
    // A refused event (bad, or of an ended attempt) is not sent again.
    if (s.ok() || progress || s.code() == absl::StatusCode::kInvalidArgument ||
        s.code() == absl::StatusCode::kAborted) {
      events_.pop_front();
      cv_.SignalAll();
    } else {
      // The coordinator is away (or restarting and has not re-admitted us
      // yet): keep the event and try again shortly.
      if (stop_) break;
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
    }
  }
}

absl::StatusOr<Assignment> ClusterMember::WaitForAssignment(absl::Duration wait) {
  GetAssignmentRequest req;
  req.set_member_id(member_id());
  req.set_wait_ms(absl::ToInt64Milliseconds(wait));
  Assignment a;
  absl::Status s = CallCoordinator(&ClusterService::Stub::GetAssignment, req, &a, wait + options_.rpc_timeout);
  if (s.code() == absl::StatusCode::kNotFound) {
    // Forgotten by a restarted coordinator: register again, then ask again.
    absl::Status r = RegisterOnce();
    if (!r.ok()) return r;
    return Assignment();
  }
  if (!s.ok()) return s;
  return a;
}

template <typename Request>
Request ClusterMember::KvRequest(const std::string& key) {
  Request req;
  {
    absl::MutexLock lock(&mu_);
    req.set_job_id(job_id_);
    req.set_attempt(attempt_);
    req.set_member_id(member_id_);
  }
  req.set_key(key);
  return req;
}

absl::StatusOr<int64_t> ClusterMember::KvAdd(const std::string& key, int64_t delta) {
  auto req = KvRequest<KvAddRequest>(key);
  req.set_delta(delta);
  KvAddResponse resp;
  absl::Status s = CallCoordinator(&ClusterService::Stub::KvAdd, req, &resp, options_.rpc_timeout);
  if (!s.ok()) return s;
  return resp.value();
}

absl::Status ClusterMember::KvSet(const std::string& key, const std::string& value) {
  auto req = KvRequest<KvSetRequest>(key);
  req.set_value(value);
  KvSetResponse resp;
  return CallCoordinator(&ClusterService::Stub::KvSet, req, &resp, options_.rpc_timeout);
}

absl::StatusOr<std::string> ClusterMember::KvGet(const std::string& key, absl::Duration wait) {
  auto req = KvRequest<KvGetRequest>(key);
  req.set_wait_ms(absl::ToInt64Milliseconds(wait));
  KvGetResponse resp;
  absl::Status s = CallCoordinator(&ClusterService::Stub::KvGet, req, &resp, wait + options_.rpc_timeout);
  if (!s.ok()) return s;
  return resp.value();
}

}  // namespace pstrain
