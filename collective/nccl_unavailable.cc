// Builds without a CUDA toolkit with NCCL (see @cuda): the backend says so.
#include "absl/strings/str_cat.h"
#include "collective/collective.h"
#include "collective/collective_internal.h"

namespace pstrain {

bool NcclBuilt() { return false; }

absl::StatusOr<int> CudaDeviceCount() {
  return absl::FailedPreconditionError("this build has no CUDA support (no CUDA toolkit with NCCL was found)");
}

absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions&) {
  return absl::FailedPreconditionError(
      "the nccl backend is not built: build with a CUDA toolkit and NCCL (PSTRAIN_CUDA, default /usr/local/cuda)");
}

}  // namespace pstrain
