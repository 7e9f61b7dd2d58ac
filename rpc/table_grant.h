// Table grants: the coordinator's word that a job's attempt may make its
// table on a shard, and with which job secret.
//
// A shard keeps the first job secret a table-making call (InitTable,
// LoadTable) succeeds with, and serves the job's table only to callers that
// send it (server/ps/job_secrets.h). Without grants, any member that
// reaches a shard could make a table first: for a future job id (ids are
// sequential), under its own secret, at an attempt above any the
// coordinator will ever send -- the job then fails, or trains from values
// the squatter chose. With grants, a shard makes a table only when the call
// carries, in its `x-pstrain-table-grant` metadata, the coordinator's
// Ed25519 signature (hex) over
//
//   "pstrain-table-grant-v1\n" job "\n" attempt "\n" secret
//
// The coordinator alone holds the private key (--table_grant_key_file);
// shards hold the public key (--table_grant_public_key_file), so a
// compromised shard can check grants but not make them. The coordinator
// hands a job's workers the grant with their assignment and sends it
// itself with LoadTable. Keys: `openssl genpkey -algorithm ed25519 -out
// grant.key; openssl pkey -in grant.key -pubout -out grant.pub`, or
// `pstrain credentials`.
#ifndef PSTRAIN_RPC_TABLE_GRANT_H_
#define PSTRAIN_RPC_TABLE_GRANT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

typedef struct evp_pkey_st EVP_PKEY;

namespace pstrain {

// The coordinator's side. Thread-safe.
class TableGrantSigner {
 public:
  // The Ed25519 private key (PEM) in `path`; errors name `flag` and the
  // file, never the key.
  static absl::StatusOr<std::shared_ptr<const TableGrantSigner>> Load(const std::string& path, const char* flag);
  // A fresh key (tests).
  static std::shared_ptr<const TableGrantSigner> Generate();
  ~TableGrantSigner();

  // The grant for (job, attempt, secret): 128 hex digits.
  std::string Sign(absl::string_view job, uint64_t attempt, absl::string_view secret) const;
  // The public key (PEM), for the shards.
  std::string PublicKeyPem() const;
  // The private key (PEM), to write a key file (pstrain credentials).
  std::string PrivateKeyPem() const;

 private:
  explicit TableGrantSigner(EVP_PKEY* key) : key_(key) {}
  EVP_PKEY* const key_;
};

// The shards' side. Thread-safe.
class TableGrantVerifier {
 public:
  // The Ed25519 public key (PEM) in `path`.
  static absl::StatusOr<std::shared_ptr<const TableGrantVerifier>> Load(const std::string& path, const char* flag);
  static absl::StatusOr<std::shared_ptr<const TableGrantVerifier>> FromPem(const std::string& pem,
                                                                          const std::string& source);
  ~TableGrantVerifier();

  // Whether `presented` is the coordinator's grant for (job, attempt, secret).
  bool Valid(absl::string_view job, uint64_t attempt, absl::string_view secret, absl::string_view presented) const;

 private:
  explicit TableGrantVerifier(EVP_PKEY* key) : key_(key) {}
  EVP_PKEY* const key_;
};

}  // namespace pstrain

#endif  // PSTRAIN_RPC_TABLE_GRANT_H_
