// pstrain-coordinator: the control plane server.
//
//   pstrain-coordinator --port=7000 --db=/var/lib/pstrain/jobs.db
//
// Serves pstrain.JobService (for the CLI), pstrain.ClusterService (for
// shards and workers), grpc.health.v1.Health and reflection. Jobs live in
// the SQLite database at --db and survive restarts. SIGTERM/SIGINT: stop
// accepting, drain, exit 0.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/binary_setup.h"
#include "common/metrics_server.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/dashboard.h"
#include "rpc/grpc_server.h"
#include "rpc/security.h"
#include "rpc/security_flags.h"
#include "rpc/server_flags.h"
#include "rpc/table_grant.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, db, "pstrain-jobs.db", "SQLite job store (created if missing).");
ABSL_FLAG(int, heartbeat_ms, 1000, "Heartbeat interval members are told to use.");
ABSL_FLAG(int, missed_heartbeats, 5, "A member missing this many heartbeats is lost.");
ABSL_FLAG(int, shard_probe_timeout_ms, 10000,
          "A shard of a running job whose table service answers none of the coordinator's probes (one per "
          "heartbeat) for this long, while it still heartbeats, is lost and quarantined; at least two "
          "heartbeats; 0: no probes.");
ABSL_FLAG(std::string, checkpoint_root, "out",
          "Directory (the shared volume) that jobs' output_dir and resume_from must lie under; shards get "
          "checkpoint names relative to it, so give them the same --checkpoint_root.");
ABSL_FLAG(bool, member_names_from_certificates, false,
          "With --tls_client_auth=require: a shard or worker registers only under a name its client "
          "certificate carries (common name or DNS SAN; one certificate per member).");
ABSL_FLAG(std::string, metrics_port_file, "", "If set, write the metrics host:port here.");
ABSL_FLAG(int, http_port, -1,
          "Serve the web dashboard (plain HTTP) on this port (0 picks one; -1 off). With --token_auth_file its "
          "API asks for a user's token; with TLS or tokens it must be on a loopback --http_host.");
ABSL_FLAG(std::string, http_host, "", "Address of the dashboard (default: --host).");
ABSL_FLAG(std::string, http_port_file, "", "If set, write the dashboard's host:port here.");
ABSL_FLAG(std::vector<std::string>, dashboard_allowed_hosts, {},
          "Comma-separated Host values (name or name:port, as the browser sends them) the dashboard serves besides "
          "its bind address, loopback names and, on 0.0.0.0, this machine's addresses and hostname: the name of a "
          "proxy in front of it. Any other Host is refused (DNS rebinding).");
ABSL_FLAG(std::string, table_grant_key_file, "",
          "The Ed25519 private key (PEM) this coordinator signs table grants with; the shards' "
          "--table_grant_public_key_file holds its public key, and they make a job's table only with the grant "
          "this coordinator gives the job's workers.");
ABSL_FLAG(int, max_members_per_principal, 1024,
          "Most shards and workers one principal (a token's role and user) may register at a time.");
ABSL_FLAG(bool, tensorboard, true,
          "Write TensorBoard event files for every job attempt under <output_dir>/<job>/tensorboard/.");
// Quotas and bounds (issue 31): what one user, or the cluster, can make the
// coordinator hold. 0 turns a bound off.
ABSL_FLAG(int, max_queued_jobs_per_user, 100,
          "A user's pending jobs at most; a submission past it is refused (RESOURCE_EXHAUSTED). Admins count like "
          "anyone; without --token_auth_file every caller is one user.");
ABSL_FLAG(int, max_running_jobs_per_user, 32,
          "A user's scheduled jobs at most; their further jobs wait (passed over, not blocking other users').");
ABSL_FLAG(int, max_watches_per_user, 16, "A user's open WatchJob streams (pstrain watch/run) at most.");
ABSL_FLAG(int, max_waiting_calls, 512,
          "Calls that wait (WatchJob, KvGet and GetAssignment waits), every caller together, at most; must be "
          "below --grpc_max_threads. Size it above shards + workers + watchers.");
ABSL_FLAG(int, grpc_max_threads, 640,
          "Threads serving gRPC calls at most (one per call in progress); past it a call is refused, and the "
          "process never runs out of threads.");
ABSL_FLAG(int, job_retention, 1000,
          "Ended jobs kept (the last to end) in memory and --db; older ones are deleted (pstrain list/status no "
          "longer know them). 0 keeps none.");
ABSL_FLAG(absl::Duration, job_retention_age, absl::Hours(24 * 30),
          "Ended jobs are deleted this long after they ended (e.g. 720h); 0: no age limit.");

