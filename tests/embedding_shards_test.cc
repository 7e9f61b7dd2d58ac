// Embedding tables across shards, over real gRPC sockets: workers' clients
// route ids to three in-process shard servers, and the rows end exactly as
// one table in one process would have them (a row's value depends on its
// id and its updates, not on the shard count), under SYNC with two ranks.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_server.h"
#include "server/ps/grpc_embedding_service.h"

namespace pstrain {
namespace {

constexpr int kShards = 3, kRanks = 2, kSteps = 6, kDim = 8;

struct Shard {
  EmbeddingStore store{EmbeddingStoreOptions{}};
  GrpcEmbeddingService service{&store, {}};
  std::unique_ptr<GrpcServer> server;
};

EmbeddingTableConfig Table(const std::string& name, EmbeddingOptimizer::Kind kind) {
  EmbeddingTableConfig t;
  t.set_name(name);
  t.set_dim(kDim);
  t.set_seed(11);
  t.mutable_optimizer()->set_kind(kind);
  t.mutable_optimizer()->set_lr(0.05);
  return t;
}

// Rank r's unique ids of table t at step s: overlapping between ranks, so
// the shards sum two ranks' gradients for some rows.
std::vector<int64_t> IdsOf(int rank, int table, int step) {
  std::vector<int64_t> ids;
  std::mt19937_64 rng(1000 * rank + 100 * table + step);
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int64_t>(rng() % 97) * 7919 - 300000);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<float> GradOf(int rank, int step, const std::vector<int64_t>& ids) {
  std::vector<float> g(ids.size() * kDim);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < kDim; ++j) g[i * kDim + j] = 0.01f * static_cast<float>((ids[i] + rank + step + j) % 13 - 6);
  }
  return g;
}

TEST(EmbeddingShardsTest, SyncRowsAcrossThreeShardsMatchOneTable) {
  std::vector<std::unique_ptr<Shard>> shards;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int s = 0; s < kShards; ++s) {
    shards.push_back(std::make_unique<Shard>());
    GrpcServerOptions so;
    so.address = "127.0.0.1:0";
    auto server = GrpcServer::Create(so, {&shards.back()->service});
    ASSERT_TRUE(server.ok()) << server.status();
    shards.back()->server = std::move(*server);
    channels.push_back(grpc::CreateChannel(shards.back()->server->local_target(), grpc::InsecureChannelCredentials()));
  }
  InitEmbeddingsRequest init;
  init.set_num_workers(kRanks);
  init.set_consistency(SYNC);
  *init.add_tables() = Table("user", EmbeddingOptimizer::LAZY_ADAM);
  *init.add_tables() = Table("item", EmbeddingOptimizer::ADAGRAD);

  // The reference: the same steps on one table per name, in one process.
  std::vector<std::unique_ptr<EmbeddingTable>> local;
  for (const auto& t : init.tables()) local.push_back(std::move(*EmbeddingTable::Create(t, nullptr)));

  std::vector<std::thread> ranks;
  std::vector<std::vector<std::vector<float>>> last_rows(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      EmbeddingClientOptions o;
      o.job = "ctr";
      o.attempt = 1;
      o.rank = r;
      o.job_secret = "secret";
      GrpcEmbeddingClient client(channels, o);
      ASSERT_TRUE(client.Init(init).ok());
      for (int step = 0; step < kSteps; ++step) {
        std::vector<std::vector<int64_t>> ids = {IdsOf(r, 0, step), IdsOf(r, 1, step)};
        std::vector<std::vector<float>> rows;
        absl::Status s = client.Lookup(step, ids, &rows);
        ASSERT_TRUE(s.ok()) << s;
        std::vector<std::vector<float>> grads = {GradOf(r, step, ids[0]), GradOf(r, step, ids[1])};
        s = client.Update(step, ids, {grads[0].data(), grads[1].data()});
        ASSERT_TRUE(s.ok()) << s;
      }
      std::vector<std::vector<int64_t>> all = {IdsOf(r, 0, 0), IdsOf(r, 1, 0)};
      ASSERT_TRUE(client.Lookup(kSteps, all, &last_rows[r]).ok());
    });
  }
  for (auto& t : ranks) t.join();

  for (int step = 0; step < kSteps; ++step) {
    for (int t = 0; t < 2; ++t) {
      // A SYNC step: both ranks' gradients summed per row, applied once at 1/2.
      std::vector<int64_t> ids;
      std::vector<float> grads;
      for (int r = 0; r < kRanks; ++r) {
        const std::vector<int64_t> mine = IdsOf(r, t, step);
        std::vector<float> out(mine.size() * kDim);
        ASSERT_TRUE(local[t]->Lookup(mine, step, out.data()).ok());
        const std::vector<float> g = GradOf(r, step, mine);
        ids.insert(ids.end(), mine.begin(), mine.end());
        grads.insert(grads.end(), g.begin(), g.end());
      }
      ASSERT_TRUE(local[t]->Update(ids, grads.data(), step + 1, 1.0 / kRanks).ok());
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    for (int t = 0; t < 2; ++t) {
      const std::vector<int64_t> ids = IdsOf(r, t, 0);
      std::vector<float> want(ids.size() * kDim);
      ASSERT_TRUE(local[t]->Lookup(ids, kSteps, want.data()).ok());
      ASSERT_EQ(last_rows[r][t].size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        // Sums over two ranks may add in another order on a shard.
        EXPECT_NEAR(last_rows[r][t][i], want[i], 1e-6) << "rank " << r << " table " << t << " element " << i;
      }
    }
  }
  for (auto& s : shards) {
    s->store.Shutdown();
    s->server->Shutdown();
  }
}

}  // namespace
}  // namespace pstrain
