// Two pstrain-ps processes on loopback and clients that push and pull a
// model-sized set of tensors split by the partition plan, checked against
// torch::optim on the same gradients. Plus failure: a SIGKILLed shard gives
// a clean UNAVAILABLE, not a hang; SIGTERM drains and exits 0.
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/optim/sgd.h>

#include <fstream>
#include <future>
#include <thread>

#include "common/file_util.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/table_grant.h"
#include "tests/child_process.h"
#include "tests/raw_call.h"
#include "worker/ps_client.h"

namespace pstrain {
namespace {

const std::vector<std::vector<int64_t>> kShapes = {
    {6, 1, 5, 5}, {6}, {16, 6, 5, 5}, {16}, {120, 400}, {120}, {84, 120}, {84}, {10, 84}, {10},
    {1000, 1000}, {4096}};

class ShardCluster {
 public:
  // `flags`: more for every shard.
  explicit ShardCluster(int num_shards, const std::vector<std::string>& flags = {}) {
    dir_ = MakeTempDir("shards");
    for (int i = 0; i < num_shards; ++i) {
      const std::string port_file = dir_ + "/shard" + std::to_string(i) + ".addr";
      std::vector<std::string> argv = {"server/ps/pstrain-ps", "--host=127.0.0.1", "--port=0",
                                       "--port_file=" + port_file, "--shard_index=" + std::to_string(i),
                                       "--num_shards=" + std::to_string(num_shards)};
      argv.insert(argv.end(), flags.begin(), flags.end());
      auto child = ChildProcess::Start(argv, dir_ + "/shard" + std::to_string(i) + ".log");
      EXPECT_TRUE(child.ok());
      children_.push_back(std::move(*child));
      auto addr = WaitForAddressFile(port_file, absl::Seconds(30));
      EXPECT_TRUE(addr.ok()) << addr.status();
      RemoteShardOptions ro;
      ro.target = addr.ok() ? *addr : "127.0.0.1:1";
      addresses_.push_back(ro.target);
      ro.default_timeout = absl::Seconds(30);
      ro.max_attempts = 4;
      ro.initial_backoff = absl::Milliseconds(20);
      remotes_.push_back(std::make_unique<GrpcRemoteShard>(ro));
    }
  }
  std::vector<ParameterStore*> stores() {
    std::vector<ParameterStore*> out;
    for (auto& r : remotes_) out.push_back(r.get());
    return out;
  }
  ChildProcess& child(int i) { return *children_[i]; }
  const std::string& address(int i) const { return addresses_[i]; }
  std::string log_path(int i) const { return dir_ + "/shard" + std::to_string(i) + ".log"; }
  GrpcRemoteShard& remote(int i) { return *remotes_[i]; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<GrpcRemoteShard>> remotes_;
};

PartitionPlan Plan(int shards) {
  std::vector<ParameterSpec> specs;
  for (size_t i = 0; i < kShapes.size(); ++i) specs.push_back({"p" + std::to_string(i), kShapes[i], DT_FLOAT32});
  auto plan = MakePartitionPlan(specs, shards, 256 << 10);  // small chunks: big tensors span shards
  EXPECT_TRUE(plan.ok());
  return *plan;
}

std::vector<at::Tensor> RandomParams(uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (const auto& s : kShapes) out.push_back(at::randn(s));
  return out;
}

TableConfig SgdConfig(Consistency consistency, uint32_t workers) {
  TableConfig c;
  c.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  c.mutable_optimizer()->set_lr(0.05);
  c.mutable_optimizer()->set_momentum(0.9);
  c.mutable_optimizer()->set_weight_decay(1e-4);
  c.set_consistency(consistency);
  c.set_num_workers(workers);
  return c;
}

// torch::optim::SGD, set as SgdConfig sets the tables, over its own copy of
// RandomParams(seed): what the shards should hold after the same gradients.
class ReferenceSgd {
 public:
  explicit ReferenceSgd(uint64_t seed) : params_(RandomParams(seed)) {
    for (auto& p : params_) p.set_requires_grad(true);
    opt_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  }
  // One optimizer step with `grads`, one per parameter.
  void Step(const std::vector<at::Tensor>& grads) {
    for (size_t i = 0; i < grads.size(); ++i) params_[i].mutable_grad() = grads[i];
    opt_->step();
  }
  const std::vector<at::Tensor>& params() const { return params_; }

