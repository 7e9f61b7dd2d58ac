#include "server/coordinator/dashboard.h"

#include <civetweb.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/activity_text.h"
#include "common/caller.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "rpc/security.h"
#include "rpc/token_table.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/dashboard_assets.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

using nlohmann::json;

constexpr size_t kMaxJobIdLength = 128;

int Trampoline(mg_connection* conn, void* self) { return static_cast<Dashboard*>(self)->Handle(conn); }

int HttpCode(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

const char* Reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 421: return "Misdirected Request";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Internal Server Error";
  }
}

// Each Send* returns the HTTP status it sent (civetweb's handler result).
int Send(mg_connection* conn, int code, const char* type, absl::string_view body, const char* extra = "") {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n"
            "Content-Security-Policy: default-src 'self'; img-src 'self' data:; frame-ancestors 'none'\r\n%s\r\n",
            code, Reason(code), type, body.size(), extra);
  mg_write(conn, body.data(), body.size());
  return code;
}

int SendJson(mg_connection* conn, int code, const json& j) {
  return Send(conn, code, "application/json; charset=utf-8", j.dump(-1, ' ', false, json::error_handler_t::replace));
}

int SendError(mg_connection* conn, const absl::Status& s) {
  return SendJson(conn, HttpCode(s.code()),
                  json{{"error", std::string(s.message())}, {"code", absl::StatusCodeToString(s.code())}});
}

// A fixed page: no client string goes into HTML.
int SendPage404(mg_connection* conn) { return Send(conn, 404, "text/html; charset=utf-8", kDashboardNotFoundHtml); }

// Job ids are ours ("job-000042"); anything else is not a job.
bool PlausibleJobId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxJobIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

json Curve(const std::vector<CurvePoint>& points) {
  json a = json::array();
  for (const CurvePoint& p : points) a.push_back({p.step, p.wall_s, p.value});
  return a;
}

// Seconds left at the pace of the last minute of rank 0's reports; null
// when not running or not known yet.
json Eta(const JobStatus& st, const std::optional<JobTelemetry::Pace>& pace) {
  if ((st.state() != RUNNING && st.state() != CHECKPOINTING) || !pace.has_value() || st.steps() <= 0) return nullptr;
  if (!(pace->steps_per_s > 0)) return nullptr;
  return std::max(0.0, (st.steps() - pace->step) / pace->steps_per_s);
}

double LastAccuracy(const JobStatus& st) {
  if (st.final_accuracy() >= 0) return st.final_accuracy();
  return st.evals_size() > 0 ? st.evals(st.evals_size() - 1).accuracy() : -1;
}

json Summary(const JobStatus& st, const std::optional<JobTelemetry::Pace>& pace) {
  const double acc = LastAccuracy(st);
  return json{{"job_id", st.job_id()},
              {"name", st.name()},
              {"state", JobState_Name(st.state())},
              {"owner", st.owner()},
              {"epoch", st.epoch()},
              {"step", st.step()},
              {"steps", st.steps()},
              {"loss", st.loss()},
              {"samples_per_s", st.samples_per_s()},
              {"accuracy", acc >= 0 ? json(acc) : json(nullptr)},
              {"eta_s", Eta(st, pace)},
              {"created_unix_ms", st.created_unix_ms()},
              {"num_workers", st.num_workers()},
              {"active_workers", st.active_workers()},
              {"restarts", st.restarts()}};
}

