#include "collective/collective.h"

#include "absl/strings/str_cat.h"
#include "collective/collective_internal.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(const std::string& backend,
                                                             const CollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("need 0 <= rank < size (", options.rank, ", ", options.size, ")"));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("a collective needs a rendezvous store");
  if (backend == "gloo") return CreateGlooCollective(options);
  if (backend == "nccl") return CreateNcclCollective(options);
  return absl::InvalidArgumentError(absl::StrCat("unknown collective backend '", backend, "': use gloo or nccl"));
}

}  // namespace pstrain
