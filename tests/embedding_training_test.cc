// DLRM training with its embeddings on two shard servers over real gRPC
// sockets gives exactly what the same training with the tables in the
// worker's process gives: the worker's deduplication, routing, the wire and
// the shards' ASYNC updates change no number.
#include <ATen/ops/from_blob.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "embedding/embedding_store.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_server.h"
#include "server/ps/grpc_embedding_service.h"
#include "worker/criteo_data.h"
#include "worker/criteo_synth.h"
#include "worker/dlrm_model.h"
#include "worker/sparse_embeddings.h"

namespace pstrain {
namespace {

constexpr int kFields = 4;  // of Criteo's 26: the others read one shared table
constexpr int64_t kBatch = 64, kSteps = 60;

std::vector<EmbeddingTableConfig> Tables(int dim) {
  std::vector<EmbeddingTableConfig> tables;
  for (int t = 0; t <= kFields; ++t) {
    EmbeddingTableConfig c;
    c.set_name(t < kFields ? absl::StrCat("c", t) : "shared");
    c.set_dim(dim);
    c.mutable_optimizer()->set_kind(t % 2 == 0 ? EmbeddingOptimizer::ADAGRAD : EmbeddingOptimizer::LAZY_ADAM);
    c.mutable_optimizer()->set_lr(0.05);
    tables.push_back(c);
  }
  return tables;
}

std::vector<SparseFieldConfig> Fields() {
  std::vector<SparseFieldConfig> fields;
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    fields.push_back({std::min(f, kFields), f % 3 == 0 ? EmbeddingPooling::kMean : EmbeddingPooling::kSum});
  }
  return fields;
}

at::Tensor FromVector(const std::vector<float>& v, at::IntArrayRef shape) {
  return at::from_blob(const_cast<float*>(v.data()), shape, at::kFloat).clone();
}

// Trains kSteps of DLRM over `rows`; returns the losses and the final rows
// of the ids in `probe`.
std::vector<float> Train(EmbeddingRows* rows, const std::vector<CriteoBatch>& batches,
                         const std::vector<std::vector<int64_t>>& probe, std::vector<std::vector<float>>* final_rows) {
  DlrmConfig config;
  auto embeddings = SparseEmbeddings::Create(rows, Fields());
  EXPECT_TRUE(embeddings.ok()) << embeddings.status();
  auto model = Dlrm::Create(config);
  EXPECT_TRUE(model.ok());
  torch::optim::Adagrad optimizer((*model)->parameters(), torch::optim::AdagradOptions(0.02));
  std::vector<float> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    const CriteoBatch& batch = batches[step % batches.size()];
    std::vector<at::Tensor> pooled;
    absl::Status s = (*embeddings)->Forward(step, batch, &pooled);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return losses;
    auto logits = (*model)->Forward(FromVector(batch.dense, {batch.size(), kCriteoDenseFields}), pooled);
    auto loss = DlrmLoss(*logits, FromVector(batch.labels, {batch.size()}));
    optimizer.zero_grad();
    loss->backward();
    optimizer.step();
    s = (*embeddings)->Backward(step);
    EXPECT_TRUE(s.ok()) << s;
    losses.push_back(loss->item<float>());
  }
  EXPECT_TRUE(rows->Lookup(kSteps, probe, final_rows, EmbeddingLookupKind::kTrain).ok());
  return losses;
}

TEST(EmbeddingTrainingTest, TwoShardsOverGrpcTrainExactlyAsTablesInProcess) {
  at::set_num_threads(1);
  CriteoSynthOptions synth;
  synth.train_examples = kBatch * 20;
  synth.test_examples = 100;
  synth.id_space.fill(300);
  const std::string dir = ::testing::TempDir();
  ASSERT_TRUE(WriteCriteoSynth(synth, dir + "/et_train.tsv", dir + "/et_test.tsv", dir + "/et_meta.txt").ok());
  auto reader = CriteoReader::Open(dir + "/et_train.tsv", CriteoReaderOptions());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<CriteoBatch> batches;
  for (;;) {
    CriteoBatch b;
    ASSERT_TRUE((*reader)->ReadBatch(kBatch, &b).ok());
    if (b.size() == 0) break;
    batches.push_back(std::move(b));
  }
  // Probe: every id field 0 and the last field saw.
  std::vector<std::vector<int64_t>> probe(kFields + 1);
  for (const CriteoBatch& b : batches) {
    probe[0].insert(probe[0].end(), b.sparse_ids[0].begin(), b.sparse_ids[0].end());
    probe[kFields].insert(probe[kFields].end(), b.sparse_ids[25].begin(), b.sparse_ids[25].end());
  }
  for (auto& p : probe) {
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  const DlrmConfig config;

  auto local = LocalEmbeddingRows::Create(Tables(config.dim));
  ASSERT_TRUE(local.ok());
  std::vector<std::vector<float>> local_rows;
  const std::vector<float> local_losses = Train(local->get(), batches, probe, &local_rows);

  struct Shard {
    EmbeddingStore store{EmbeddingStoreOptions{}};
    GrpcEmbeddingService service{&store, {}};
    std::unique_ptr<GrpcServer> server;
  };
  std::vector<std::unique_ptr<Shard>> shards;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int s = 0; s < 2; ++s) {
    shards.push_back(std::make_unique<Shard>());
    GrpcServerOptions so;
    so.address = "127.0.0.1:0";
    auto server = GrpcServer::Create(so, {&shards.back()->service});
    ASSERT_TRUE(server.ok());
    shards.back()->server = std::move(*server);
    channels.push_back(grpc::CreateChannel(shards.back()->server->local_target(), grpc::InsecureChannelCredentials()));
  }
  EmbeddingClientOptions o;
  o.job = "dlrm";
  o.attempt = 1;
  GrpcEmbeddingClient client(channels, o);
  InitEmbeddingsRequest init;
  init.set_num_workers(1);
  init.set_consistency(ASYNC);
  for (const auto& t : Tables(config.dim)) *init.add_tables() = t;
  ASSERT_TRUE(client.Init(init).ok());
  RemoteEmbeddingRows remote(&client, kFields + 1);
  std::vector<std::vector<float>> remote_rows;
  const std::vector<float> remote_losses = Train(&remote, batches, probe, &remote_rows);

  EXPECT_EQ(remote_losses, local_losses);
  EXPECT_EQ(remote_rows, local_rows);
  EXPECT_LT(local_losses.back(), local_losses.front());
  int64_t held = 0;
  for (auto& s : shards) {
    EmbeddingStatsRequest sr;
    sr.set_job("dlrm");
    EmbeddingStatsResponse st;
    ASSERT_TRUE(s->store.Stats(sr, &st).ok());
    EXPECT_GT(st.tables(0).rows(), 0);  // both shards hold rows
    held += st.tables(0).rows();
    s->store.Shutdown();
    s->server->Shutdown();
  }
  EXPECT_EQ(held, static_cast<int64_t>(probe[0].size()));
}

}  // namespace
}  // namespace pstrain
