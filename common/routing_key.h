// Replicated shards (docs/replication.md): where the coordinator tells a
// job's workers of a new routing -- in the job's KV store (its rendezvous),
// under routing/<generation>, the Routing message (proto/parameter.proto)
// in binary form. Every generation after the first one a worker may know
// is written, each with the newest routing at the time, so a worker that
// asks for the one after its own always gets an answer. Only the
// coordinator writes these keys: members' KvSet of them is refused. And
// which failures such a routing may mend.
#ifndef PSTRAIN_COMMON_ROUTING_KEY_H_
#define PSTRAIN_COMMON_ROUTING_KEY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

inline constexpr char kRoutingKeyPrefix[] = "routing/";

inline std::string RoutingKey(uint64_t generation) { return absl::StrCat(kRoutingKeyPrefix, generation); }

inline bool IsRoutingKey(const std::string &key) { return absl::StartsWith(key, kRoutingKeyPrefix); }

// Whether a newer routing may mend a call's failure: the shard is gone or
// unreachable (UNAVAILABLE, or the call cut off), or it no longer leads
// (FAILED_PRECONDITION: the caller's routing is old; ABORTED: it was
// fenced). Anything else (a bad request, a stale attempt, ...) fails the
// call at once. Dense chunks' and embedding slots' clients alike.
inline bool MayFailOver(const absl::Status &s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_ROUTING_KEY_H_
