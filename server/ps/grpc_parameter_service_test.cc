// The parameter service over real gRPC on 127.0.0.1, in process.
#include "server/ps/grpc_parameter_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <prometheus/text_serializer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <regex>

#include "absl/synchronization/notification.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/grpc_server.h"
#include "table/shard_store.h"

namespace pstrain {
namespace {

TensorBuffer Floats(const std::vector<float>& v) {
  return TensorBuffer::CopyOf(DT_FLOAT32, {static_cast<int64_t>(v.size())}, v.data(),
                              v.size() * sizeof(float));
}

std::vector<float> ToFloats(const TensorBuffer& t) {
  const float* p = reinterpret_cast<const float*>(t.data);
  return std::vector<float>(p, p + t.NumElements());
}

class GrpcParameterServiceTest : public ::testing::Test {
 protected:
  void StartServer(int max_message_bytes = kDefaultMaxMessageBytes) {
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    options.max_message_bytes = max_message_bytes;
    auto server = GrpcServer::Create(options, {&service_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    RemoteShardOptions ro;
    ro.target = server_->local_target();
    ro.max_message_bytes = 512 << 20;
    ro.default_timeout = absl::Seconds(20);
    client_ = std::make_unique<GrpcRemoteShard>(ro);
  }
  void SetUp() override { StartServer(); }
  void TearDown() override {
    store_.Shutdown();
    if (server_) server_->Shutdown();
  }

  // One unary call of `method` on the server with raw request bytes
  // (hand-encoded, or not a message at all), as no generated stub sends
  // them; an answer's bytes go to *response.
  grpc::Status RawUnaryCall(const std::string& method, const std::string& bytes, std::string* response = nullptr) {
    grpc::GenericStub stub(CreateChannel(server_->local_target()));
    grpc::Slice slice(bytes.data(), bytes.size());
    grpc::ByteBuffer request(&slice, 1), answer;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::promise<grpc::Status> result;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &answer,
                   [&](grpc::Status s) { result.set_value(s); });
    grpc::Status s = result.get_future().get();
    grpc::Slice out;
    if (s.ok() && response != nullptr && answer.DumpToSingleSlice(&out).ok()) {
      response->assign(reinterpret_cast<const char*>(out.begin()), out.size());
    }
    return s;
  }

  absl::Status Init(Consistency consistency, uint32_t workers, std::vector<TensorBuffer> values) {
    InitTableRequest req;
    req.set_job("job");
    req.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    req.mutable_config()->mutable_optimizer()->set_lr(1.0);
    req.mutable_config()->set_consistency(consistency);
    req.mutable_config()->set_num_workers(workers);
    for (size_t i = 0; i < values.size(); ++i) req.add_keys("k" + std::to_string(i));
    InitTableResponse resp;
    return WaitFor([&](StatusCallback done) {
      client_->InitTableAsync(req, values, &resp, {}, done);
    });
  }

  absl::Status Push(uint32_t worker, int64_t step, std::vector<std::string> keys,
                    std::vector<TensorBuffer> grads, PushResponse* resp) {
    PushRequest req;
    req.set_job("job");
    req.set_worker(worker);
    req.set_step(step);
    for (auto& k : keys) req.add_keys(k);
    return WaitFor([&](StatusCallback done) { client_->PushAsync(req, grads, resp, {}, done); });
  }

  std::vector<float> Pull(const std::string& key) {
    PullRequest req;
    req.set_job("job");
    req.add_keys(key);
    PullResponse resp;
    std::vector<TensorBuffer> values;
    absl::Status s = WaitFor([&](StatusCallback done) {
      client_->PullAsync(req, &resp, &values, {}, done);
    });
    EXPECT_TRUE(s.ok()) << s;
    return values.empty() ? std::vector<float>{} : ToFloats(values[0]);
  }

  prometheus::Registry registry_;
  ParameterServiceMetrics metrics_{registry_, 0};
  ShardStore store_{ShardStoreOptions{}};
  GrpcParameterService service_{&store_, &metrics_};
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<GrpcRemoteShard> client_;
};

TEST_F(GrpcParameterServiceTest, PushPullRoundTripOverGrpc) {
  ASSERT_TRUE(Init(ASYNC, 1, {Floats({1, 2, 3}), Floats(std::vector<float>(300000, 1.f))}).ok());
  PushPullRequest req;
  req.set_job("job");
  req.set_worker(0);
  req.set_step(0);
  req.add_keys("k0");
  req.add_keys("k1");
  PushPullResponse resp;
  std::vector<TensorBuffer> values;
  absl::Status s = WaitFor([&](StatusCallback done) {
    client_->PushPullAsync(req, {Floats({1, 1, 1}), Floats(std::vector<float>(300000, 0.25f))}, &resp,
                           &values, {}, done);
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(resp.push().applied(), 2u);
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(ToFloats(values[0]), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(ToFloats(values[1]), std::vector<float>(300000, 0.75f));
  EXPECT_EQ(resp.versions_size(), 2);
}

TEST_F(GrpcParameterServiceTest, CountsRequestsBytesAndLatencyForPrometheus) {
  ASSERT_TRUE(Init(ASYNC, 1, {Floats(std::vector<float>(1000, 1.f))}).ok());
  PushResponse r;
  ASSERT_TRUE(Push(0, 0, {"k0"}, {Floats(std::vector<float>(1000, 1.f))}, &r).ok());
  EXPECT_EQ(Push(0, 1, {"nope"}, {Floats({1})}, &r).code(), absl::StatusCode::kNotFound);
  const std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_NE(text.find("pstrain_shard_requests_total{code=\"OK\",method=\"Push\",shard=\"0\"} 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("pstrain_shard_requests_total{code=\"NOT_FOUND\",method=\"Push\",shard=\"0\"} 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("pstrain_shard_request_seconds_count{method=\"Push\",shard=\"0\"} 2"), std::string::npos)
      << text;
  // The 4000-byte gradient plus framing came in.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex(
      "pstrain_shard_bytes_total\\{direction=\"in\",method=\"Push\",shard=\"0\"\\} ([0-9.e+]+)")));
  EXPECT_GT(std::stod(m[1]), 4000);
}

TEST_F(GrpcParameterServiceTest, ErrorsArriveWithFittingCodesAndChangeNothing) {
  PushResponse r;
  EXPECT_EQ(Push(0, 0, {"k0"}, {Floats({1})}, &r).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Init(ASYNC, 1, {Floats({1, 2, 3})}).ok());
  EXPECT_EQ(Push(0, 0, {"nope"}, {Floats({1})}, &r).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Push(0, 0, {"k0"}, {Floats({1, 1})}, &r).code(), absl::StatusCode::kInvalidArgument);
  absl::Status nan = Push(0, 0, {"k0"}, {Floats({1, NAN, 1})}, &r);
  EXPECT_EQ(nan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.message().find("NaN"), absl::string_view::npos) << nan;
  EXPECT_EQ(Pull("k0"), (std::vector<float>{1, 2, 3}));
  ASSERT_TRUE(Push(0, 0, {"k0"}, {Floats({1, 1, 1})}, &r).ok());
  ASSERT_TRUE(Push(0, 0, {"k0"}, {Floats({1, 1, 1})}, &r).ok());
  EXPECT_EQ(r.duplicates(), 1u);
  EXPECT_EQ(Pull("k0"), (std::vector<float>{0, 1, 2}));
}

TEST_F(GrpcParameterServiceTest, GarbageBytesGetInvalidArgumentAndTheServerCarriesOn) {
  ASSERT_TRUE(Init(ASYNC, 1, {Floats({1, 2, 3})}).ok());
  grpc::Status s = RawUnaryCall("/pstrain.ParameterService/Push", "\x7a\xff\xff\xff\x0f garbage");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(Pull("k0"), (std::vector<float>{1, 2, 3}));
}

TEST_F(GrpcParameterServiceTest, SyncPushPullHonoursTheCallDeadline) {
  ASSERT_TRUE(Init(SYNC, 2, {Floats({1, 2, 3})}).ok());
  PushPullRequest req;
  req.set_job("job");
  req.set_worker(0);
  req.set_step(0);
  req.add_keys("k0");
  PushPullResponse resp;
  std::vector<TensorBuffer> values;
  CallOptions opts;
  opts.deadline = absl::Now() + absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::Status s = WaitFor([&](StatusCallback done) {
    client_->PushPullAsync(req, {Floats({1, 1, 1})}, &resp, &values, opts, done);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

class SmallLimitTest : public GrpcParameterServiceTest {
 protected:
  void SetUp() override { StartServer(1 << 20); }
};

TEST_F(SmallLimitTest, OversizedMessageGetsResourceExhausted) {
  ASSERT_TRUE(Init(ASYNC, 1, {Floats({1, 2, 3})}).ok());
  PushResponse r;
  absl::Status s = Push(0, 0, {"k0"}, {Floats(std::vector<float>(1 << 19, 1.f))}, &r);  // 2 MiB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // The server is unharmed and the table unchanged.
  EXPECT_EQ(Pull("k0"), (std::vector<float>{1, 2, 3}));
}

// grpc.health.v1.Health/Check with an empty service name, hand-encoded:
// HealthCheckResponse{status: SERVING} is the two bytes 08 01.
TEST_F(GrpcParameterServiceTest, AnswersTheStandardHealthCheck) {
  std::string response;
  grpc::Status s = RawUnaryCall("/grpc.health.v1.Health/Check", "", &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response, "\x08\x01");
}

// grpc.reflection.v1alpha list_services, hand-encoded: the answer names the
// parameter service.
TEST_F(GrpcParameterServiceTest, AnswersServerReflection) {
  grpc::GenericStub stub(CreateChannel(server_->local_target()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  const std::string list_services("\x3a\x00", 2);  // field 7 (list_services) = ""
  grpc::Slice slice(list_services.data(), list_services.size());
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice out;
  ASSERT_TRUE(response.DumpToSingleSlice(&out).ok());
  std::string text(reinterpret_cast<const char*>(out.begin()), out.size());
  EXPECT_NE(text.find("pstrain.ParameterService"), std::string::npos);
  EXPECT_NE(text.find("grpc.health.v1.Health"), std::string::npos);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// A ShardStore whose DropTableAsync has dropped the table but holds its `done`
// until the test releases it: the window between the store's drop and the
// service's secret bookkeeping after it.
class DropHeldStore : public ParameterStore {
 public:
  void InitTableAsync(const InitTableRequest& request, std::vector<TensorBuffer> values, InitTableResponse* response,
                      const CallOptions& options, StatusCallback done) override {
    store_.InitTableAsync(request, std::move(values), response, options, std::move(done));
  }
  void PullAsync(const PullRequest& request, PullResponse* response, std::vector<TensorBuffer>* values,
                 const CallOptions& options, StatusCallback done) override {
    store_.PullAsync(request, response, values, options, std::move(done));
  }
  void PushAsync(const PushRequest& request, std::vector<TensorBuffer> grads, PushResponse* response,
                 const CallOptions& options, StatusCallback done) override {
    store_.PushAsync(request, std::move(grads), response, options, std::move(done));
  }
  void PushPullAsync(const PushPullRequest& request, std::vector<TensorBuffer> grads, PushPullResponse* response,
                     std::vector<TensorBuffer>* values, const CallOptions& options, StatusCallback done) override {
    store_.PushPullAsync(request, std::move(grads), response, values, options, std::move(done));
  }
  void StatsAsync(const StatsRequest& request, StatsResponse* response, const CallOptions& options,
                  StatusCallback done) override {
    store_.StatsAsync(request, response, options, std::move(done));
  }
  void SaveTableAsync(const SaveTableRequest& request, SaveTableResponse* response, const CallOptions& options,
                      StatusCallback done) override {
    store_.SaveTableAsync(request, response, options, std::move(done));
  }
  void LoadTableAsync(const LoadTableRequest& request, LoadTableResponse* response, const CallOptions& options,
                      StatusCallback done) override {
    store_.LoadTableAsync(request, response, options, std::move(done));
  }
  void DropTableAsync(const DropTableRequest& request, DropTableResponse* response, const CallOptions& options,
                      StatusCallback done) override {
    store_.DropTableAsync(request, response, options, [this, done = std::move(done)](absl::Status s) mutable {
      held_status_ = s;
      held_done_ = std::move(done);
      dropped_.Notify();
    });
  }
  void SetWorkersAsync(const SetWorkersRequest& request, SetWorkersResponse* response, const CallOptions& options,
                       StatusCallback done) override {
    store_.SetWorkersAsync(request, response, options, std::move(done));
  }

  // Lets the held DropTableAsync's `done` run, on this thread (after dropped_).
  void ReleaseDrop() {
    held_done_(held_status_);
    held_done_ = nullptr;
  }
  absl::Notification dropped_;

  ShardStore store_{ShardStoreOptions{}};
  absl::Status held_status_;
  StatusCallback held_done_;
};

TEST(GrpcParameterServiceSecretTest, NextAttemptInitTableDuringADropKeepsItsSecret) {
  DropHeldStore store;
  GrpcParameterService service(&store);
  GrpcServerOptions so;
  so.address = "127.0.0.1:0";
  auto server = GrpcServer::Create(so, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  RemoteShardOptions ro;
  ro.target = (*server)->local_target();
  ro.default_timeout = absl::Seconds(20);
  GrpcRemoteShard client(ro);
  CallOptions member;
  member.job_secret = "the-jobs-secret";

  auto init = [&](uint64_t attempt) {
    InitTableRequest req;
    req.set_job("job");
    req.set_attempt(attempt);
    req.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
    req.mutable_config()->mutable_optimizer()->set_lr(1.0);
    req.mutable_config()->set_consistency(ASYNC);
    req.mutable_config()->set_num_workers(1);
    req.add_keys("k0");
    InitTableResponse resp;
    return WaitFor([&](StatusCallback done) { client.InitTableAsync(req, {Floats({attempt * 1.f})}, &resp, member, done); });
  };
  auto pull = [&](const CallOptions& options, std::vector<float>* out) {
    PullRequest req;
    req.set_job("job");
    req.set_attempt(2);
    req.add_keys("k0");
    PullResponse resp;
    std::vector<TensorBuffer> values;
    absl::Status s = WaitFor([&](StatusCallback done) { client.PullAsync(req, &resp, &values, options, done); });
    if (s.ok() && out != nullptr && !values.empty()) *out = ToFloats(values[0]);
    return s;
  };
  ASSERT_TRUE(init(1).ok());

  // Attempt 1 ends: its drop reaches the store and is held there, done.
  DropTableRequest drop;
  drop.set_job("job");
  drop.set_attempt(1);
  DropTableResponse drop_resp;
  std::promise<absl::Status> drop_status;
  client.DropTableAsync(drop, &drop_resp, member, [&](absl::Status s) { drop_status.set_value(s); });
  store.dropped_.WaitForNotification();
  // In the window, attempt 2 makes the job's table again.
  ASSERT_TRUE(init(2).ok());
  store.ReleaseDrop();
  ASSERT_TRUE(drop_status.get_future().get().ok());
  EXPECT_TRUE(drop_resp.dropped());

  // The new table still belongs to the job: refused without the secret,
  // served with it.
  absl::Status stranger = pull({}, nullptr);
  EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied) << stranger;
  CallOptions wrong;
  wrong.job_secret = "another-jobs-secret";
  EXPECT_EQ(pull(wrong, nullptr).code(), absl::StatusCode::kPermissionDenied);
  std::vector<float> value;
  absl::Status s = pull(member, &value);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(value, (std::vector<float>{2}));
  (*server)->Shutdown();
  store.store_.Shutdown();
}

}  // namespace
}  // namespace pstrain