 private:
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::SGD> opt_;
};

void ExpectClose(const std::vector<at::Tensor>& ours, const std::vector<at::Tensor>& ref) {
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(at::allclose(ours[i], ref[i].detach(), 1e-5, 1e-6))
        << "parameter " << i << " differs by " << (ours[i] - ref[i].detach()).abs().max().item<float>();
  }
}

TEST(MultiProcessPsTest, AsyncTrainingMatchesTorchOptimAcrossTwoShardProcesses) {
  ShardCluster cluster(2);
  PsClientOptions o;
  o.job = "async";
  o.plan = Plan(2);
  ASSERT_GT(o.plan.chunks.size(), kShapes.size());  // some parameters were split
  auto client = PsClient::Create(o, cluster.stores());
  ASSERT_TRUE(client.ok());
  std::vector<at::Tensor> params = RandomParams(1);
  ReferenceSgd ref(1);
  ASSERT_TRUE((*client)->InitTables(params, SgdConfig(ASYNC, 1)).ok());
  for (auto& p : params) p.zero_();
  ASSERT_TRUE((*client)->Pull(params).ok());
  ExpectClose(params, ref.params());
  for (int step = 0; step < 8; ++step) {
    std::vector<at::Tensor> grads;
    for (const auto& s : kShapes) grads.push_back(at::randn(s));
    absl::Status st = step % 2 == 0 ? (*client)->PushPull(step, grads, params)
                                    : (*client)->Push(step, grads);
    ASSERT_TRUE(st.ok()) << st;
    if (step % 2 == 1) {
      ASSERT_TRUE((*client)->Pull(params).ok());
    }
    ref.Step(grads);
  }
  ExpectClose(params, ref.params());
}

// The training path's asynchronous push-pull of a whole bucket, cut into
// requests of at most one chunk each (max_request_bytes below the chunk
// size): the values are the reference optimizer's, and each shard served
// several requests per step.
TEST(MultiProcessPsTest, BucketPushPullInSmallRequestsMatchesTorchOptim) {
  ShardCluster cluster(2);
  PsClientOptions o;
  o.job = "parts";
  o.plan = Plan(2);
  o.max_request_bytes = 1;  // every chunk its own request
  auto client = PsClient::Create(o, cluster.stores());
  ASSERT_TRUE(client.ok());
  std::vector<at::Tensor> params = RandomParams(1);
  ReferenceSgd ref(1);
  ASSERT_TRUE((*client)->InitTables(params, SgdConfig(ASYNC, 1)).ok());
  std::vector<size_t> all(kShapes.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  auto pulls = [&] {
    uint64_t n = 0;
    for (ParameterStore* shard : cluster.stores()) {
      StatsRequest req;
      req.set_job("parts");
      StatsResponse resp;
      std::promise<absl::Status> done;
      shard->StatsAsync(req, &resp, CallOptions{}, [&](absl::Status st) { done.set_value(st); });
      EXPECT_TRUE(done.get_future().get().ok());
      for (const auto& t : resp.tables()) n += t.pulls();
    }
    return n;
  };
  const uint64_t before = pulls();
  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> grads;
    for (const auto& shape : kShapes) grads.push_back(at::randn(shape));
    std::promise<absl::Status> done;
    (*client)->PushPullAsync(step, all, grads, params, 0, [&](absl::Status st) { done.set_value(st); });
    absl::Status st = done.get_future().get();
    ASSERT_TRUE(st.ok()) << st;
    ref.Step(grads);
  }
  ExpectClose(params, ref.params());
  EXPECT_EQ(pulls() - before, steps * o.plan.chunks.size());  // one request per chunk
}

TEST(MultiProcessPsTest, SyncWithTwoWorkersAppliesTheMeanGradientOncePerStep) {
  ShardCluster cluster(2);
  std::vector<std::unique_ptr<PsClient>> clients;
  for (uint32_t w = 0; w < 2; ++w) {
    PsClientOptions o;
    o.job = "sync";
    o.worker = w;
    o.plan = Plan(2);
    o.timeout = absl::Seconds(30);
    clients.push_back(std::move(*PsClient::Create(o, cluster.stores())));
  }
  std::vector<std::vector<at::Tensor>> params = {RandomParams(2), RandomParams(2)};
  ReferenceSgd ref(2);
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(clients[w]->InitTables(params[w], SgdConfig(SYNC, 2)).ok());
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<at::Tensor>> grads(2);
    for (int w = 0; w < 2; ++w) {
      for (const auto& s : kShapes) grads[w].push_back(at::randn(s));
    }
    std::vector<absl::Status> status(2);
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] { status[w] = clients[w]->PushPull(step, grads[w], params[w]); });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    std::vector<at::Tensor> mean;
    for (size_t i = 0; i < kShapes.size(); ++i) mean.push_back((grads[0][i] + grads[1][i]) / 2);
    ref.Step(mean);
    ExpectClose(params[0], ref.params());
    ExpectClose(params[1], ref.params());
  }
}