namespace {

// The dashboard when --http_port asks for it (null otherwise, or on error).
absl::StatusOr<std::unique_ptr<pstrain::Dashboard>> StartDashboard(pstrain::Coordinator* coordinator,
                                                                   const pstrain::SecurityOptions& security,
                                                                   const pstrain::ServerSecurity& server_security) {
  if (absl::GetFlag(FLAGS_http_port) < 0) return nullptr;
  pstrain::DashboardOptions o;
  o.host = absl::GetFlag(FLAGS_http_host).empty() ? absl::GetFlag(FLAGS_host) : absl::GetFlag(FLAGS_http_host);
  o.port = absl::GetFlag(FLAGS_http_port);
  o.port_file = absl::GetFlag(FLAGS_http_port_file);
  o.tokens = server_security.tokens;
  o.secured = security.server_tls();
  o.allowed_hosts = absl::GetFlag(FLAGS_dashboard_allowed_hosts);
  auto d = pstrain::Dashboard::Start(coordinator, o);
  if (!d.ok()) return absl::Status(d.status().code(), absl::StrCat("--http_port: ", d.status().message()));
  if (!pstrain::IsLoopbackHost(o.host)) {
    spdlog::warn("pstrain-coordinator: the dashboard serves plain HTTP without tokens on {}: anyone who reaches it "
                 "can cancel jobs (use --http_host=127.0.0.1 and kubectl port-forward)",
                 o.host);
  }
  spdlog::info("pstrain-coordinator: dashboard at {}", (*d)->url());
  return d;
}

// Checks the flags CoordinatorOptionsFromFlags does not: false (each
// problem logged) when one is out of range.
bool ServerFlagsAreValid() {
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535 || absl::GetFlag(FLAGS_heartbeat_ms) < 10 ||
      absl::GetFlag(FLAGS_missed_heartbeats) < 1) {
    spdlog::error("pstrain-coordinator: need 0 <= --port <= 65535, --heartbeat_ms >= 10, --missed_heartbeats >= 1");
    return false;
  }
  for (const auto* flag : {&FLAGS_max_queued_jobs_per_user, &FLAGS_max_running_jobs_per_user,
                           &FLAGS_max_watches_per_user, &FLAGS_max_waiting_calls, &FLAGS_grpc_max_threads,
                           &FLAGS_job_retention}) {
    if (absl::GetFlag(*flag) < 0) {
      spdlog::error("pstrain-coordinator: --{} must not be negative", std::string(absl::GetFlagReflectionHandle(*flag).Name()));
      return false;
    }
  }
  // Waiting calls each hold a server thread: the others need some left.
  const int max_threads = absl::GetFlag(FLAGS_grpc_max_threads);
  const int max_waiting = absl::GetFlag(FLAGS_max_waiting_calls);
  if (max_threads > 0 && (max_waiting == 0 || max_waiting + 16 > max_threads)) {
    spdlog::error("pstrain-coordinator: --max_waiting_calls ({}) must be set and at least 16 below --grpc_max_threads "
                  "({}), or waiting calls can take every thread",
                  max_waiting, max_threads);
    return false;
  }
  return true;
}

// The job store at --db, its directory made if missing.
absl::StatusOr<std::unique_ptr<pstrain::JobStore>> OpenJobStore() {
  const std::string db = absl::GetFlag(FLAGS_db);
  const auto parent = std::filesystem::path(db).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  return pstrain::JobStore::Open(db);
}

// The coordinator's options from the flags; nullopt (the problem logged)
// when one is refused.
std::optional<pstrain::CoordinatorOptions> CoordinatorOptionsFromFlags() {
  pstrain::CoordinatorOptions options;
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.missed_heartbeats = absl::GetFlag(FLAGS_missed_heartbeats);
  options.shard_probe_timeout = absl::Milliseconds(std::max(0, absl::GetFlag(FLAGS_shard_probe_timeout_ms)));
  if (options.shard_probe_timeout > absl::ZeroDuration() &&
      options.shard_probe_timeout < 2 * options.heartbeat_interval) {
    options.shard_probe_timeout = 2 * options.heartbeat_interval;  // long heartbeats: the least that makes sense
    spdlog::warn("pstrain-coordinator: --shard_probe_timeout_ms raised to two heartbeats, {}",
                 absl::FormatDuration(options.shard_probe_timeout));
  }
  auto root = pstrain::CanonicalRoot(absl::GetFlag(FLAGS_checkpoint_root));
  if (!root.ok()) {
    spdlog::error("pstrain-coordinator: --checkpoint_root: {}", root.status().ToString());
    return std::nullopt;
  }
  options.checkpoint_root = *root;
  options.telemetry.tensorboard = absl::GetFlag(FLAGS_tensorboard);
  if (absl::GetFlag(FLAGS_max_members_per_principal) < 1) {
    spdlog::error("pstrain-coordinator: need --max_members_per_principal >= 1");
    return std::nullopt;
  }
  options.max_members_per_principal = static_cast<size_t>(absl::GetFlag(FLAGS_max_members_per_principal));
  if (!absl::GetFlag(FLAGS_table_grant_key_file).empty()) {
    auto signer = pstrain::TableGrantSigner::Load(absl::GetFlag(FLAGS_table_grant_key_file), "--table_grant_key_file");
    if (!signer.ok()) {
      spdlog::error("pstrain-coordinator: {}", std::string(signer.status().message()));
      return std::nullopt;
    }
    options.table_grant_signer = std::move(*signer);
  }
  options.max_queued_jobs_per_user = absl::GetFlag(FLAGS_max_queued_jobs_per_user);
  options.max_running_jobs_per_user = absl::GetFlag(FLAGS_max_running_jobs_per_user);
  options.max_watches_per_user = absl::GetFlag(FLAGS_max_watches_per_user);
  options.max_waiting_calls = absl::GetFlag(FLAGS_max_waiting_calls);
  options.job_retention = absl::GetFlag(FLAGS_job_retention);
  options.job_retention_age = absl::GetFlag(FLAGS_job_retention_age);
  return options;
}

