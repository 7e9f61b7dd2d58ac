// pstrain-ps: one parameter shard server.
//
//   pstrain-ps --port=7070 --shard_index=0 --num_shards=2
//
// Serves pstrain.ParameterService, grpc.health.v1.Health and reflection.
// SIGTERM on a pool member serving a job first asks the coordinator to
// checkpoint the job and requeue it elsewhere (--drain_timeout_s at most).
// Then (and on SIGINT): fail waiting calls with UNAVAILABLE, stop accepting,
// drain in-flight calls, exit 0.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/binary_setup.h"
#include "common/byte_budget.h"
#include "common/env_flags.h"
#include "common/malloc_tuning.h"
#include "common/metrics_server.h"
#include "embedding/embedding_store.h"
#include "rpc/cluster_member.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/grpc_server.h"
#include "rpc/security_flags.h"
#include "rpc/server_flags.h"
#include "rpc/table_grant.h"
#include "server/ps/grpc_embedding_service.h"
#include "server/ps/grpc_parameter_service.h"
#include "table/shard_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, shard_index, -1,
          "This shard's index, 0 <= shard_index < num_shards (default: the StatefulSet ordinal of the host "
          "name, pstrain-ps-3 -> 3, else 0).");
ABSL_FLAG(int, num_shards, 1, "Number of shards in the cluster.");
ABSL_FLAG(int, max_message_mb, pstrain::kDefaultMaxMessageBytes >> 20,
          "Largest request or response in MiB; larger ones fail with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_wait_s, 1800, "Longest a call may wait for other workers, in seconds.");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of pstrain-coordinator: join its pool (register and heartbeat).");
ABSL_FLAG(std::string, name, "", "Member name for the coordinator (default: <hostname>-<pid>).");
ABSL_FLAG(int, drain_timeout_s, 120,
          "On SIGTERM, how long a shard serving a job waits for the coordinator to checkpoint and requeue it.");
ABSL_FLAG(std::string, checkpoint_root, "out",
          "Directory that checkpoint files are written to and read from (SaveTable/LoadTable names are "
          "relative to it; nothing outside it is touched). The coordinator's --checkpoint_root, on the same "
          "shared volume.");
ABSL_FLAG(int64_t, max_memory_mb, 0,
          "Memory that tables (values, optimizer state) may reserve, in MiB; 0: 80% of physical memory.");
ABSL_FLAG(std::string, table_grant_public_key_file, "",
          "The coordinator's Ed25519 public key (PEM) for table grants: with it, this shard makes a job's table "
          "(InitTable, LoadTable) only with the coordinator's grant for the job, its attempt and secret.");
ABSL_FLAG(std::string, advertise_host, "",
          "Host name or address other processes reach this shard at (default: the hostname).");

