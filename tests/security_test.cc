// Who may call what, over real gRPC with TLS on 127.0.0.1 (in-process
// coordinator and shard servers secured as deployments are):
//   - every RPC of every service refuses a call without a token, with a
//     token the server does not know (UNAUTHENTICATED), and with a token of
//     the wrong role (PERMISSION_DENIED), and lets the right role through --
//     enumerated from the services' descriptors, so a new RPC cannot be
//     added unprotected; health stays open for probes;
//   - a user sees and changes only their own jobs, an admin every job;
//   - the transport: plaintext to a TLS server, a client that does not
//     trust the CA, a wrong server name, and (mutual TLS) a client without a
//     certificate all fail;
//   - no token appears in any error message or log line.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <thread>

#include "tests/security_testing.h"

namespace pstrain {
namespace {

TEST_F(SecurityTest, EveryRpcOfEveryServiceChecksTheTokenAndItsRole) {
  struct Service {
    const char* name;
    std::string target;
    std::vector<std::string> allowed;  // token files of the roles it takes
    std::vector<std::string> refused;  // token files of roles it refuses
  };
  const std::string coordinator = s_.coordinator_server->local_target();
  const std::vector<Service> services = {
      {"pstrain.JobService",
       coordinator,
       {creds_.user_token_file, creds_.admin_token_file},
       {creds_.cluster_token_file, creds_.shard_token_file, creds_.worker_token_file, creds_.coordinator_token_file}},
      {"pstrain.ClusterService",
       coordinator,
       {creds_.cluster_token_file, creds_.shard_token_file, creds_.worker_token_file},
       {creds_.user_token_file, creds_.admin_token_file, creds_.coordinator_token_file}},
      {"pstrain.ParameterService",
       s_.ps_server->local_target(),
       {creds_.cluster_token_file, creds_.worker_token_file, creds_.coordinator_token_file},
       {creds_.user_token_file, creds_.admin_token_file, creds_.shard_token_file}},
      {"pstrain.EmbeddingService",
       s_.ps_server->local_target(),
       {creds_.cluster_token_file, creds_.worker_token_file, creds_.coordinator_token_file},
       {creds_.user_token_file, creds_.admin_token_file, creds_.shard_token_file}},
  };
  int methods = 0;
  for (const Service& service : services) {
    const google::protobuf::ServiceDescriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service.name);
    ASSERT_NE(d, nullptr) << service.name;
    for (int i = 0; i < d->method_count(); ++i, ++methods) {
      const std::string method = absl::StrCat("/", service.name, "/", d->method(i)->name());
      SCOPED_TRACE(method);
      // A primary shard's forward to its backups (of chunks, or of
      // embedding rows): shards only, so that no worker can write a backup.
      const bool replicate = method == "/pstrain.ParameterService/Replicate" ||
                             method == "/pstrain.EmbeddingService/ReplicateEmbeddings";
      const std::vector<std::string>& allowed =
          replicate ? std::vector<std::string>{creds_.cluster_token_file, creds_.shard_token_file} : service.allowed;
      const std::vector<std::string>& refused =
          replicate ? std::vector<std::string>{creds_.user_token_file, creds_.admin_token_file,
                                               creds_.worker_token_file, creds_.coordinator_token_file}
                    : service.refused;
      for (const std::string& no : {std::string(), stranger_token_file_}) {
        grpc::Status s = RawCall(service.target, method, "", Client(no));
        EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
        EXPECT_FALSE(s.error_message().empty());
        ExpectNoToken(s);
      }
      for (const std::string& wrong : refused) {
        grpc::Status s = RawCall(service.target, method, "", Client(wrong));
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << wrong << ": " << s.error_message();
        EXPECT_NE(s.error_message().find("may not call"), std::string::npos) << s.error_message();
        ExpectNoToken(s);
      }
      for (const std::string& right : allowed) {
        // Past the check: the handler answers the empty request itself.
        grpc::Status s = RawCall(service.target, method, "", Client(right));
        EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << right << ": " << s.error_message();
        EXPECT_EQ(s.error_message().find("may not call"), std::string::npos) << right << ": " << s.error_message();
        ExpectNoToken(s);
      }
    }
  }
  EXPECT_GE(methods, 24);
  // Reflection takes any valid token; health none (probes).
  const std::string reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  EXPECT_EQ(RawCall(coordinator, reflection, "", Client("")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const std::string health_request;
  EXPECT_TRUE(RawCall(coordinator, "/grpc.health.v1.Health/Check", health_request, Client("")).ok());
  EXPECT_TRUE(RawCall(s_.ps_server->local_target(), "/grpc.health.v1.Health/Check", "", Client("")).ok());
}

TEST_F(SecurityTest, HealthIsServedInPlaintextOnTheHealthPortAndNothingElse) {
  const std::string health = absl::StrCat("127.0.0.1:", s_.coordinator_server->health_port());
  auto status = CheckHealth(health, "", absl::Seconds(10));
  // CheckHealth uses this process's security (TLS): the health port is plain.
  EXPECT_FALSE(status.ok());
  grpc::Status plain = RawCall(health, "/grpc.health.v1.Health/Check", "", SecurityOptions{});
  EXPECT_TRUE(plain.ok()) << plain.error_message();
  grpc::Status jobs = RawCall(health, "/pstrain.JobService/ListJobs", "", SecurityOptions{});
  EXPECT_EQ(jobs.error_code(), grpc::StatusCode::UNIMPLEMENTED) << jobs.error_message();
}

std::unique_ptr<JobService::Stub> JobStub(const std::string& target, const SecurityOptions& security) {
  return JobService::NewStub(CreateChannel(target, 1 << 20, security));
}

TEST_F(SecurityTest, UsersSeeAndChangeOnlyTheirOwnJobs) {
  const std::string target = s_.coordinator_server->local_target();
  auto alice = JobStub(target, Client(creds_.user_token_file));
  auto bob = JobStub(target, Client(bob_token_file_));
  auto admin = JobStub(target, Client(creds_.admin_token_file));

  SubmitJobRequest submit;
  submit.set_spec_yaml("workers: 1\n");
  submit.set_output_dir(dir_ + "/coordinator-root/out");
  SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    grpc::Status s = alice->SubmitJob(&ctx, submit, &submitted);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string id = submitted.job_id();
  auto call_as = [&](JobService::Stub& stub, const std::string& what) -> grpc::Status {
    grpc::ClientContext ctx;
    if (what == "get") {
      GetJobRequest r;
      r.set_job_id(id);
      JobStatus st;
      return stub.GetJob(&ctx, r, &st);
    }
    if (what == "checkpoint") {
      CheckpointRequest r;
      r.set_job_id(id);
      CheckpointResponse resp;
      return stub.Checkpoint(&ctx, r, &resp);
    }
    if (what == "scale") {
      ScaleJobRequest r;
      r.set_job_id(id);
      r.set_workers(1);
      JobStatus st;
      return stub.ScaleJob(&ctx, r, &st);
    }
    if (what == "watch") {
      WatchJobRequest r;
      r.set_job_id(id);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      auto reader = stub.WatchJob(&ctx, r);
      JobStatus st;
      while (reader->Read(&st)) {
      }
      return reader->Finish();
    }
    CancelJobRequest r;
    r.set_job_id(id);
    CancelJobResponse resp;
    return stub.CancelJob(&ctx, r, &resp);
  };
  for (const char* what : {"get", "watch", "checkpoint", "scale", "cancel"}) {
    grpc::Status s = call_as(*bob, what);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << what << ": " << s.error_message();
  }
  auto list = [&](JobService::Stub& stub) {
    grpc::ClientContext ctx;
    ListJobsResponse resp;
    EXPECT_TRUE(stub.ListJobs(&ctx, ListJobsRequest(), &resp).ok());
    return resp.jobs_size();
  };
  EXPECT_EQ(list(*bob), 0);
  EXPECT_EQ(list(*alice), 1);
  EXPECT_EQ(list(*admin), 1);
  {
    grpc::ClientContext ctx;
    GetJobRequest r;
    r.set_job_id(id);
    JobStatus st;
    ASSERT_TRUE(alice->GetJob(&ctx, r, &st).ok());
    EXPECT_EQ(st.owner(), "alice");
  }
  // Bob's job is his; the admin cancels Alice's.
  {
    grpc::ClientContext ctx;
    SubmitJobResponse r;
    ASSERT_TRUE(bob->SubmitJob(&ctx, submit, &r).ok());
  }
  EXPECT_EQ(list(*bob), 1);
  EXPECT_EQ(list(*admin), 2);
  EXPECT_TRUE(call_as(*admin, "cancel").ok());
  EXPECT_EQ(call_as(*alice, "get").error_code(), grpc::StatusCode::OK);
}

TEST_F(SecurityTest, TheTransportRefusesPlaintextStrangersAndWrongNames) {
  const std::string target = s_.coordinator_server->local_target();
  const std::string method = "/pstrain.JobService/ListJobs";
  // The right client, for contrast.
  EXPECT_TRUE(RawCall(target, method, "", Client(creds_.user_token_file)).ok());
  // Plaintext to a TLS server.
  EXPECT_EQ(RawCall(target, method, "", SecurityOptions{}).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client trusting another CA.
  auto other = WriteLocalCredentials(dir_ + "/other-ca");
  ASSERT_TRUE(other.ok()) << other.status();
  SecurityOptions stranger = Client(creds_.user_token_file);
  stranger.tls_ca = other->ca;
  EXPECT_EQ(RawCall(target, method, "", stranger).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A name the server's certificate does not carry.
  SecurityOptions misnamed = Client(creds_.user_token_file);
  misnamed.tls_server_name = "pstrain.example.com";
  EXPECT_EQ(RawCall(target, method, "", misnamed).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsRefusesAClientWithoutACertificate) {
  SecurityOptions server;
  server.tls_cert = creds_.cert;
  server.tls_key = creds_.key;
  server.tls_ca = creds_.ca;
  server.tls_client_auth = ClientAuth::kRequire;
  server.token_auth_file = creds_.token_auth_file;
  auto security = ServerSecurityFor(server);
  ASSERT_TRUE(security.ok()) << security.status();
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.security = *security;
  GrpcJobService jobs(s_.coordinator.get(), security->tokens);
  auto s = GrpcServer::Create(options, {&jobs});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string target = (*s)->local_target();
  const std::string method = "/pstrain.JobService/ListJobs";
  EXPECT_EQ(RawCall(target, method, "", Client(creds_.user_token_file)).error_code(), grpc::StatusCode::UNAVAILABLE);
  SecurityOptions with_cert = Client(creds_.user_token_file);
  with_cert.tls_cert = creds_.cert;
  with_cert.tls_key = creds_.key;
  grpc::Status ok = RawCall(target, method, "", with_cert);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  // A certificate from another CA is no better than none.
  auto other = WriteLocalCredentials(dir_ + "/other-client");
  ASSERT_TRUE(other.ok());
  SecurityOptions foreign = with_cert;
  foreign.tls_cert = other->cert;
  foreign.tls_key = other->key;
  EXPECT_EQ(RawCall(target, method, "", foreign).error_code(), grpc::StatusCode::UNAVAILABLE);
  (*s)->Shutdown();
}

// Job A's worker holds the cluster token too: the job secret is what keeps
// it off job B's table.
TEST_F(SecurityTest, AJobsTableServesOnlyCallersWithItsSecret) {
  RemoteShardOptions ro;
  ro.target = s_.ps_server->local_target();
  GrpcRemoteShard shard(ro);
  // Each call as a holder of `secret` the coordinator vouched for (its
  // grant): what stops the wrong one here is the secret check.
  auto call = [&](const std::string& secret, auto fn) {
    CallOptions opts;
    opts.deadline = absl::Now() + absl::Seconds(20);
    opts.job_secret = secret;
    opts.table_grant = s_.grant_signer->Sign("job-b", 1, secret);
    return WaitFor([&](StatusCallback done) { fn(opts, std::move(done)); });
  };
  InitTableRequest init;
  init.set_job("job-b");
  init.set_attempt(1);
  init.mutable_config()->mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  init.mutable_config()->mutable_optimizer()->set_lr(1);
  init.mutable_config()->set_consistency(ASYNC);
  init.mutable_config()->set_num_workers(1);
  InitTableResponse init_resp;
  const std::string b_secret = *RandomToken(), a_secret = *RandomToken();
  ASSERT_TRUE(call(b_secret, [&](const CallOptions& o, StatusCallback d) {
                shard.InitTableAsync(init, {}, &init_resp, o, std::move(d));
              }).ok());
  PullRequest pull;
  pull.set_job("job-b");
  pull.set_attempt(1);
  PullResponse pulled;
  std::vector<TensorBuffer> values;
  PushRequest push;
  push.set_job("job-b");
  push.set_attempt(1);
  PushResponse pushed;
  SaveTableRequest save;
  save.set_job("job-b");
  save.set_attempt(1);
  save.set_path("stolen/shard-0.bin");
  SaveTableResponse saved;
  DropTableRequest drop;
  drop.set_job("job-b");
  drop.set_attempt(1);
  DropTableResponse dropped;
  for (const std::string& wrong : {a_secret, std::string()}) {
    auto code = [&](auto fn) { return call(wrong, fn).code(); };
    EXPECT_EQ(code([&](const CallOptions& o, StatusCallback d) { shard.PullAsync(pull, &pulled, &values, o, std::move(d)); }),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(code([&](const CallOptions& o, StatusCallback d) { shard.PushAsync(push, {}, &pushed, o, std::move(d)); }),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(code([&](const CallOptions& o, StatusCallback d) { shard.SaveTableAsync(save, &saved, o, std::move(d)); }),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(code([&](const CallOptions& o, StatusCallback d) { shard.DropTableAsync(drop, &dropped, o, std::move(d)); }),
              absl::StatusCode::kPermissionDenied);
    // Nor may it make the table anew under its own secret.
    EXPECT_EQ(code([&](const CallOptions& o, StatusCallback d) {
                shard.InitTableAsync(init, {}, &init_resp, o, std::move(d));
              }),
              absl::StatusCode::kPermissionDenied);
  }
  // The job's own members: served; after the drop, the secret is forgotten.
  EXPECT_TRUE(call(b_secret, [&](const CallOptions& o, StatusCallback d) {
                shard.PullAsync(pull, &pulled, &values, o, std::move(d));
              }).ok());
  EXPECT_TRUE(call(b_secret, [&](const CallOptions& o, StatusCallback d) {
                shard.DropTableAsync(drop, &dropped, o, std::move(d));
              }).ok());
  EXPECT_TRUE(call(a_secret, [&](const CallOptions& o, StatusCallback d) {
                shard.InitTableAsync(init, {}, &init_resp, o, std::move(d));
              }).ok());
}

// With one certificate per member, a member's name is the certificate's.
TEST_F(SecurityTest, MemberNamesCanBeBoundToClientCertificates) {
  LocalCredentialsOptions pool;
  pool.common_name = "pstrain-ps-0";
  pool.alt_names = {"DNS:*.pool.test", "IP:127.0.0.1"};
  auto member = WriteLocalCredentials(dir_ + "/member-cert", pool);
  ASSERT_TRUE(member.ok()) << member.status();
  SecurityOptions server;
  server.tls_cert = member->cert;
  server.tls_key = member->key;
  server.tls_ca = member->ca;
  server.tls_client_auth = ClientAuth::kRequire;
  server.token_auth_file = creds_.token_auth_file;
  auto security = ServerSecurityFor(server);
  ASSERT_TRUE(security.ok()) << security.status();
  GrpcClusterService cluster(s_.coordinator.get(), /*names_from_certificates=*/true);
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.security = *security;
  auto s = GrpcServer::Create(options, {&cluster});
  ASSERT_TRUE(s.ok()) << s.status();
  SecurityOptions client;
  client.tls_ca = member->ca;
  client.tls_cert = member->cert;
  client.tls_key = member->key;
  client.token_file = creds_.cluster_token_file;
  auto stub = ClusterService::NewStub(CreateChannel((*s)->local_target(), 1 << 20, client));
  auto register_as = [&](const std::string& name) {
    RegisterRequest r;
    r.set_role(MEMBER_ROLE_WORKER);
    r.set_name(name);
    RegisterResponse resp;
    grpc::ClientContext ctx;
    return stub->Register(&ctx, r, &resp).error_code();
  };
  EXPECT_EQ(register_as("pstrain-ps-0"), grpc::StatusCode::OK);   // the common name
  EXPECT_EQ(register_as("w-0.pool.test"), grpc::StatusCode::OK);  // under the wildcard
  EXPECT_EQ(register_as("a.b.pool.test"), grpc::StatusCode::PERMISSION_DENIED);  // one label only
  EXPECT_EQ(register_as("pool.test"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(register_as("pstrain-worker-7"), grpc::StatusCode::PERMISSION_DENIED);
  (*s)->Shutdown();
}

// Rotation without a restart: the server's certificate files are replaced
// (renamed over, as a Kubernetes Secret volume does) by ones of another CA;
// within the refresh interval new connections see the new certificate.
TEST(SecurityRotationTest, ANewCertificateIsServedWithoutARestart) {
  const std::string dir = ::testing::TempDir() + "/rotation";
  auto old_creds = WriteLocalCredentials(dir + "/old");
  auto new_creds = WriteLocalCredentials(dir + "/new");
  ASSERT_TRUE(old_creds.ok() && new_creds.ok());
  const std::string live = dir + "/live";
  std::filesystem::create_directories(live);
  auto install = [&](const LocalCredentials& c) {
    ASSERT_TRUE(WriteFileAtomically(live + "/cert.pem", *ReadFile(c.cert)).ok());
    ASSERT_TRUE(WriteFileAtomically(live + "/key.pem", *ReadFile(c.key)).ok());
  };
  install(*old_creds);
  SecurityOptions server;
  server.tls_cert = live + "/cert.pem";
  server.tls_key = live + "/key.pem";
  server.tls_refresh_s = 1;
  auto security = ServerSecurityFor(server);
  ASSERT_TRUE(security.ok()) << security.status();
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.security = *security;
  auto s = GrpcServer::Create(options, {});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string target = (*s)->local_target();
  auto healthy = [&](const LocalCredentials& trusted) {
    SecurityOptions client;
    client.tls_ca = trusted.ca;
    return RawCall(target, "/grpc.health.v1.Health/Check", "", client).ok();
  };
  EXPECT_TRUE(healthy(*old_creds));
  EXPECT_FALSE(healthy(*new_creds));
  install(*new_creds);
  bool rotated = false;
  for (int i = 0; i < 50 && !rotated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rotated = healthy(*new_creds);
  }
  EXPECT_TRUE(rotated) << "the new certificate was not served within 5 s";
  EXPECT_FALSE(healthy(*old_creds));
  (*s)->Shutdown();
}

TEST(SecurityOptionsTest, InconsistentSettingsAreRefusedNamingTheFlag) {
  const std::string dir = ::testing::TempDir() + "/security-options";
  auto creds = WriteLocalCredentials(dir);
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto refused = [](SecurityOptions o, bool server, const std::string& flag) {
    absl::Status s = ValidateSecurity(o, server);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(s.message().find(flag), std::string::npos) << s;
  };
  SecurityOptions tokens_in_clear;
  tokens_in_clear.token_auth_file = creds->token_auth_file;
  refused(tokens_in_clear, true, "--token_auth_file");
  SecurityOptions token_in_clear;
  token_in_clear.token_file = creds->user_token_file;
  refused(token_in_clear, false, "--token_file");
  SecurityOptions half_pair;
  half_pair.tls_cert = creds->cert;
  refused(half_pair, true, "--tls_key");
  SecurityOptions wrong_key;
  wrong_key.tls_cert = creds->cert;
  wrong_key.tls_key = creds->ca;  // a certificate, not a key
  refused(wrong_key, true, "--tls_key");
  SecurityOptions mtls_without_ca;
  mtls_without_ca.tls_cert = creds->cert;
  mtls_without_ca.tls_key = creds->key;
  mtls_without_ca.tls_client_auth = ClientAuth::kRequire;
  refused(mtls_without_ca, true, "--tls_client_auth");
  SecurityOptions missing_ca;
  missing_ca.tls_ca = dir + "/nope.pem";
  refused(missing_ca, false, "--tls_ca");
  SecurityOptions good;
  good.tls_cert = creds->cert;
  good.tls_key = creds->key;
  good.tls_ca = creds->ca;
  good.token_auth_file = creds->token_auth_file;
  good.token_file = creds->cluster_token_file;
  EXPECT_TRUE(ValidateSecurity(good, true).ok());
}

}  // namespace
}  // namespace pstrain
