// Credentials for a cluster on one machine (`pstrain local --secure`) and
// for tests: a fresh CA, one certificate it signs for the members (server
// and client use: SAN localhost and 127.0.0.1), a token file with one token
// per member role (shard, worker, coordinator), an any-member cluster token,
// a user token and an admin token, each random (256 bits), and the
// coordinator's table grant key (Ed25519; the shards get its public key).
// Written into `dir` (created 0700; keys and tokens 0600). For production,
// certificates come from your CA or cert-manager (deploy/README.md).
#ifndef PSTRAIN_RPC_LOCAL_CREDENTIALS_H_
#define PSTRAIN_RPC_LOCAL_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

struct LocalCredentials {
  std::string ca;    // CA certificate (PEM): --tls_ca
  std::string cert;  // member certificate: --tls_cert
  std::string key;   // its key: --tls_key
  std::string token_auth_file;     // servers' --token_auth_file
  std::string cluster_token_file;  // any member's --token_file (pstrain:cluster)
  std::string user_token_file;     // the CLI's --token_file (user `user`)
  std::string admin_token_file;    // an admin's (user `admin`)
  std::string shard_token_file;        // shards' --token_file (pstrain:shard)
  std::string worker_token_file;       // workers' (pstrain:worker)
  std::string coordinator_token_file;  // the coordinator's, towards the shards (pstrain:coordinator)
  std::string table_grant_key_file;         // the coordinator's --table_grant_key_file (private)
  std::string table_grant_public_key_file;  // the shards' --table_grant_public_key_file
};

struct LocalCredentialsOptions {
  std::string common_name = "pstrain";
  // Subject alternative names: "DNS:..." or "IP:...".
  std::vector<std::string> alt_names = {"DNS:localhost", "IP:127.0.0.1"};
  std::string user = "user";
  int valid_days = 30;
};

absl::StatusOr<LocalCredentials> WriteLocalCredentials(const std::string& dir,
                                                       const LocalCredentialsOptions& options = {});

// 32 random bytes from the kernel's CSPRNG, hex-encoded.
absl::StatusOr<std::string> RandomToken();

}  // namespace pstrain

#endif  // PSTRAIN_RPC_LOCAL_CREDENTIALS_H_