// A real shard process with the coordinator's public key: a member that
// reaches it (a worker process, its own secret) cannot make a table for a
// job -- one not yet started, or at an attempt above the coordinator's --
// without the coordinator's grant; with it, the job's table is made.
TEST(MultiProcessPsTest, ASquatterCannotMakeATableOnARealShardWithoutTheCoordinatorsGrant) {
  const auto coordinator = TableGrantSigner::Generate();
  const std::string pub = MakeTempDir("grant") + "/table-grant.pub";
  ASSERT_TRUE(WriteFileAtomically(pub, coordinator->PublicKeyPem()).ok());
  ShardCluster cluster(1, {"--table_grant_public_key_file=" + pub});
  const std::vector<at::Tensor> params = RandomParams(5);
  auto init = [&](uint64_t attempt, const std::string& secret, const std::string& grant) {
    PsClientOptions o;
    o.job = "job-000002";
    o.attempt = attempt;
    o.job_secret = secret;
    o.table_grant = grant;
    o.plan = Plan(1);
    o.timeout = absl::Seconds(20);
    auto client = PsClient::Create(o, cluster.stores());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? (*client)->InitTables(params, SgdConfig(ASYNC, 1)) : client.status();
  };
  const std::string secret = "the-jobs-secret-0123456789abcdef", mine = "the-squatters-0123456789abcdef";
  for (const auto& [attempt, grant] : std::vector<std::pair<uint64_t, std::string>>{
           {1, ""},                                                             // none
           {1, TableGrantSigner::Generate()->Sign("job-000002", 1, mine)},      // its own key
           {1, coordinator->Sign("job-000002", 1, secret)},                    // another secret's
           {UINT64_MAX, coordinator->Sign("job-000002", 1, mine)}}) {          // another attempt's
    absl::Status s = init(attempt, mine, grant);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  const absl::Status made = init(1, secret, coordinator->Sign("job-000002", 1, secret));
  EXPECT_TRUE(made.ok()) << made;
  EXPECT_EQ(cluster.child(0).Wait(absl::Milliseconds(1)), -1) << "the shard is still serving";
}

TEST(MultiProcessPsTest, KilledShardGivesUnavailableQuicklyNotAHang) {
  ShardCluster cluster(2);
  PsClientOptions o;
  o.job = "kill";
  o.plan = Plan(2);
  o.timeout = absl::Seconds(20);
  auto client = PsClient::Create(o, cluster.stores());
  std::vector<at::Tensor> params = RandomParams(3);
  ASSERT_TRUE((*client)->InitTables(params, SgdConfig(ASYNC, 1)).ok());
  cluster.child(1).Signal(SIGKILL);
  EXPECT_EQ(cluster.child(1).Wait(), 128 + SIGKILL);
  std::vector<at::Tensor> grads;
  for (const auto& s : kShapes) grads.push_back(at::zeros(s));
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->Push(0, grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("shard 1"), absl::string_view::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "gave up only after retries ran long";
  // The surviving shard still serves.
  StatsResponse stats;
  ASSERT_TRUE(WaitFor([&](StatusCallback done) { cluster.remote(0).StatsAsync({}, &stats, {}, done); }).ok());
  EXPECT_EQ(stats.tables(0).job(), "kill");
}

TEST(MultiProcessPsTest, SigtermDrainsWaitingCallsAndExitsZero) {
  ShardCluster cluster(1);
  PsClientOptions o;
  o.job = "drain";
  o.plan = Plan(1);
  auto client = PsClient::Create(o, cluster.stores());
  std::vector<at::Tensor> params = RandomParams(4);
  ASSERT_TRUE((*client)->InitTables(params, SgdConfig(ASYNC, 1)).ok());
  absl::Status waiting;
  std::thread t([&] { waiting = (*client)->Pull(params, /*min_version=*/100); });
  absl::SleepFor(absl::Milliseconds(300));
  cluster.child(0).Signal(SIGTERM);
  EXPECT_EQ(cluster.child(0).Wait(), 0);
  t.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable) << waiting;
}

// Bytes any client can send -- a request whose string field is not UTF-8,
// which protobuf logs a line about on every parse -- are refused, request
// after request, and the shard's log keeps a bounded few lines about them
// (LimitProtobufLogs), not one per request.
TEST(MultiProcessPsTest, AFloodOfNonUtf8RequestsIsRefusedWithoutFloodingTheLog) {
  ShardCluster cluster(1);
  const std::string not_utf8("\x0a\x02\xff\xfe", 4);  // field 1 (job): two bytes that are not UTF-8
  for (int i = 0; i < 200; ++i) {
    const char* method = i % 2 == 0 ? "/pstrain.ParameterService/PushPull" : "/pstrain.ParameterService/Pull";
    grpc::Status s = RawCall(cluster.address(0), method, not_utf8);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i << ": " << s.error_message();
  }
  StatsResponse stats;
  ASSERT_TRUE(WaitFor([&](StatusCallback done) { cluster.remote(0).StatsAsync({}, &stats, {}, done); }).ok());
  std::ifstream log(cluster.log_path(0));
  int protobuf_lines = 0, lines = 0;
  for (std::string line; std::getline(log, line); ++lines) {
    if (line.find("protobuf") != std::string::npos) ++protobuf_lines;
  }
  EXPECT_GE(protobuf_lines, 1) << "the first of them is logged";
  EXPECT_LE(protobuf_lines, 10) << "one line per hostile request";
  EXPECT_LE(lines, 20);
}

}  // namespace
}  // namespace pstrain
