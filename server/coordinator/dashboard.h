// Dashboard: the coordinator's web pages (civetweb, off unless --http_port
// is given). Every asset is served by the binary (no CDN, no font):
//
//   GET  /                         the job list (a page; its script polls:)
//   GET  /api/jobs                 the jobs: state, progress, ETA, accuracy
//   GET  /jobs/<id>                a job's page (404 page for an unknown job)
//   GET  /api/jobs/<id>            its status, curves, per-rank activity
//   POST /api/jobs/<id>/cancel     as `pstrain cancel`
//   POST /api/jobs/<id>/checkpoint as `pstrain checkpoint`
//   GET  /static/app.js, /static/app.css
//
// Guarded like JobService: with a token table (--token_auth_file) the API
// needs `Authorization: Bearer <token>` of a user or an admin (the page asks
// for it and keeps it in the tab's sessionStorage), a user sees and changes
// only their own jobs. A POST must carry `X-Pstrain-Request: 1`, which a
// cross-site form cannot send (no CORS is granted), so another site open in
// the same browser cannot cancel a job on a dashboard without tokens.
// Every request's `Host` must name this dashboard (else 421, whatever the
// path): its bind address and port, a loopback name (localhost, 127.0.0.1,
// [::1], any port: a port-forward may pick another local port), for a
// wildcard bind this machine's addresses and hostname with the port, and
// DashboardOptions::allowed_hosts. Without it, DNS rebinding (a web page
// whose name then resolves to this address) is same-origin with an
// unsecured dashboard and reaches its Cancel button.
// Bounded: 4 serving threads, request headers of 16 KiB, 10 s per request.
//
// Plain HTTP only. Debian 12's civetweb 1.15 loads OpenSSL at run time and
// crashes on the first TLS connection (a 20-line program with civetweb's
// own `ssl_certificate` option does it too), so a secured coordinator (TLS
// or tokens) serves its dashboard on a loopback address only: reach it
// through `kubectl port-forward` (TLS to the API server) or an ingress that
// terminates TLS -- tokens and job data never cross a network in clear.
#ifndef PSTRAIN_SERVER_COORDINATOR_DASHBOARD_H_
#define PSTRAIN_SERVER_COORDINATOR_DASHBOARD_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct mg_context;
struct mg_connection;

namespace pstrain {

class Coordinator;
class TokenTable;

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks one (port() reads it back)
  std::string port_file;  // if set, "host:port" is written here once serving
  // Null: authentication off (every caller an anonymous admin).
  std::shared_ptr<TokenTable> tokens;
  // The coordinator's gRPC side has TLS: the dashboard must then be on a
  // loopback address too (see above).
  bool secured = false;
  // More `Host` values accepted besides the defaults above, as a browser
  // sends them ("name" or "name:port"; a proxy's public name, say).
  std::vector<std::string> allowed_hosts;
};

class Dashboard {
 public:
  static absl::StatusOr<std::unique_ptr<Dashboard>> Start(Coordinator* coordinator, DashboardOptions options);
  ~Dashboard();

  int port() const { return port_; }
  // "http://host:port/".
  std::string url() const;

  // civetweb's callback (public for the C trampoline only).
  int Handle(mg_connection* conn);
  // Whether a request with this `Host` header is served (see above).
  bool HostAllowed(absl::string_view host) const;

 private:
  Dashboard(Coordinator* coordinator, DashboardOptions options)
      : coordinator_(coordinator), options_(std::move(options)) {}

  Coordinator* const coordinator_;
  const DashboardOptions options_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  // Lower-case; set in Start before the handler is installed, then read only.
  std::set<std::string> allowed_hosts_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_DASHBOARD_H_
