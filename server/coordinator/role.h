// What a member of the cluster is. On the wire (RegisterRequest.role,
// MemberStatus.role) it stays the string "shard" or "worker".
#ifndef PSTRAIN_SERVER_COORDINATOR_ROLE_H_
#define PSTRAIN_SERVER_COORDINATOR_ROLE_H_

#include <optional>
#include <string>

namespace pstrain {

enum class Role { kShard, kWorker };

inline const char* RoleName(Role role) { return role == Role::kShard ? "shard" : "worker"; }

inline std::optional<Role> ParseRole(const std::string& name) {
  if (name == "shard") return Role::kShard;
  if (name == "worker") return Role::kWorker;
  return std::nullopt;
}

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_ROLE_H_
