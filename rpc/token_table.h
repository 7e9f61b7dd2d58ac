// TokenTable: the bearer tokens a server accepts, read from a file in
// Kubernetes' static token file format (kube-apiserver --token-auth-file),
// so the same Secret can be written by the same tools:
//
//   token,user,uid[,"group1,group2"]
//
// Groups give a token its one role: `pstrain:shard` registers shards,
// `pstrain:worker` registers workers and trains on the shards,
// `pstrain:coordinator` is the coordinator's token towards the shards;
// `pstrain:cluster` is any of the three (one token for a whole cluster: for
// a single machine or an upgrade; a holder can act as any member);
// `pstrain:admin` an admin; a row with none of these is a user. A row with
// two member roles is refused. Blank lines and lines starting with '#' are
// skipped.
//
// Only SHA-256 digests of the tokens are kept in memory; a lookup compares
// the presented token's digest with every row's in constant time
// (CRYPTO_memcmp, no early exit), so neither timing nor a core dump gives a
// token away. The file is re-read when it changes (checked at most once a
// second): tokens rotate without a restart; a new file that does not parse
// is logged and the previous table kept.
//
// Thread-safe.
#ifndef PSTRAIN_RPC_TOKEN_TABLE_H_
#define PSTRAIN_RPC_TOKEN_TABLE_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/caller.h"

namespace pstrain {

constexpr char kClusterGroup[] = "pstrain:cluster";
constexpr char kShardGroup[] = "pstrain:shard";
constexpr char kWorkerGroup[] = "pstrain:worker";
constexpr char kCoordinatorGroup[] = "pstrain:coordinator";
constexpr char kAdminGroup[] = "pstrain:admin";
// Shorter tokens are refused when the file is read: a guessable token is no
// protection.
constexpr size_t kMinTokenLength = 16;

class TokenTable {
 public:
  struct Row {
    std::array<unsigned char, 32> digest;
    Caller caller;
  };

  // Reads `path`; errors name the file and the line, never a token.
  static absl::StatusOr<std::shared_ptr<TokenTable>> Load(const std::string& path);
  // Parses file contents (`source` names them in errors).
  static absl::StatusOr<std::vector<Row>> Parse(absl::string_view contents, const std::string& source);

  // The caller a token belongs to, or nullopt.
  std::optional<Caller> Find(absl::string_view token);

  size_t size();

 private:
  explicit TokenTable(std::string path) : path_(std::move(path)) {}
  void MaybeReload() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::vector<Row> rows_ ABSL_GUARDED_BY(mu_);
  std::string file_identity_ ABSL_GUARDED_BY(mu_);  // inode, size, mtime of what rows_ came from
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// "Bearer <token>" -> "<token>"; empty when the value is not a bearer token.
absl::string_view BearerToken(absl::string_view authorization);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_TOKEN_TABLE_H_
