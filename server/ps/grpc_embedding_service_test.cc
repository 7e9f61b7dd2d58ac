// The shard's EmbeddingService over a real gRPC socket: a round trip, the
// job secret, the coordinator's grant, and a SYNC lookup bounded by the
// call's deadline.
#include "server/ps/grpc_embedding_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/file_util.h"
#include "proto/embedding.grpc.pb.h"
#include "server/ps/grpc_parameter_service.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/grpc_server.h"
#include "rpc/grpc_tensor_coding.h"

namespace pstrain {
namespace {

InitEmbeddingsRequest Init(Consistency consistency) {
  InitEmbeddingsRequest r;
  r.set_job("ctr");
  r.set_attempt(3);
  r.set_num_workers(2);
  r.set_consistency(consistency);
  r.set_num_shards(1);
  EmbeddingTableConfig* t = r.add_tables();
  t->set_name("ad");
  t->set_dim(4);
  t->mutable_optimizer()->set_kind(EmbeddingOptimizer::ROWWISE_ADAGRAD);
  t->mutable_optimizer()->set_lr(0.1);
  return r;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class GrpcEmbeddingServiceTest : public ::testing::Test {
 protected:
  void Start(GrpcEmbeddingService::Options options) {
    service_ = std::make_unique<GrpcEmbeddingService>(&store_, std::move(options));
    GrpcServerOptions so;
    so.address = "127.0.0.1:0";
    auto server = GrpcServer::Create(so, {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = EmbeddingService::NewStub(grpc::CreateChannel(server_->local_target(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    store_.Shutdown();
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& secret, absl::Duration timeout = absl::Seconds(10)) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!secret.empty()) c->AddMetadata(kJobSecretMetadata, secret);
    return c;
  }

  EmbeddingLookupRequest LookupOf(int64_t step, const std::vector<int64_t>& ids) {
    EmbeddingLookupRequest r;
    r.set_job("ctr");
    r.set_attempt(3);
    r.set_step(step);
    EmbeddingIds* e = r.add_tables();
    e->set_table("ad");
    e->set_ids(Bytes(ids));
    return r;
  }

  EmbeddingStore store_{EmbeddingStoreOptions{}};
  std::unique_ptr<GrpcEmbeddingService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<EmbeddingService::Stub> stub_;
};

TEST_F(GrpcEmbeddingServiceTest, RowsTravelAndTrainOverTheWire) {
  Start({});
  InitEmbeddingsResponse created;
  ASSERT_TRUE(stub_->InitEmbeddings(Context("s3cret").get(), Init(ASYNC), &created).ok());
  EXPECT_TRUE(created.created());
  EmbeddingLookupResponse before, after;
  const std::vector<int64_t> ids = {-5, 1LL << 62};
  ASSERT_TRUE(stub_->Lookup(Context("s3cret").get(), LookupOf(0, ids), &before).ok());
  ASSERT_EQ(before.values(0).size(), 2 * 4 * sizeof(float));
  EmbeddingUpdateRequest u;
  u.set_job("ctr");
  u.set_attempt(3);
  *u.add_tables() = LookupOf(0, ids).tables(0);
  u.add_grads(Bytes(std::vector<float>(8, 1.0f)));
  EmbeddingUpdateResponse none;
  ASSERT_TRUE(stub_->Update(Context("s3cret").get(), u, &none).ok());
  ASSERT_TRUE(stub_->Lookup(Context("s3cret").get(), LookupOf(1, ids), &after).ok());
  std::vector<float> a(8), b(8);
  std::memcpy(a.data(), before.values(0).data(), 32);
  std::memcpy(b.data(), after.values(0).data(), 32);
  for (int j = 0; j < 8; ++j) EXPECT_LT(b[j], a[j]) << j;  // a positive gradient lowers every element
}

TEST_F(GrpcEmbeddingServiceTest, AnotherJobsSecretReadsNothing) {
  Start({});
  InitEmbeddingsResponse created;
  ASSERT_TRUE(stub_->InitEmbeddings(Context("s3cret").get(), Init(ASYNC), &created).ok());
  EmbeddingLookupResponse r;
  grpc::Status s = stub_->Lookup(Context("other").get(), LookupOf(0, {1}), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = stub_->Lookup(Context("").get(), LookupOf(0, {1}), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(r.values_size(), 0);
}

TEST_F(GrpcEmbeddingServiceTest, TablesAreMadeOnlyWithTheCoordinatorsGrant) {
  auto signer = TableGrantSigner::Generate();
  ASSERT_NE(signer, nullptr);
  auto verifier = TableGrantVerifier::FromPem(signer->PublicKeyPem(), "test");
  ASSERT_TRUE(verifier.ok());
  Start({nullptr, *verifier});
  InitEmbeddingsResponse created;
  grpc::Status s = stub_->InitEmbeddings(Context("s3cret").get(), Init(ASYNC), &created);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("grant"), std::string::npos) << s.error_message();
  auto context = Context("s3cret");
  context->AddMetadata(kTableGrantMetadata, signer->Sign("ctr", 2, "s3cret"));  // another attempt's
  EXPECT_EQ(stub_->InitEmbeddings(context.get(), Init(ASYNC), &created).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  context = Context("s3cret");
  context->AddMetadata(kTableGrantMetadata, signer->Sign("ctr", 3, "s3cret"));
  EXPECT_TRUE(stub_->InitEmbeddings(context.get(), Init(ASYNC), &created).ok());
}

TEST_F(GrpcEmbeddingServiceTest, ASyncLookupEndsAtTheCallsDeadline) {
  Start({});
  InitEmbeddingsResponse created;
  ASSERT_TRUE(stub_->InitEmbeddings(Context("s3cret").get(), Init(SYNC), &created).ok());
  EmbeddingLookupResponse r;
  const absl::Time start = absl::Now();
  grpc::Status s = stub_->Lookup(Context("s3cret", absl::Milliseconds(300)).get(), LookupOf(1, {1}), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A hybrid job's shard holds only rows: the coordinator's SetWorkers (seats
// and routing), sent to the ParameterService, reaches them through
// SetWorkersOnEmbeddings -- for a caller with the job's secret only.
TEST_F(GrpcEmbeddingServiceTest, AHybridJobsSeatsReachItsRowsWithItsSecretOnly) {
  ShardStore dense{ShardStoreOptions{}};
  service_ = std::make_unique<GrpcEmbeddingService>(&store_, GrpcEmbeddingService::Options{});
  GrpcParameterService::Options po;
  po.on_set_workers = SetWorkersOnEmbeddings(&dense, &store_, service_.get());
  GrpcParameterService ps(&dense, po);
  GrpcServerOptions so;
  so.address = "127.0.0.1:0";
  auto server = GrpcServer::Create(so, {service_.get(), &ps});
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  stub_ = EmbeddingService::NewStub(grpc::CreateChannel(server_->local_target(), grpc::InsecureChannelCredentials()));
  InitEmbeddingsResponse created;
  ASSERT_TRUE(stub_->InitEmbeddings(Context("s3cret").get(), Init(SSP), &created).ok());
  // Rank 0's step 1 waits for rank 1's step 0 (staleness 0) while both are active.
  EmbeddingLookupResponse r;
  EXPECT_EQ(stub_->Lookup(Context("s3cret", absl::Milliseconds(300)).get(), LookupOf(1, {1}), &r).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  RemoteShardOptions ro;
  ro.target = server_->local_target();
  GrpcRemoteShard shard(ro);
  SetWorkersRequest seats;
  seats.set_job("ctr");
  seats.set_attempt(3);
  seats.add_seats()->set_active(true);
  seats.add_seats()->set_active(false);  // rank 1 lost
  auto set = [&](const std::string& secret, uint64_t attempt) {
    seats.set_attempt(attempt);
    CallOptions opts;
    opts.deadline = absl::Now() + absl::Seconds(10);
    opts.job_secret = secret;
    SetWorkersResponse resp;
    return WaitFor([&](StatusCallback done) { shard.SetWorkersAsync(seats, &resp, opts, std::move(done)); });
  };
  EXPECT_EQ(set("other", 3).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(set("", 3).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(set("s3cret", 2).code(), absl::StatusCode::kFailedPrecondition);  // no table of that attempt
  EXPECT_EQ(stub_->Lookup(Context("s3cret", absl::Milliseconds(300)).get(), LookupOf(1, {1}), &r).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED)
      << "a refused SetWorkers changed the seats";
  ASSERT_TRUE(set("s3cret", 3).ok());
  EXPECT_TRUE(stub_->Lookup(Context("s3cret").get(), LookupOf(1, {1}), &r).ok()) << "rank 1 is vacant now";
  dense.Shutdown();
}

TEST_F(GrpcEmbeddingServiceTest, ACheckpointGoesToTheJobsDirectoryAndComesBackOnAnotherShard) {
  auto root = CanonicalRoot(::testing::TempDir() + "/embedding-root");
  ASSERT_TRUE(root.ok());
  Start({nullptr, nullptr, *root});
  InitEmbeddingsResponse created;
  ASSERT_TRUE(stub_->InitEmbeddings(Context("s3cret").get(), Init(ASYNC), &created).ok());
  EmbeddingLookupResponse before;
  ASSERT_TRUE(stub_->Lookup(Context("s3cret").get(), LookupOf(0, {1, 2, 3}), &before).ok());
  SaveEmbeddingsRequest save;
  save.set_job("ctr");
  save.set_attempt(3);
  save.set_path("elsewhere/shard-0.emb");
  SaveEmbeddingsResponse saved;
  EXPECT_EQ(stub_->SaveEmbeddings(Context("s3cret").get(), save, &saved).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  save.set_path("out/ctr/ckpt-1/shard-0.emb");
  ASSERT_TRUE(::mkdir((*root + "/out").c_str(), 0755) == 0 || errno == EEXIST);
  ASSERT_TRUE(::mkdir((*root + "/out/ctr").c_str(), 0755) == 0 || errno == EEXIST);
  ASSERT_TRUE(::mkdir((*root + "/out/ctr/ckpt-1").c_str(), 0755) == 0 || errno == EEXIST);
  grpc::Status s = stub_->SaveEmbeddings(Context("s3cret").get(), save, &saved);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(saved.rows(), 3);
  EXPECT_GT(saved.bytes(), 0u);
  // The same store plays the next attempt's shard: the load replaces attempt 3.
  LoadEmbeddingsRequest load;
  *load.mutable_init() = Init(ASYNC);
  load.mutable_init()->set_attempt(4);
  load.add_paths(save.path());
  load.set_start_step(7);
  LoadEmbeddingsResponse none;
  s = stub_->LoadEmbeddings(Context("s3cret").get(), load, &none);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EmbeddingLookupRequest l = LookupOf(7, {1, 2, 3});
  l.set_attempt(4);
  EmbeddingLookupResponse after;
  ASSERT_TRUE(stub_->Lookup(Context("s3cret").get(), l, &after).ok());
  EXPECT_EQ(after.values(0), before.values(0));
}

}  // namespace
}  // namespace pstrain
