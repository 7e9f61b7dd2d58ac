// A member's role (proto/events.proto MemberRole) as people read it, the
// same in `pstrain status`, the dashboard, logs and metric labels: "shard"
// or "worker".
#ifndef PSTRAIN_COMMON_MEMBER_ROLE_H_
#define PSTRAIN_COMMON_MEMBER_ROLE_H_

#include "proto/events.pb.h"

namespace pstrain {

inline const char* RoleName(MemberRole role) {
  switch (role) {
    case MEMBER_ROLE_SHARD: return "shard";
    case MEMBER_ROLE_WORKER: return "worker";
    default: return "unspecified";
  }
}

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MEMBER_ROLE_H_
