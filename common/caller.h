// Who is calling: the identity a server's authentication resolved for one
// call, in terms the coordinator's logic can use without knowing gRPC.
//
// With authentication off (no --token_auth_file: `pstrain local` on
// 127.0.0.1) every caller is an anonymous admin: nothing is owned and
// nothing is refused for want of a role.
#ifndef PSTRAIN_COMMON_CALLER_H_
#define PSTRAIN_COMMON_CALLER_H_

#include <string>

namespace pstrain {

enum class CallerRole {
  kNone,     // no valid token; never reaches a handler when auth is on
  kCluster,  // any member (pstrain:cluster): a shard, a worker or the coordinator's calls to shards
  kShard,        // pstrain:shard: registers shards only
  kWorker,       // pstrain:worker: registers workers, trains on the shards
  kCoordinator,  // pstrain:coordinator: the coordinator's calls to shards
  kUser,     // people: JobService, their own jobs
  kAdmin,    // people: JobService, every job
};

const char* CallerRoleName(CallerRole role);

struct Caller {
  CallerRole role = CallerRole::kAdmin;
  // The user name from the token file; empty with authentication off.
  std::string user;

  // Whether this caller may see or change a job submitted by `owner`.
  bool MayActOn(const std::string& owner) const { return role == CallerRole::kAdmin || user == owner; }
  // Whether this caller speaks for the coordinator towards shards (drops,
  // saves, loads, worker sets, the all-tables view): a coordinator token,
  // the any-member cluster token, or anyone with authentication off.
  bool IsCoordinator() const {
    return role == CallerRole::kCoordinator || role == CallerRole::kCluster || role == CallerRole::kAdmin;
  }
};

inline const char* CallerRoleName(CallerRole role) {
  switch (role) {
    case CallerRole::kCluster: return "cluster";
    case CallerRole::kShard: return "shard";
    case CallerRole::kWorker: return "worker";
    case CallerRole::kCoordinator: return "coordinator";
    case CallerRole::kUser: return "user";
    case CallerRole::kAdmin: return "admin";
    case CallerRole::kNone: break;
  }
  return "none";
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_CALLER_H_
