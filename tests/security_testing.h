// The fixture of the security tests: in-process coordinator and shard
// servers on 127.0.0.1, secured as deployments are (TLS, the token table of
// `pstrain credentials` plus a user bob, the coordinator's table grant
// key), and a log sink that every token is looked for in at the end.
#ifndef PSTRAIN_TESTS_SECURITY_TESTING_H_
#define PSTRAIN_TESTS_SECURITY_TESTING_H_

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "google/protobuf/descriptor.h"
#include "proto/control.grpc.pb.h"
#include "proto/parameter.pb.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/grpc_server.h"
#include "rpc/health_check.h"
#include "rpc/local_credentials.h"
#include "rpc/security.h"
#include "rpc/table_grant.h"
#include "server/coordinator/grpc_coordinator_service.h"
#include "server/ps/grpc_parameter_service.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "table/shard_store.h"
#include "tests/in_process_services.h"
#include "tests/raw_call.h"


namespace pstrain {

inline std::string Token(const std::string& path) {
  auto t = ReadFile(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::string(absl::StripAsciiWhitespace(t.value_or("")));
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Every log line of the test, to look for tokens in.
    log_sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    spdlog::default_logger()->sinks().push_back(log_sink_);

    dir_ = ::testing::TempDir() + "/security";
    LocalCredentialsOptions alice;
    alice.user = "alice";
    auto creds = WriteLocalCredentials(dir_ + "/creds", alice);
    ASSERT_TRUE(creds.ok()) << creds.status();
    creds_ = *creds;
    // A second user, bob.
    bob_token_file_ = dir_ + "/bob.token";
    const std::string bob = *RandomToken();
    ASSERT_TRUE(WriteFileAtomically(bob_token_file_, bob + "\n").ok());
    ASSERT_TRUE(WriteFileAtomically(creds_.token_auth_file,
                                    *ReadFile(creds_.token_auth_file) + bob + ",bob,4\n").ok());
    stranger_token_file_ = dir_ + "/stranger.token";
    ASSERT_TRUE(WriteFileAtomically(stranger_token_file_, *RandomToken() + "\n").ok());
    for (const std::string& f : {creds_.cluster_token_file, creds_.user_token_file, creds_.admin_token_file,
                                 creds_.shard_token_file, creds_.worker_token_file, creds_.coordinator_token_file,
                                 bob_token_file_, stranger_token_file_}) {
      tokens_.push_back(Token(f));
    }

    SecurityOptions server;
    server.tls_cert = creds_.cert;
    server.tls_key = creds_.key;
    server.tls_ca = creds_.ca;
    server.token_auth_file = creds_.token_auth_file;
    // The coordinator's own calls to shards: with its token.
    SecurityOptions process = server;
    process.token_auth_file.clear();
    process.token_file = creds_.coordinator_token_file;
    SetProcessSecurity(process);
    auto signer = TableGrantSigner::Load(creds_.table_grant_key_file, "--table_grant_key_file");
    ASSERT_TRUE(signer.ok()) << signer.status();
    auto verifier = TableGrantVerifier::Load(creds_.table_grant_public_key_file, "--table_grant_public_key_file");
    ASSERT_TRUE(verifier.ok()) << verifier.status();
    s_.grant_signer = *signer;
    s_.grant_verifier = *verifier;
    StartServers(server);
  }

  void StartServers(const SecurityOptions& server) {
    auto security = ServerSecurityFor(server);
    ASSERT_TRUE(security.ok()) << security.status();
    absl::Status started = s_.Start(dir_, *security, /*health_port=*/0);
    ASSERT_TRUE(started.ok()) << started;
  }

  void TearDown() override {
    s_.Stop();
    SetProcessSecurity(SecurityOptions{});
    // Nothing logged during the test holds a token.
    spdlog::default_logger()->flush();
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_sink_), sinks.end());
    const std::string logged = log_.str();
    for (const std::string& t : tokens_) EXPECT_EQ(logged.find(t), std::string::npos) << "a token was logged";
  }

  // A client of role `token_file` (empty: no token), trusting the CA.
  SecurityOptions Client(const std::string& token_file) const {
    SecurityOptions o;
    o.tls_ca = creds_.ca;
    o.token_file = token_file;
    return o;
  }

  void ExpectNoToken(const grpc::Status& s) {
    for (const std::string& t : tokens_) EXPECT_EQ(s.error_message().find(t), std::string::npos);
  }

  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> log_sink_;
  std::string dir_;
  LocalCredentials creds_;
  std::string bob_token_file_;
  std::string stranger_token_file_;
  std::vector<std::string> tokens_;
  InProcessServices s_;
};

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_SECURITY_TESTING_H_
