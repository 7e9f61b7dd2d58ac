// Between collective.cc and the backends.
#ifndef PSTRAIN_COLLECTIVE_COLLECTIVE_INTERNAL_H_
#define PSTRAIN_COLLECTIVE_COLLECTIVE_INTERNAL_H_

#include <memory>
#include <string>

#include "collective/collective.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<Collective>> CreateGlooCollective(const CollectiveOptions& options);
absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions& options);
// UNAVAILABLE naming the operation: how a lost peer shows.
absl::Status PeerError(const char* what, const std::string& detail);

}  // namespace pstrain

#endif  // PSTRAIN_COLLECTIVE_COLLECTIVE_INTERNAL_H_