namespace {

// The flags' ranges; says which is wrong.
bool FlagsValid(int shard_index, int num_shards) {
  const int port = absl::GetFlag(FLAGS_port);
  const int max_mb = absl::GetFlag(FLAGS_max_message_mb);
  if (num_shards < 1 || shard_index < 0 || shard_index >= num_shards) {
    spdlog::error("pstrain-ps: need 0 <= --shard_index < --num_shards (got {}, {})",
                 shard_index, num_shards);
    return false;
  }
  if (port < 0 || port > 65535) {
    spdlog::error("pstrain-ps: --port must be in 0..65535 (got {})", port);
    return false;
  }
  if (max_mb < 1 || max_mb > 2047) {
    spdlog::error("pstrain-ps: --max_message_mb must be in 1..2047 (got {})", max_mb);
    return false;
  }
  if (absl::GetFlag(FLAGS_max_wait_s) < 1) {
    spdlog::error("pstrain-ps: --max_wait_s must be >= 1");
    return false;
  }
  if (absl::GetFlag(FLAGS_max_memory_mb) < 0) {
    spdlog::error("pstrain-ps: --max_memory_mb must be >= 0");
    return false;
  }
  return true;
}

// Registers with the coordinator as a shard of its pool.
absl::StatusOr<std::unique_ptr<pstrain::ClusterMember>> JoinCoordinator(int port) {
  pstrain::ClusterMemberOptions mo;
  mo.coordinator = absl::GetFlag(FLAGS_coordinator);
  mo.role = pstrain::MEMBER_ROLE_SHARD;
  mo.name = pstrain::MemberName(absl::GetFlag(FLAGS_name));
  const std::string advertise =
      absl::GetFlag(FLAGS_advertise_host).empty() ? pstrain::HostName() : absl::GetFlag(FLAGS_advertise_host);
  mo.address = absl::StrCat(advertise, ":", port);
  // Quarantined by the coordinator (its probes of this shard's data path
  // went unanswered: docs/replication.md): nothing here can be trusted to
  // shut down in order, so exit now, EX_TEMPFAIL, for the supervisor to
  // start a fresh process.
  mo.on_exit_request = [](const std::string&) { std::_Exit(75); };  // no flush: stderr may be what hangs
  auto member = std::make_unique<pstrain::ClusterMember>(mo);
  absl::Status s = member->Start(absl::Seconds(60));
  if (!s.ok()) return s;
  return member;
}

// SIGTERM while serving a job: the job is checkpointed and requeued by the
// coordinator (which then takes it off this shard) before the shard goes;
// SIGINT or a second signal, or the timeout, ends the wait.
void Drain(pstrain::ClusterMember& member, pstrain::ShardStore& store, const sigset_t& stop, int shard_index) {
  const std::string job = member.job_id();
  spdlog::info("pstrain-ps: SIGTERM: draining {} (checkpoint, then requeue; at most {} s)", job,
               absl::GetFlag(FLAGS_drain_timeout_s));
  pstrain::WorkerEvent draining;
  draining.set_rank(shard_index);
  draining.mutable_draining()->set_role(pstrain::MEMBER_ROLE_SHARD);
  member.Report(draining);
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  const timespec tick{0, 100 * 1000 * 1000};
  while (member.job_id() == job && absl::Now() < deadline) {
    if (sigtimedwait(&stop, nullptr, &tick) > 0) break;
  }
  // Its table goes now (the coordinator drops it too): a worker still
  // waiting on it gets a final error at once, not UNAVAILABLE, which it
  // would retry against this shard until its deadline.
  pstrain::DropTableRequest drop;
  drop.set_job(job);
  drop.set_attempt(std::numeric_limits<uint64_t>::max());  // whichever attempt it is
  pstrain::DropTableResponse dropped;
  (void)pstrain::WaitFor([&](pstrain::StatusCallback done) { store.DropTableAsync(drop, &dropped, {}, done); });
}

// How a primary's forwards reach its backups: over gRPC, with the job's
// secret (`*service` holds it; set before any table exists).
decltype(pstrain::ShardStoreOptions::forward) Forwarder(const pstrain::GrpcParameterService* const* service) {
  return [service](const std::string& target, const pstrain::ReplicateRequest& request,
                   const std::vector<pstrain::TensorBuffer>& tensors, pstrain::ReplicateResponse* response,
                   pstrain::StatusCallback done) {
    pstrain::RemoteShardOptions ro;
    ro.target = target;
    ro.max_attempts = 1;  // the store tries again itself
    pstrain::CallOptions options;
    options.deadline = absl::Now() + absl::Seconds(5);
    options.job_secret = (*service)->secrets().SecretOf(request.job());
    pstrain::SharedRemoteShard(ro)->ReplicateAsync(request, tensors, response, options, std::move(done));
  };
}

// How a slot leader's embedding rows reach its backups: over gRPC (a channel
// per backup, kept), with the job's secret as `*service` holds it.
decltype(pstrain::EmbeddingStoreOptions::forward) EmbeddingForwarder(
    const pstrain::GrpcEmbeddingService* const* service) {
  struct Channels {
    absl::Mutex mu;
    std::map<std::string, std::shared_ptr<grpc::Channel>> by_target ABSL_GUARDED_BY(mu);
  };
  auto channels = std::make_shared<Channels>();
  return [service, channels](const std::string& target, const pstrain::ReplicateEmbeddingsRequest& request,
                             pstrain::ReplicateEmbeddingsResponse* response) {
    std::shared_ptr<grpc::Channel> channel;
    {
      absl::MutexLock lock(&channels->mu);
      std::shared_ptr<grpc::Channel>& c = channels->by_target[target];
      if (c == nullptr) c = pstrain::CreateChannel(target);
      channel = c;
    }
    return pstrain::ReplicateEmbeddings(channel, request, (*service)->secrets().SecretOf(request.job()),
                                        absl::Now() + absl::Seconds(5), response);
  };
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("pstrain parameter shard server");
  pstrain::StartBinary("pstrain-ps", argc, argv);
  const pstrain::SecurityOptions security = pstrain::InstallSecurityFromFlags("pstrain-ps", true);
  pstrain::KeepBulkBuffersMapped();

  int shard_index = absl::GetFlag(FLAGS_shard_index);
  if (shard_index < 0) shard_index = std::max(0, pstrain::HostOrdinal());
  // A pool member serves whichever jobs the coordinator gives it; its index
  // only names it in messages and stats.
  const int num_shards = absl::GetFlag(FLAGS_coordinator).empty()
                             ? absl::GetFlag(FLAGS_num_shards)
                             : std::max(absl::GetFlag(FLAGS_num_shards), shard_index + 1);
  const int max_mb = absl::GetFlag(FLAGS_max_message_mb);
  if (!FlagsValid(shard_index, num_shards)) return 2;

  // Block the stop signals in every thread; this one waits for them below.
  const sigset_t stop = pstrain::BlockStopSignals();

  pstrain::ShardStoreOptions store_options;
  store_options.shard_index = static_cast<uint32_t>(shard_index);
  store_options.num_shards = static_cast<uint32_t>(num_shards);
  store_options.max_wait = absl::Seconds(absl::GetFlag(FLAGS_max_wait_s));
  // One budget for the dense tables and the embedding tables.
  const uint64_t max_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_memory_mb)) << 20;
  pstrain::ByteBudget budget(max_bytes != 0 ? max_bytes : pstrain::DefaultShardMaxBytes());
  store_options.budget = &budget;
  auto root = pstrain::CanonicalRoot(absl::GetFlag(FLAGS_checkpoint_root));
  if (!root.ok()) {
    spdlog::error("pstrain-ps: --checkpoint_root: {}", std::string(root.status().message()));
    return 2;
  }
  store_options.checkpoint_root = *root;
  // Replicated tables (dense and embedding): a primary forwards to its backups over gRPC, with the job's secret
  // and this shard's token, through the services (set below, before any table exists).
  const pstrain::GrpcParameterService* forwarding_service = nullptr;
  store_options.forward = Forwarder(&forwarding_service);
  pstrain::ShardStore store(store_options);
  pstrain::EmbeddingStoreOptions embedding_options;
  embedding_options.budget = &budget;
  embedding_options.max_wait = store_options.max_wait;
  embedding_options.max_waiters = 256;  // SYNC lookups wait on server threads: leave threads for other calls
  embedding_options.max_response_bytes = static_cast<uint64_t>(max_mb) << 20;
  const pstrain::GrpcEmbeddingService* embedding_forwarding = nullptr;
  embedding_options.forward = EmbeddingForwarder(&embedding_forwarding);
  pstrain::EmbeddingStore embeddings(embedding_options);
  std::unique_ptr<pstrain::MetricsServer> metrics;
  std::unique_ptr<pstrain::ParameterServiceMetrics> service_metrics;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    auto m = pstrain::MetricsServer::Start(pstrain::MetricsHostFromFlags(), absl::GetFlag(FLAGS_metrics_port));
    if (!m.ok()) {
      spdlog::error("pstrain-ps: {}", m.status().ToString());
      return 1;
    }
    metrics = std::move(*m);
    service_metrics = std::make_unique<pstrain::ParameterServiceMetrics>(metrics->registry(), shard_index);
    spdlog::info("pstrain-ps: Prometheus metrics on port {}", metrics->port());
  }
  auto server_security = pstrain::ServerSecurityFor(security);
  if (!server_security.ok()) {
    spdlog::error("pstrain-ps: {}", server_security.status().ToString());
    return 2;
  }
  pstrain::GrpcParameterService::Options service_options;
  service_options.metrics = service_metrics.get();
  service_options.tokens = server_security->tokens;
  if (!absl::GetFlag(FLAGS_table_grant_public_key_file).empty()) {
    auto grants = pstrain::TableGrantVerifier::Load(absl::GetFlag(FLAGS_table_grant_public_key_file),
                                                    "--table_grant_public_key_file");
    if (!grants.ok()) {
      spdlog::error("pstrain-ps: {}", std::string(grants.status().message()));
      return 2;
    }
    service_options.grants = std::move(*grants);
  } else if (security.server_tls()) {
    spdlog::warn("pstrain-ps: no --table_grant_public_key_file: any member that reaches this shard can make a "
                 "job's table first (for a job not yet started, under its own secret); give the shards the public "
                 "key of the coordinator's --table_grant_key_file");
  }
  pstrain::GrpcEmbeddingService embedding_service(
      &embeddings, {service_options.tokens, service_options.grants, store_options.checkpoint_root});
  embedding_forwarding = &embedding_service;
  // The embedding tables learn from the dense SetWorkers which ranks take
  // part, and replicated ones which shards are lost.
  service_options.on_set_workers = pstrain::SetWorkersOnEmbeddings(&store, &embeddings, &embedding_service);
  pstrain::GrpcParameterService service(&store, std::move(service_options));
  forwarding_service = &service;
  pstrain::GrpcServerOptions server_options = pstrain::GrpcServerOptionsFromFlags(*server_security);
  server_options.max_message_bytes = max_mb << 20;
  auto server = pstrain::GrpcServer::Create(server_options, {&service, &embedding_service});
  if (!server.ok()) {
    spdlog::error("pstrain-ps: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("pstrain-ps shard {}/{} serving on port {} ({})", shard_index, num_shards,
               (*server)->port(), pstrain::DescribeSecurity(security, *server_security));

  std::unique_ptr<pstrain::ClusterMember> member;
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    auto joined = JoinCoordinator((*server)->port());
    if (!joined.ok()) {
      spdlog::error("pstrain-ps: {}", joined.status().ToString());
      return 1;
    }
    member = std::move(*joined);
  }

  int sig = 0;
  sigwait(&stop, &sig);
  if (sig == SIGTERM && member && !member->job_id().empty()) Drain(*member, store, stop, shard_index);
  if (member) member->Stop();
  spdlog::info("pstrain-ps: signal {}, draining", sig);
  store.Shutdown();
  embeddings.Shutdown();
  (*server)->Shutdown(absl::Seconds(10));
  spdlog::info("pstrain-ps: stopped");
  return 0;
}
