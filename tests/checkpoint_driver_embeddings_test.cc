// The checkpoint driver (server/coordinator/checkpoint_driver.h) with a real
// shard server over gRPC: a job with embeddings gets its shard's embedding
// file beside the dense one, listed in the manifest with its size and crc32;
// an embedding save that fails fails the checkpoint whole, leaving nothing
// behind; and a checkpoint without embedding files cannot restore a job
// with embeddings.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "rpc/grpc_remote_shard.h"
#include "server/coordinator/checkpoint_driver.h"
#include "tests/child_process.h"
#include "tests/in_process_services.h"

namespace pstrain {
namespace {

constexpr char kJob[] = "job-000001";
constexpr char kSecret[] = "s3cret";

class CheckpointDriverEmbeddingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("driver-emb");
    ASSERT_TRUE(s_.Start(dir_).ok());
    auto root = CanonicalRoot(dir_ + "/shard-root");
    ASSERT_TRUE(root.ok());
    root_ = *root;
    // The job's dense table (no parameters) on the shard.
    InitTableRequest init;
    init.set_job(kJob);
    init.set_attempt(1);
    init.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    init.mutable_config()->mutable_optimizer()->set_lr(1);
    init.mutable_config()->set_consistency(ASYNC);
    init.mutable_config()->set_num_workers(1);
    GrpcRemoteShard shard(RemoteShardOptions{s_.ps_server->local_target()});
    InitTableResponse made;
    CallOptions o;
    o.deadline = absl::Now() + absl::Seconds(20);
    o.job_secret = kSecret;
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { shard.InitTableAsync(init, {}, &made, o, std::move(d)); }).ok());
  }
  void TearDown() override { s_.Stop(); }

  // The job's embedding table on the shard, with a few rows.
  void MakeEmbeddings() {
    InitEmbeddingsRequest init;
    init.set_job(kJob);
    init.set_attempt(1);
    init.set_num_workers(1);
    init.set_consistency(ASYNC);
    init.set_num_shards(1);
    EmbeddingTableConfig* t = init.add_tables();
    t->set_name("t");
    t->set_dim(4);
    t->mutable_optimizer()->set_kind(EmbeddingOptimizer::ADAGRAD);
    t->mutable_optimizer()->set_lr(0.1);
    InitEmbeddingsResponse made;
    ASSERT_TRUE(s_.embeddings->Init(init, &made).ok());
    EmbeddingLookupRequest lookup;
    lookup.set_job(kJob);
    lookup.set_attempt(1);
    EmbeddingIds* ids = lookup.add_tables();
    ids->set_table("t");
    const int64_t wanted[] = {3, 5, 8};
    ids->set_ids(std::string(reinterpret_cast<const char*>(wanted), sizeof(wanted)));
    EmbeddingLookupResponse rows;
    ASSERT_TRUE(s_.embeddings->Lookup(lookup, absl::Now() + absl::Seconds(10), &rows).ok());
  }

  CheckpointWrite Write() {
    CheckpointWrite w;
    w.job_id = kJob;
    w.attempt = 1;
    w.job_secret = kSecret;
    w.shards = {s_.ps_server->local_target()};
    w.dir = root_ + "/out/" + kJob + "/ckpt-5";
    w.embeddings = true;
    w.save_timeout = absl::Seconds(20);
    w.manifest.job = kJob;
    w.manifest.name = "ctr";
    w.manifest.step = 5;
    w.manifest.chunk_bytes = 1 << 20;
    w.manifest.params.push_back({"w", {2}, DT_FLOAT32});
    return w;
  }

  std::string dir_, root_;
  InProcessServices s_;
  Rendezvous rendezvous_{RendezvousLimits{}};
};

TEST_F(CheckpointDriverEmbeddingsTest, TheEmbeddingFileIsWrittenAndListed) {
  MakeEmbeddings();
  const CheckpointWrite w = Write();
  ASSERT_TRUE(WriteCheckpoint(w, root_, rendezvous_).ok());
  auto m = ReadManifest(w.dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->embeddings.size(), 1u);
  EXPECT_EQ(m->embeddings[0].file, "emb-0.bin");
  EXPECT_EQ(m->embeddings[0].bytes, std::filesystem::file_size(w.dir + "/emb-0.bin"));
  auto bytes = ReadFile(w.dir + "/emb-0.bin");
  ASSERT_TRUE(bytes.ok());
  // The crc32 of the whole file.
  EXPECT_EQ(m->embeddings[0].crc32,
            static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes->data()), bytes->size())));
  EXPECT_EQ(m->shards.size(), 1u);
}

TEST_F(CheckpointDriverEmbeddingsTest, AFailedEmbeddingSaveLeavesNothingBehind) {
  // No embedding tables on the shard: its SaveEmbeddings fails, its dense
  // SaveTable does not.
  const CheckpointWrite w = Write();
  const absl::Status s = WriteCheckpoint(w, root_, rendezvous_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("shard 0's embeddings"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(w.dir));
  EXPECT_FALSE(std::filesystem::exists(PendingCheckpointDir(w.dir)));
  for (const auto& entry : std::filesystem::directory_iterator(root_ + "/out/" + kJob)) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
}

TEST_F(CheckpointDriverEmbeddingsTest, ACheckpointWithoutEmbeddingFilesCannotRestoreAJobWithEmbeddings) {
  CheckpointWrite w = Write();
  w.embeddings = false;  // as a job without embeddings (or an older pstrain) wrote it
  ASSERT_TRUE(WriteCheckpoint(w, root_, rendezvous_).ok());
  auto spec = ParseJobSpec(
      "name: ctr\nmodel: dlrm\nworkers: 1\nshards: 1\ndata: {format: criteo, train_file: t.tsv}\n"
      "embeddings: {tables: [{name: t, dim: 4}]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto m = LoadCheckpoint(kJob, 2, kSecret, "", w.dir, *spec, {s_.ps_server->local_target()}, root_, absl::Seconds(20));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_NE(m.status().message().find("holds no embedding tables"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace pstrain
