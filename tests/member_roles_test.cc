// A member token is not a master key, over real gRPC with TLS on 127.0.0.1
// (security_testing.h): member tokens have one role each, and the shards'
// tables are the coordinator's to grant and manage.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/security_testing.h"

namespace pstrain {
namespace {

// The process's channels (GrpcRemoteShard's) send `token_file` until the
// fixture's TearDown.
void UseToken(const LocalCredentials& creds, const std::string& token_file) {
  SecurityOptions o;
  o.tls_ca = creds.ca;
  o.tls_cert = creds.cert;
  o.tls_key = creds.key;
  o.token_file = token_file;
  SetProcessSecurity(o);
}

InitTableRequest SmallTable(const std::string& job, uint64_t attempt) {
  InitTableRequest init;
  init.set_job(job);
  init.set_attempt(attempt);
  init.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  init.mutable_config()->mutable_optimizer()->set_lr(1);
  init.mutable_config()->set_consistency(ASYNC);
  init.mutable_config()->set_num_workers(1);
  return init;
}

absl::StatusCode Code(const std::function<void(StatusCallback)>& fn) { return WaitFor(fn).code(); }

CallOptions With(const std::string& secret, const std::string& grant) {
  CallOptions o;
  o.deadline = absl::Now() + absl::Seconds(20);
  o.job_secret = secret;
  o.table_grant = grant;
  return o;
}

// A member token is not the coordinator's: a worker (any pool worker: a
// compromised training process) cannot make a job's table on a shard
// without the coordinator's grant -- not for a job that does not exist
// yet (ids are sequential), not under a secret of its own choosing, not at
// an attempt above the coordinator's -- and the real job then gets its
// table with the grant its assignment carries.
TEST_F(SecurityTest, NoMemberMakesATableWithoutTheCoordinatorsGrant) {
  UseToken(creds_, creds_.worker_token_file);
  GrpcRemoteShard shard(RemoteShardOptions{s_.ps_server->local_target()});
  InitTableResponse made;
  auto init = [&](const InitTableRequest& req, const CallOptions& o) {
    return Code([&](StatusCallback d) { shard.InitTableAsync(req, {}, &made, o, std::move(d)); });
  };
  const std::string mine = *RandomToken();
  const InitTableRequest future = SmallTable("job-000001", 1);
  EXPECT_EQ(init(future, With(mine, "")), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(init(future, With(mine, std::string(64, '0'))), absl::StatusCode::kPermissionDenied);
  // A grant is for one job, attempt and secret; a key of its own signs
  // nothing the shard accepts.
  EXPECT_EQ(init(future, With(mine, TableGrantSigner::Generate()->Sign("job-000001", 1, mine))),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(init(SmallTable("job-000001", UINT64_MAX), With(mine, s_.grant_signer->Sign("job-000001", 1, mine))),
            absl::StatusCode::kPermissionDenied);
  // LoadTable, too, is the coordinator's (and needs its grant).
  LoadTableRequest load;
  load.set_job("job-000001");
  load.set_attempt(1);
  LoadTableResponse loaded;
  EXPECT_EQ(Code([&](StatusCallback d) { shard.LoadTableAsync(load, &loaded, With(mine, ""), std::move(d)); }),
            absl::StatusCode::kPermissionDenied);

  // The real job: submitted, scheduled onto a shard and a worker; the
  // worker's assignment carries the grant, and with it the table is made.
  SubmitJobRequest submit;
  submit.set_spec_yaml("workers: 1\nshards: 1\n");
  submit.set_output_dir(dir_ + "/coordinator-root/out");
  auto id = s_.coordinator->SubmitJob(submit);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(*id, "job-000001");
  RegisterRequest shard_member;
  shard_member.set_role(MEMBER_ROLE_SHARD);
  shard_member.set_name("shard-0");
  shard_member.set_address(s_.ps_server->local_target());
  ASSERT_TRUE(s_.coordinator->Register(shard_member).ok());
  RegisterRequest worker_member;
  worker_member.set_role(MEMBER_ROLE_WORKER);
  worker_member.set_name("worker-0");
  auto worker = s_.coordinator->Register(worker_member);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto a = s_.coordinator->GetAssignment(worker->member_id(), absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->job_id(), *id);
  ASSERT_EQ(a->table_grant().size(), 128u);
  // The grant with another secret (the squatter's) is still refused.
  EXPECT_EQ(init(SmallTable(*id, a->attempt()), With(mine, a->table_grant())), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(init(SmallTable(*id, a->attempt() + 1), With(a->job_secret(), a->table_grant())),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(init(SmallTable(*id, a->attempt()), With(a->job_secret(), a->table_grant())), absl::StatusCode::kOk);
}

// The shards' management calls are the coordinator's: a worker token can
// neither drop, save, load nor re-seat a job's table, nor list every
// table; a save never leaves the job's own directory.
TEST_F(SecurityTest, TheShardsManagementCallsAreTheCoordinators) {
  const std::string secret = *RandomToken();
  const CallOptions granted = With(secret, s_.grant_signer->Sign("job-c", 1, secret));
  SaveTableRequest save;
  save.set_job("job-c");
  save.set_attempt(1);
  save.set_path("out/job-c/ckpt-1.tmp/shard-0.bin");
  SaveTableResponse saved;
  DropTableRequest drop;
  drop.set_job("job-c");
  drop.set_attempt(1);
  DropTableResponse dropped;
  SetWorkersRequest workers;
  workers.set_job("job-c");
  workers.set_attempt(1);
  SetWorkersResponse set;
  StatsRequest all;
  StatsResponse stats;
  LoadTableRequest load;
  load.set_job("job-c");
  load.set_attempt(1);
  LoadTableResponse loaded;
  {
    UseToken(creds_, creds_.worker_token_file);
    GrpcRemoteShard shard(RemoteShardOptions{s_.ps_server->local_target()});
    InitTableResponse made;
    ASSERT_EQ(Code([&](StatusCallback d) { shard.InitTableAsync(SmallTable("job-c", 1), {}, &made, granted, std::move(d)); }),
              absl::StatusCode::kOk);
    for (const auto& [what, fn] : std::vector<std::pair<std::string, std::function<void(StatusCallback)>>>{
             {"SaveTable", [&](StatusCallback d) { shard.SaveTableAsync(save, &saved, granted, std::move(d)); }},
             {"DropTable", [&](StatusCallback d) { shard.DropTableAsync(drop, &dropped, granted, std::move(d)); }},
             {"SetWorkers", [&](StatusCallback d) { shard.SetWorkersAsync(workers, &set, granted, std::move(d)); }},
             {"LoadTable", [&](StatusCallback d) { shard.LoadTableAsync(load, &loaded, granted, std::move(d)); }},
             {"Stats", [&](StatusCallback d) { shard.StatsAsync(all, &stats, granted, std::move(d)); }}}) {
      SCOPED_TRACE(what);
      absl::Status s = WaitFor(fn);
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
      EXPECT_NE(s.message().find("pstrain:coordinator"), std::string::npos) << s;
    }
    // Its own job's stats, with the secret: served (one table, not all).
    StatsRequest own;
    own.set_job("job-c");
    ASSERT_TRUE(WaitFor([&](StatusCallback d) { shard.StatsAsync(own, &stats, granted, std::move(d)); }).ok());
    EXPECT_EQ(stats.tables_size(), 1);
  }
  UseToken(creds_, creds_.coordinator_token_file);
  GrpcRemoteShard shard(RemoteShardOptions{s_.ps_server->local_target()});
  // Not into another job's directory, even for the coordinator's token.
  for (const std::string& elsewhere : {"out/job-d/ckpt-1.tmp/shard-0.bin", "job-c.bin", "out/job-cc/shard-0.bin"}) {
    save.set_path(elsewhere);
    absl::Status s = WaitFor([&](StatusCallback d) { shard.SaveTableAsync(save, &saved, granted, std::move(d)); });
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << elsewhere << ": " << s;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/shard-root/out/job-d"));
  save.set_path("out/job-c/ckpt-1.tmp/shard-0.bin");
  EXPECT_TRUE(WaitFor([&](StatusCallback d) { shard.SaveTableAsync(save, &saved, granted, std::move(d)); }).ok());
  ASSERT_TRUE(WaitFor([&](StatusCallback d) { shard.StatsAsync(all, &stats, granted, std::move(d)); }).ok());
  EXPECT_EQ(stats.tables_size(), 1);
  EXPECT_TRUE(WaitFor([&](StatusCallback d) { shard.DropTableAsync(drop, &dropped, granted, std::move(d)); }).ok());
  EXPECT_TRUE(dropped.dropped());
}

// A member's role is its token's: a worker token cannot register a shard
// (and be sent a job's parameters and secret), nor a shard token a worker.
TEST_F(SecurityTest, AMemberTokenRegistersOnlyItsOwnRole) {
  const std::string target = s_.coordinator_server->local_target();
  int n = 0;
  auto register_as = [&](const std::string& token_file, MemberRole role) {
    auto stub = ClusterService::NewStub(CreateChannel(target, 1 << 20, Client(token_file)));
    RegisterRequest r;
    r.set_role(role);
    r.set_name(absl::StrCat("!member-", n++));
    r.set_address("127.0.0.1:1");
    RegisterResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub->Register(&ctx, r, &resp);
    ExpectNoToken(s);
    return s;
  };
  grpc::Status s = register_as(creds_.worker_token_file, MEMBER_ROLE_SHARD);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("pstrain:shard"), std::string::npos) << s.error_message();
  EXPECT_EQ(register_as(creds_.shard_token_file, MEMBER_ROLE_WORKER).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(register_as(creds_.shard_token_file, MEMBER_ROLE_SHARD).error_code(), grpc::StatusCode::OK);
  EXPECT_EQ(register_as(creds_.worker_token_file, MEMBER_ROLE_WORKER).error_code(), grpc::StatusCode::OK);
  // The any-member cluster token (one machine, upgrades) may be either.
  EXPECT_EQ(register_as(creds_.cluster_token_file, MEMBER_ROLE_SHARD).error_code(), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace pstrain
