// A user, and the cluster, flooding the coordinator over real gRPC (TLS and
// tokens on 127.0.0.1, as deployed; issue 31, "Quotas and bounded
// threads"): submissions past the user's quota, watches past the per-user
// limit, long KvGet and GetAssignment waits past the global bound -- each
// refused RESOURCE_EXHAUSTED naming the limit and its flag, while another
// user's SubmitJob and ListJobs answer promptly and the server keeps
// serving. The server's threads are bounded (GrpcServerOptions::
// max_threads) above the waiting calls' bound, as pstrain-coordinator sets
// them.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "proto/control.grpc.pb.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_server.h"
#include "rpc/local_credentials.h"
#include "rpc/security.h"
#include "server/coordinator/grpc_coordinator_service.h"

namespace pstrain {
namespace {

const char kSpec[] = "name: t\nworkers: 1\nshards: 1\ndata: {format: synthetic}\n";
constexpr int kQueuedPerUser = 5;
constexpr int kWatchesPerUser = 3;
constexpr int kWaitingCalls = 12;
constexpr int kServerThreads = 40;

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

class CoordinatorFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = ::testing::TempDir() + "/coordinator-flood";
    LocalCredentialsOptions alice;
    alice.user = "alice";
    auto creds = WriteLocalCredentials(dir + "/creds", alice);
    ASSERT_TRUE(creds.ok()) << creds.status();
    creds_ = *creds;
    bob_token_file_ = dir + "/bob.token";
    const std::string bob = *RandomToken();
    ASSERT_TRUE(WriteFileAtomically(bob_token_file_, bob + "\n").ok());
    ASSERT_TRUE(
        WriteFileAtomically(creds_.token_auth_file, *ReadFile(creds_.token_auth_file) + bob + ",bob,4\n").ok());
    SecurityOptions server;
    server.tls_cert = creds_.cert;
    server.tls_key = creds_.key;
    server.tls_ca = creds_.ca;
    server.token_auth_file = creds_.token_auth_file;
    auto security = ServerSecurityFor(server);
    ASSERT_TRUE(security.ok()) << security.status();

    CoordinatorOptions co;
    co.background_tick = false;
    co.checkpoint_root = *CanonicalRoot(dir + "/root");
    co.max_queued_jobs_per_user = kQueuedPerUser;
    co.max_watches_per_user = kWatchesPerUser;
    co.max_waiting_calls = kWaitingCalls;
    auto store = JobStore::Open(":memory:");
    ASSERT_TRUE(store.ok());
    auto c = Coordinator::Create(co, std::move(*store));
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    jobs_ = std::make_unique<GrpcJobService>(coordinator_.get(), security->tokens);
    cluster_ = std::make_unique<GrpcClusterService>(coordinator_.get());
    GrpcServerOptions so;
    so.address = "127.0.0.1:0";
    so.security = *security;
    so.max_threads = kServerThreads;
    auto s = GrpcServer::Create(so, {jobs_.get(), cluster_.get()});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown();
    if (server_) server_->Shutdown();
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& token_file) {
    SecurityOptions o;
    o.tls_ca = creds_.ca;
    o.token_file = token_file;
    return CreateChannel(server_->local_target(), 4 << 20, o);
  }

  LocalCredentials creds_;
  std::string bob_token_file_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<GrpcJobService> jobs_;
  std::unique_ptr<GrpcClusterService> cluster_;
  std::unique_ptr<GrpcServer> server_;
};

grpc::Status Submit(JobService::Stub& stub, std::string* id = nullptr) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  SubmitJobRequest req;
  req.set_spec_yaml(kSpec);
  req.set_output_dir(::testing::TempDir() + "/coordinator-flood/root/out");
  SubmitJobResponse resp;
  grpc::Status s = stub.SubmitJob(&ctx, req, &resp);
  if (id != nullptr) *id = resp.job_id();
  return s;
}

void ExpectExhausted(const grpc::Status& s, const std::string& flag) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find(flag), std::string::npos) << s.error_message();
}

std::string Join(ClusterService::Stub& member, MemberRole role, const std::string& name) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  RegisterRequest req;
  req.set_role(role);
  req.set_name(name);
  if (role == MEMBER_ROLE_SHARD) req.set_address("127.0.0.1:1");
  RegisterResponse resp;
  EXPECT_TRUE(member.Register(&ctx, req, &resp).ok());
  return resp.member_id();
}