json Detail(const JobStatus& st, const JobCurves& c, const std::optional<JobTelemetry::Pace>& pace) {
  json j = Summary(st, pace);
  json ranks = json::array();
  std::map<int, const MemberStatus*> by_rank;
  for (const MemberStatus& m : st.members()) {
    if (m.role() == MEMBER_ROLE_WORKER) by_rank[m.rank()] = &m;
  }
  for (const WorkerProgress& w : st.workers()) {
    json r{{"rank", w.rank()},    {"epoch", w.epoch()}, {"step", w.step()},
           {"steps", w.steps()},  {"loss", w.loss()},   {"samples_per_s", w.samples_per_s()}};
    if (w.has_stage()) {  // a pipelined job
      r["stage"] = w.stage();
      r["stages"] = w.stages();
      r["bubble"] = w.bubble();
    }
    auto it = by_rank.find(w.rank());
    if (it != by_rank.end()) {
      const MemberStatus& m = *it->second;
      r["member"] = m.name();
      r["alive"] = m.alive();
      r["doing"] = ActivityText(m.activity());
      r["for_s"] = m.activity().for_s();
      r["waits"] = ActivityWaits(m.activity());
    }
    ranks.push_back(std::move(r));
  }
  json shards = json::array();
  for (const MemberStatus& m : st.members()) {
    if (m.role() != MEMBER_ROLE_SHARD) continue;
    json s{{"index", m.rank()}, {"member", m.name()}, {"address", m.address()}, {"alive", m.alive()},
           {"hung", !m.unresponsive().empty()},
           {"last_heartbeat_unix_ms", m.last_heartbeat_unix_ms()}};
    auto it = c.shards.find(m.rank());
    if (it != c.shards.end()) {
      s["call_ms"] = it->second.mean_ms();
      s["bytes_per_s"] = it->second.bytes_per_s();
    }
    shards.push_back(std::move(s));
  }
  json conditions = json::array();
  for (const JobCondition& cond : st.conditions()) {
    conditions.push_back({{"state", JobState_Name(cond.state())},
                          {"time_unix_ms", cond.time_unix_ms()},
                          {"reason", cond.reason()},
                          {"message", cond.message()}});
  }
  json evals = json::array();
  for (const EpochEval& e : st.evals()) {
    evals.push_back({{"epoch", e.epoch()}, {"accuracy", e.accuracy()}, {"test_loss", e.test_loss()}});
    if (e.auc() > 0) evals.back()["auc"] = e.auc();
  }
  j["ranks"] = std::move(ranks);
  j["shards"] = std::move(shards);
  j["conditions"] = std::move(conditions);
  j["evals"] = std::move(evals);
  j["pending_reason"] = st.pending_reason();
  j["last_checkpoint"] = st.last_checkpoint();
  j["vacant_ranks"] = std::vector<int>(st.vacant_ranks().begin(), st.vacant_ranks().end());
  j["curves"] = {{"loss", Curve(c.loss)},
                 {"samples_per_s", Curve(c.samples_per_s)},
                 {"accuracy", Curve(c.accuracy)},
                 {"test_loss", Curve(c.test_loss)},
                 {"auc", Curve(c.auc)}};
  return j;
}

// "host:port" as a browser writes it (IPv6 in brackets), lower-case.
std::string HostPort(absl::string_view host, int port) {
  const std::string h = absl::AsciiStrToLower(host);
  return h.find(':') != std::string::npos ? absl::StrCat("[", h, "]:", port) : absl::StrCat(h, ":", port);
}