pstrain::GrpcServerOptions ServerOptionsFromFlags(const pstrain::ServerSecurity& server_security) {
  pstrain::GrpcServerOptions server_options = pstrain::GrpcServerOptionsFromFlags(server_security);
  server_options.max_message_bytes = 64 << 20;
  server_options.max_threads = absl::GetFlag(FLAGS_grpc_max_threads);
  return server_options;
}

// The Prometheus endpoint with the coordinator's metrics when
// --metrics_port asks for it (null otherwise, or on error).
absl::StatusOr<std::unique_ptr<pstrain::MetricsServer>> StartMetrics(pstrain::Coordinator* coordinator) {
  if (absl::GetFlag(FLAGS_metrics_port) < 0) return nullptr;
  auto metrics = pstrain::MetricsServer::Start(pstrain::MetricsHostFromFlags(), absl::GetFlag(FLAGS_metrics_port),
                                               absl::GetFlag(FLAGS_metrics_port_file));
  if (!metrics.ok()) return metrics.status();
  (*metrics)->Add(std::make_shared<pstrain::CoordinatorMetrics>(coordinator));  // kept alive by the server
  spdlog::info("pstrain-coordinator: Prometheus metrics on port {}", (*metrics)->port());
  return metrics;
}

}  // namespace

int main(int argc, char** argv) {
  pstrain::StartBinary("pstrain-coordinator", argc, argv);
  const pstrain::SecurityOptions security = pstrain::InstallSecurityFromFlags("pstrain-coordinator", true);
  if (!ServerFlagsAreValid()) return 2;
  const sigset_t stop = pstrain::BlockStopSignals();

  auto store = OpenJobStore();
  if (!store.ok()) {
    spdlog::error("pstrain-coordinator: {}", store.status().ToString());
    return 1;
  }
  std::optional<pstrain::CoordinatorOptions> options = CoordinatorOptionsFromFlags();
  if (!options.has_value()) return 2;
  auto coordinator = pstrain::Coordinator::Create(*options, std::move(*store));
  if (!coordinator.ok()) {
    spdlog::error("pstrain-coordinator: {}", coordinator.status().ToString());
    return 1;
  }
  auto server_security = pstrain::ServerSecurityFor(security);
  if (!server_security.ok()) {
    spdlog::error("pstrain-coordinator: {}", server_security.status().ToString());
    return 2;
  }
  pstrain::GrpcJobService jobs(coordinator->get(), server_security->tokens);
  const bool names_from_certificates = absl::GetFlag(FLAGS_member_names_from_certificates);
  if (names_from_certificates && security.tls_client_auth != pstrain::ClientAuth::kRequire) {
    spdlog::error("pstrain-coordinator: --member_names_from_certificates needs --tls_client_auth=require");
    return 2;
  }
  pstrain::GrpcClusterService cluster(coordinator->get(), names_from_certificates, server_security->tokens);
  // Before the gRPC port file appears: whoever waits for that finds the
  // dashboard's too (`pstrain local`).
  auto dashboard = StartDashboard(coordinator->get(), security, *server_security);
  if (!dashboard.ok()) {
    spdlog::error("pstrain-coordinator: {}", dashboard.status().ToString());
    return 2;
  }
  auto server = pstrain::GrpcServer::Create(ServerOptionsFromFlags(*server_security), {&jobs, &cluster});
  if (!server.ok()) {
    spdlog::error("pstrain-coordinator: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("pstrain-coordinator serving on port {} ({}; jobs in {})", (*server)->port(),
               pstrain::DescribeSecurity(security, *server_security), absl::GetFlag(FLAGS_db));
  auto metrics = StartMetrics(coordinator->get());
  if (!metrics.ok()) {
    spdlog::error("pstrain-coordinator: {}", metrics.status().ToString());
    return 1;
  }

  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("pstrain-coordinator: signal {}, draining", sig);
  dashboard->reset();  // no page calls into a coordinator shutting down
  (*coordinator)->Shutdown();
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