// A KvGet of a key nobody sets, waiting `wait_ms` for it.
grpc::Status GetUnsetKey(ClusterService::Stub& member, const std::string& worker, const std::string& job,
                         int wait_ms) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(30));
  KvGetRequest req;
  req.set_member_id(worker);
  req.set_job_id(job);
  req.set_attempt(1);
  req.set_key("never-set");
  req.set_wait_ms(wait_ms);
  KvGetResponse resp;
  return member.KvGet(&ctx, req, &resp);
}

// Submits 4 times the quota; returns the ids of the jobs accepted.
std::vector<std::string> SubmitPastTheQuota(JobService::Stub& user) {
  std::vector<std::string> ids;
  for (int i = 0; i < 4 * kQueuedPerUser; ++i) {
    std::string id;
    grpc::Status s = Submit(user, &id);
    if (s.ok()) {
      ids.push_back(id);
    } else {
      ExpectExhausted(s, "--max_queued_jobs_per_user");
    }
  }
  return ids;
}

// A watch of a job, and whether it is open: an open watch sends the job's
// status at once, a refused one ends with no message.
struct Watch {
  std::unique_ptr<grpc::ClientReader<JobStatus>> reader;
  bool open = false;
};

// Opens a watch of `job` by `user` on `ctx` (its deadline `deadline` from
// now) and reads the first status.
Watch OpenWatch(JobService::Stub& user, const std::string& job, grpc::ClientContext* ctx, absl::Duration deadline) {
  SetDeadline(ctx, deadline);
  WatchJobRequest req;
  req.set_job_id(job);
  Watch w;
  w.reader = user.WatchJob(ctx, req);
  JobStatus first;
  w.open = w.reader->Read(&first);
  return w;
}

// Watches of one job, each holding a server thread while it streams.
struct Watches {
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<JobStatus>>> readers;

  void Close(size_t i) {
    contexts[i]->TryCancel();
    (void)readers[i]->Finish();
  }
};

// Opens two watches more than the per-user limit: the first status arrives
// at once, so a watch that got one is open.
Watches WatchPastTheLimit(JobService::Stub& user, const std::string& job) {
  Watches w;
  for (int i = 0; i < kWatchesPerUser + 2; ++i) {
    w.contexts.push_back(std::make_unique<grpc::ClientContext>());
    Watch watch = OpenWatch(user, job, w.contexts.back().get(), absl::Seconds(60));
    w.readers.push_back(std::move(watch.reader));
    if (i < kWatchesPerUser) {
      EXPECT_TRUE(watch.open) << "watch " << i;
    } else {
      EXPECT_FALSE(watch.open) << "watch " << i;
      ExpectExhausted(w.readers.back()->Finish(), "--max_watches_per_user");
    }
  }
  return w;
}

// Long waits by the cluster, many at once: KvGets of a key nobody sets
// (by `worker`, on `job`) and GetAssignments of the idle worker `idle`,
// counted by how they end.
class WaitFlood {
 public:
  static constexpr int kCalls = 3 * kWaitingCalls;

  WaitFlood(ClusterService::Stub& member, const std::string& worker, const std::string& job,
            const std::string& idle) {
    for (int i = 0; i < kCalls; ++i) {
      threads_.emplace_back(
          [&, i] { Count(i % 2 == 0 ? GetUnsetKey(member, worker, job, 8000) : Await(member, idle)); });
    }
  }
  ~WaitFlood() { Join(); }

  void Join() {
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  std::atomic<int> waited{0}, exhausted{0}, other{0};

 private:
  static grpc::Status Await(ClusterService::Stub& member, const std::string& idle) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(30));
    GetAssignmentRequest req;
    req.set_member_id(idle);
    req.set_wait_ms(8000);
    Assignment resp;
    return member.GetAssignment(&ctx, req, &resp);
  }
  void Count(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        s.error_message().find("--max_waiting_calls") != std::string::npos) {
      ++exhausted;
    } else if (s.error_code() == grpc::StatusCode::NOT_FOUND || s.ok()) {
      ++waited;  // NOT_FOUND: the key is still missing at the deadline
    } else {
      ++other;
      ADD_FAILURE() << s.error_code() << ": " << s.error_message();
    }
  }

  std::vector<std::thread> threads_;
};