// The names a wildcard bind is reachable as from elsewhere: this machine's
// interface addresses and its hostname. (IP literals and our own hostname
// are not names a web page's owner can point at us.)
std::vector<std::string> LocalNames() {
  std::vector<std::string> names;
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) == 0 && hostname[0] != '\0') names.push_back(hostname);
  ifaddrs* addrs = nullptr;
  if (getifaddrs(&addrs) != 0) return names;
  for (ifaddrs* a = addrs; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) continue;
    char text[NI_MAXHOST] = {};
    const socklen_t len = a->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(a->ifa_addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) continue;
    std::string name = text;
    name = name.substr(0, name.find('%'));  // a link-local address's zone is not in a URL's host
    names.push_back(name);
  }
  freeifaddrs(addrs);
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dashboard>> Dashboard::Start(Coordinator* coordinator, DashboardOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_port ", options.port, " is not a port"));
  }
  if ((options.tokens != nullptr || options.secured) && !IsLoopbackHost(options.host)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a coordinator with TLS or tokens serves its dashboard on a loopback address only (--http_host=127.0.0.1, "
        "not ", Quote(options.host), "): the dashboard is plain HTTP, so reach it through kubectl port-forward "
        "or an ingress that terminates TLS"));
  }
  for (const std::string& h : options.allowed_hosts) {
    if (h.empty() || std::any_of(h.begin(), h.end(), [](char c) { return absl::ascii_isspace(c) || c == '/'; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dashboard_allowed_hosts: ", Quote(h), " is not a host or host:port"));
    }
  }
  mg_init_library(0);
  std::unique_ptr<Dashboard> d(new Dashboard(coordinator, std::move(options)));
  const std::string host = d->options_.host.find(':') != std::string::npos ? "[" + d->options_.host + "]"
                                                                           : d->options_.host;
  const std::string ports = absl::StrCat(host, ":", d->options_.port);
  const char* opts[] = {"listening_ports", ports.c_str(), "num_threads", "4", "request_timeout_ms", "10000",
                        "max_request_size", "16384", "enable_keep_alive", "yes", "enable_directory_listing", "no",
                        nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = [](const mg_connection*, const char* message) -> int {
    spdlog::warn("dashboard: {}", message);
    return 1;
  };
  d->ctx_ = mg_start(&callbacks, d.get(), opts);
  if (d->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("the dashboard cannot listen on ", ports, " (in use?)"));
  }
  mg_server_port port_info[2];
  const int n = mg_get_server_ports(d->ctx_, 2, port_info);
  if (n < 1) return absl::InternalError("the dashboard started without a port");
  d->port_ = port_info[0].port;
  // The Host names served (see dashboard.h), fixed before the handler runs.
  d->allowed_hosts_.insert(HostPort(d->options_.host, d->port_));
  const std::string& bind = d->options_.host;
  if (bind.empty() || bind == "0.0.0.0" || bind == "::" || bind == "[::]") {
    for (const std::string& name : LocalNames()) d->allowed_hosts_.insert(HostPort(name, d->port_));
  }
  for (const std::string& h : d->options_.allowed_hosts) d->allowed_hosts_.insert(absl::AsciiStrToLower(h));
  mg_set_request_handler(d->ctx_, "/", &Trampoline, d.get());
  if (!d->options_.port_file.empty()) {
    absl::Status s = WriteFileAtomically(d->options_.port_file, absl::StrCat(d->options_.host, ":", d->port_, "\n"));
    if (!s.ok()) return s;
  }
  return d;
}

Dashboard::~Dashboard() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

std::string Dashboard::url() const {
  const std::string host = options_.host == "0.0.0.0" ? "127.0.0.1" : options_.host;
  return absl::StrCat("http://", host, ":", port_, "/");
}

bool Dashboard::HostAllowed(absl::string_view header) const {
  const std::string host = absl::AsciiStrToLower(absl::StripAsciiWhitespace(header));
  if (host.empty()) return false;
  if (allowed_hosts_.count(host) > 0) return true;
  // A loopback name, any port (or none): a port-forward or local proxy may
  // listen on another port, and no web page can make these names its own.
  // (Exact names: IsLoopbackHost would take "127.evil.example".)
  const size_t end = host[0] == '[' ? host.find(']') + 1 : host.find(':');
  const std::string name = end == 0 ? host : host.substr(0, end);  // find(']') failed: npos + 1
  const absl::string_view rest = end == 0 || end >= host.size() ? "" : absl::string_view(host).substr(end);
  if (!rest.empty() && (rest[0] != ':' || rest.size() == 1 ||
                        !std::all_of(rest.begin() + 1, rest.end(), absl::ascii_isdigit))) {
    return false;
  }
  return name == "localhost" || name == "127.0.0.1" || name == "[::1]";
}

int Dashboard::Handle(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  // First of all, whatever the path: a request for another name may come
  // from a page that rebound its DNS name to us (see dashboard.h).
  const char* host = mg_get_header(conn, "Host");
  if (host == nullptr || !HostAllowed(host)) {
    return Send(conn, 421, "text/plain; charset=utf-8",
                "this dashboard does not serve that Host (a missing one included); behind a proxy, add the name "
                "the browser uses to --dashboard_allowed_hosts\n");
  }
  const absl::string_view method = ri->request_method != nullptr ? ri->request_method : "";
  const absl::string_view path = ri->local_uri != nullptr ? ri->local_uri : "";
  const bool get = method == "GET" || method == "HEAD";
  const bool post = method == "POST";

  // Pages and assets: no data in them, served to anyone.
  if (path == "/" || path == "/index.html") {
    if (!get) return Send(conn, 405, "text/plain", "GET only\n", "Allow: GET\r\n");
    return Send(conn, 200, "text/html; charset=utf-8", kDashboardHtml);
  }
  if (path == "/static/app.js") return Send(conn, 200, "text/javascript; charset=utf-8", kDashboardJs);
  if (path == "/static/app.css") return Send(conn, 200, "text/css; charset=utf-8", kDashboardCss);
  if (absl::StartsWith(path, "/jobs/")) {
    const absl::string_view id = path.substr(6);
    // Without tokens nothing is secret: an unknown job is a 404 page. With
    // them the page is the same for every id and the API decides.
    if (!PlausibleJobId(id) || (options_.tokens == nullptr && !coordinator_->GetJob(std::string(id)).ok())) {
      return SendPage404(conn);
    }
    return Send(conn, 200, "text/html; charset=utf-8", kDashboardHtml);
  }
  if (!absl::StartsWith(path, "/api/")) return SendPage404(conn);

  // The API: who is asking.
  Caller caller;
  if (options_.tokens != nullptr) {
    const char* auth = mg_get_header(conn, "Authorization");
    std::optional<Caller> found =
        auth == nullptr ? std::nullopt : options_.tokens->Find(BearerToken(absl::string_view(auth)));
    if (!found.has_value()) {
      return SendError(conn, absl::UnauthenticatedError(
                                 "a token is needed: Authorization: Bearer <token> (your pstrain user token)"));
    }
    if (found->role != CallerRole::kUser && found->role != CallerRole::kAdmin) {
      return SendError(conn, absl::PermissionDeniedError("this token is a cluster member's, not a user's"));
    }
    caller = *found;
  }
  if (path == "/api/jobs") {
    if (!get) return SendError(conn, absl::InvalidArgumentError("GET /api/jobs"));
    json jobs = json::array();
    for (const JobStatus& st : coordinator_->ListJobs()) {
      if (caller.MayActOn(st.owner())) jobs.push_back(Summary(st, coordinator_->RecentPace(st.job_id())));
    }
    return SendJson(conn, 200, json{{"jobs", std::move(jobs)}});
  }
  const absl::string_view prefix = "/api/jobs/";
  const std::vector<std::string> parts =
      absl::StartsWith(path, prefix) ? absl::StrSplit(path.substr(prefix.size()), '/') : std::vector<std::string>{};
  if (parts.empty() || parts.size() > 2 || !PlausibleJobId(parts[0])) {
    return SendError(conn, absl::NotFoundError("no such API path"));
  }
  const std::string& id = parts[0];
  absl::Status allowed = coordinator_->Authorize(id, caller);
  if (!allowed.ok()) return SendError(conn, allowed);
  if (parts.size() == 1) {
    if (!get) return SendError(conn, absl::InvalidArgumentError("GET /api/jobs/<id>"));
    absl::StatusOr<JobStatus> st = coordinator_->GetJob(id);
    if (!st.ok()) return SendError(conn, st.status());
    return SendJson(conn, 200, Detail(*st, coordinator_->Curves(id), coordinator_->RecentPace(id)));
  }
  const char* marker = mg_get_header(conn, "X-Pstrain-Request");
  if (!post || marker == nullptr || absl::string_view(marker) != "1") {
    return SendError(conn, absl::InvalidArgumentError("actions are POST with the header X-Pstrain-Request: 1"));
  }
  if (parts[1] == "cancel") {
    absl::StatusOr<JobState> s = coordinator_->CancelJob(id);
    if (!s.ok()) return SendError(conn, s.status());
    return SendJson(conn, 200, json{{"state", JobState_Name(*s)}});
  }
  if (parts[1] == "checkpoint") {
    absl::StatusOr<CheckpointResponse> s = coordinator_->Checkpoint(id);
    if (!s.ok()) return SendError(conn, s.status());
    return SendJson(conn, 200, json{{"path", s->path()}, {"step", s->step()}});
  }
  return SendError(conn, absl::NotFoundError("no such action (cancel, checkpoint)"));
}

}  // namespace pstrain
