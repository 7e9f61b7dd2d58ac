// Every pstrain gRPC service in this process, on 127.0.0.1: a shard server
// (ParameterService over a ShardStore, EmbeddingService over an
// EmbeddingStore) and a coordinator server (JobService
// and ClusterService over a Coordinator without a background tick), for
// tests that call the services as a remote client would.
#ifndef PSTRAIN_TESTS_IN_PROCESS_SERVICES_H_
#define PSTRAIN_TESTS_IN_PROCESS_SERVICES_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/file_util.h"
#include "embedding/embedding_store.h"
#include "rpc/grpc_server.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "server/ps/grpc_embedding_service.h"
#include "server/ps/grpc_parameter_service.h"
#include "rpc/table_grant.h"
#include "table/shard_store.h"

namespace pstrain {

struct InProcessServices {
  // Starts both servers with `security` (default: plaintext, no tokens);
  // files go under `dir`. health_port as GrpcServerOptions'.
  absl::Status Start(const std::string& dir, const ServerSecurity& security = {}, int health_port = -1) {
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    options.security = security;
    options.health_port = health_port;
    ShardStoreOptions so;
    auto shard_root = CanonicalRoot(dir + "/shard-root");
    if (!shard_root.ok()) return shard_root.status();
    so.checkpoint_root = *shard_root;
    store = std::make_unique<ShardStore>(so);
    embeddings = std::make_unique<EmbeddingStore>(EmbeddingStoreOptions{});
    embedding_service = std::make_unique<GrpcEmbeddingService>(
        embeddings.get(), GrpcEmbeddingService::Options{security.tokens, grant_verifier, *shard_root});
    // As pstrain-ps wires them: SetWorkers reaches the embedding tables too.
    ps_service = std::make_unique<GrpcParameterService>(
        store.get(), GrpcParameterService::Options{nullptr, security.tokens, grant_verifier,
                                                   SetWorkersOnEmbeddings(store.get(), embeddings.get(),
                                                                          embedding_service.get())});
    auto ps = GrpcServer::Create(options, {ps_service.get(), embedding_service.get()});
    if (!ps.ok()) return ps.status();
    ps_server = std::move(*ps);

    CoordinatorOptions co;
    co.background_tick = false;
    co.table_grant_signer = grant_signer;
    auto coordinator_root = CanonicalRoot(dir + "/coordinator-root");
    if (!coordinator_root.ok()) return coordinator_root.status();
    co.checkpoint_root = *coordinator_root;
    auto job_store = JobStore::Open(":memory:");
    if (!job_store.ok()) return job_store.status();
    auto c = Coordinator::Create(co, std::move(*job_store));
    if (!c.ok()) return c.status();
    coordinator = std::move(*c);
    jobs = std::make_unique<GrpcJobService>(coordinator.get(), security.tokens);
    cluster = std::make_unique<GrpcClusterService>(coordinator.get(), false, security.tokens);
    auto cs = GrpcServer::Create(options, {jobs.get(), cluster.get()});
    if (!cs.ok()) return cs.status();
    coordinator_server = std::move(*cs);
    return absl::OkStatus();
  }

  void Stop() {
    if (store) store->Shutdown();
    if (embeddings) embeddings->Shutdown();
    if (ps_server) ps_server->Shutdown();
    if (coordinator) coordinator->Shutdown();
    if (coordinator_server) coordinator_server->Shutdown();
  }

  // The coordinator's table grant key and the shard's check of it (set
  // before Start; null: none).
  std::shared_ptr<const TableGrantSigner> grant_signer;
  std::shared_ptr<const TableGrantVerifier> grant_verifier;
  std::unique_ptr<ShardStore> store;
  std::unique_ptr<GrpcParameterService> ps_service;
  std::unique_ptr<EmbeddingStore> embeddings;
  std::unique_ptr<GrpcEmbeddingService> embedding_service;
  std::unique_ptr<GrpcServer> ps_server;
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<GrpcJobService> jobs;
  std::unique_ptr<GrpcClusterService> cluster;
  std::unique_ptr<GrpcServer> coordinator_server;
};

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_IN_PROCESS_SERVICES_H_
