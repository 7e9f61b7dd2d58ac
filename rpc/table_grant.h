// Table grants: the coordinator's word that a job's attempt may make its
// table on a shard, and with which job secret.
//
// A shard keeps the first job secret a table-making call (InitTable,
// LoadTable) succeeds with, and serves the job's table only to callers that
// send it (server/ps/job_secrets.h). Without grants, any member that
// reaches a shard could make a table first: for a future job id (ids are
// sequential), under its own secret, at an attempt above any the
// coordinator will ever send -- the job then fails, or trains from values
// the squatter chose. With a grant key (a file the coordinator and the
// shards mount, workers not), a shard makes a table only when the call
// carries, in its `x-pstrain-table-grant` metadata,
//
//   hex(HMAC-SHA256(key, "pstrain-table-grant-v1\n" job "\n" attempt "\n" secret))
//
// which only the coordinator can compute. It hands the grant to the job's
// workers with their assignment and sends it itself with LoadTable.
#ifndef PSTRAIN_RPC_TABLE_GRANT_H_
#define PSTRAIN_RPC_TABLE_GRANT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// A shorter key is refused: it could be guessed.
inline constexpr size_t kMinTableGrantKeyBytes = 32;

// The key in `path` (its bytes, trailing whitespace removed). Errors name
// the flag and the file, never the key.
absl::StatusOr<std::string> LoadTableGrantKey(const std::string& path, const char* flag);

// The grant for (job, attempt, secret) under `key` (64 hex digits).
std::string TableGrant(absl::string_view key, absl::string_view job, uint64_t attempt, absl::string_view secret);

// Whether `presented` is that grant (compared in constant time).
bool TableGrantValid(absl::string_view key, absl::string_view job, uint64_t attempt, absl::string_view secret,
                     absl::string_view presented);

}  // namespace pstrain

#endif  // PSTRAIN_RPC_TABLE_GRANT_H_