// Another user (bob) is served promptly while alice floods, and so is
// alice's own listing; bob's watch is refused by the global bound.
void ExpectOthersServed(JobService::Stub& alice, JobService::Stub& bob) {
  const absl::Time asked = absl::Now();
  std::string bob_job;
  EXPECT_TRUE(Submit(bob, &bob_job).ok());
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    ListJobsResponse resp;
    ASSERT_TRUE(bob.ListJobs(&ctx, ListJobsRequest(), &resp).ok());
    ASSERT_EQ(resp.jobs_size(), 1);
    EXPECT_EQ(resp.jobs(0).job_id(), bob_job);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    ListJobsResponse resp;
    ASSERT_TRUE(alice.ListJobs(&ctx, ListJobsRequest(), &resp).ok());
    EXPECT_EQ(resp.jobs_size(), kQueuedPerUser + 1);
  }
  EXPECT_LT(absl::Now() - asked, absl::Seconds(3));
  // Bob may watch his own job: the per-user limit is alice's.
  grpc::ClientContext ctx;
  Watch w = OpenWatch(bob, bob_job, &ctx, absl::Seconds(5));
  EXPECT_FALSE(w.open);  // the global bound is reached: refused too
  ExpectExhausted(w.reader->Finish(), "--max_waiting_calls");
}

// Tries for 10 s to open a watch of `job` (and closes it): OK once one is.
grpc::Status ReopenWatch(JobService::Stub& user, const std::string& job) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  grpc::Status reopened;
  do {
    grpc::ClientContext ctx;
    Watch w = OpenWatch(user, job, &ctx, absl::Seconds(5));
    if (w.open) {
      ctx.TryCancel();
      (void)w.reader->Finish();
      return grpc::Status::OK;
    }
    reopened = w.reader->Finish();
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < until);
  return reopened;
}

TEST_F(CoordinatorFloodTest, AUserAndTheClusterFloodingAreRefusedAndOthersAreServed) {
  auto alice = JobService::NewStub(Channel(creds_.user_token_file));
  auto bob = JobService::NewStub(Channel(bob_token_file_));
  auto member = ClusterService::NewStub(Channel(creds_.cluster_token_file));

  // A shard and a worker take alice's first job; another worker stays idle.
  Join(*member, MEMBER_ROLE_SHARD, "shard-0");
  const std::string worker = Join(*member, MEMBER_ROLE_WORKER, "worker-0");
  // The queued ones up to the quota (the first runs, so one more fits).
  const std::vector<std::string> ids = SubmitPastTheQuota(*alice);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kQueuedPerUser + 1));
  ASSERT_EQ(coordinator_->GetJob(ids[0])->state(), RUNNING);
  const std::string idle = Join(*member, MEMBER_ROLE_WORKER, "worker-1");
  Watches watches = WatchPastTheLimit(*alice, ids[1]);

  // As many waits as the global bound leaves (kWaitingCalls -
  // kWatchesPerUser) wait; the others are refused at once.
  constexpr int kWaiting = kWaitingCalls - kWatchesPerUser;
  WaitFlood flood(*member, worker, ids[0], idle);
  const absl::Time flood_start = absl::Now();
  while (flood.exhausted.load() < WaitFlood::kCalls - kWaiting && absl::Now() < flood_start + absl::Seconds(6)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(flood.exhausted.load(), WaitFlood::kCalls - kWaiting);
  EXPECT_EQ(flood.waited.load(), 0);  // the others are still waiting
  ExpectOthersServed(*alice, *bob);

  flood.Join();
  EXPECT_EQ(flood.waited.load(), kWaiting);
  EXPECT_EQ(flood.other.load(), 0);
  // The waits are over: their places are free again.
  EXPECT_EQ(GetUnsetKey(*member, worker, ids[0], 50).error_code(), grpc::StatusCode::NOT_FOUND);
  // Closing a watch gives alice's place back.
  watches.Close(0);
  grpc::Status reopened = ReopenWatch(*alice, ids[1]);
  EXPECT_TRUE(reopened.ok()) << reopened.error_message();
  for (size_t i = 1; i < static_cast<size_t>(kWatchesPerUser); ++i) watches.Close(i);
}

}  // namespace
}  // namespace pstrain
