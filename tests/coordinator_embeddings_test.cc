// A dlrm job's embedding tables are freed on its shards when the job ends:
// the coordinator (in process) drops them on a real shard server, over
// gRPC, as it drops the dense table.
#include <gtest/gtest.h>

#include <memory>

#include "embedding/embedding_store.h"
#include "google/protobuf/util/json_util.h"
#include "rpc/grpc_server.h"
#include "server/coordinator/coordinator_testing.h"
#include "server/ps/grpc_embedding_service.h"

namespace pstrain {
namespace {

const char kSpec[] = R"(
name: ctr
model: dlrm
data: {format: criteo, dir: criteo, train_file: train.tsv}
workers: 1
shards: 1
embeddings:
  tables:
    - {name: t, dim: 4}
)";

TEST(CoordinatorEmbeddingsTest, AFinishedDlrmJobsTablesLeaveItsShards) {
  EmbeddingStore store{EmbeddingStoreOptions{}};
  GrpcEmbeddingService service(&store, {});
  GrpcServerOptions so;
  so.address = "127.0.0.1:0";
  auto server = GrpcServer::Create(so, {&service});
  ASSERT_TRUE(server.ok()) << server.status();

  auto c = MakeTestCoordinator();
  RegisterRequest shard;
  shard.set_role(MEMBER_ROLE_SHARD);
  shard.set_name("shard-0");
  shard.set_address((*server)->local_target());
  ASSERT_TRUE(c->Register(shard).ok());
  RegisterRequest worker;
  worker.set_role(MEMBER_ROLE_WORKER);
  worker.set_name("worker-0");
  auto w = c->Register(worker);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string job = SubmitSpec(*c, kSpec);
  auto a = c->GetAssignment(w->member_id(), absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(a.ok()) << a.status();

  // What the worker's InitEmbeddings made on the shard.
  InitEmbeddingsRequest init;
  init.set_job(job);
  init.set_attempt(a->attempt());
  init.set_num_workers(1);
  init.set_consistency(ASYNC);
  init.set_num_shards(1);
  EmbeddingTableConfig* t = init.add_tables();
  t->set_name("t");
  t->set_dim(4);
  t->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
  t->mutable_optimizer()->set_lr(0.1);
  InitEmbeddingsResponse made;
  ASSERT_TRUE(store.Init(init, &made).ok());
  EmbeddingStatsRequest stats;
  stats.set_job(job);
  EmbeddingStatsResponse st;
  ASSERT_TRUE(store.Stats(stats, &st).ok());

  ReportProgressRequest done;
  done.set_member_id(w->member_id());
  done.set_job_id(job);
  done.set_attempt(a->attempt());
  done.mutable_event()->mutable_done();
  ASSERT_TRUE(c->ReportProgress(done).ok());
  ASSERT_EQ(c->GetJob(job)->state(), SUCCEEDED);
  // The drop runs in the background.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (store.Stats(stats, &st).ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(store.Stats(stats, &st).code(), absl::StatusCode::kNotFound) << "the job's tables are still there";
  c->Shutdown();
  store.Shutdown();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace pstrain
