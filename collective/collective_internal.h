// Between collective.cc and the backends.
#ifndef PSTRAIN_COLLECTIVE_COLLECTIVE_INTERNAL_H_
#define PSTRAIN_COLLECTIVE_COLLECTIVE_INTERNAL_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "collective/collective.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<Collective>> CreateGlooCollective(const CollectiveOptions& options);
// Loads the NCCL backend (libpstrain_nccl.so, see nccl_loader.cc).
absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions& options);

// UNAVAILABLE naming the operation: how a lost peer shows.
inline absl::Status PeerError(const char* what, const std::string& detail) {
  return absl::UnavailableError(
      absl::StrCat(what, " failed: a peer left or the network broke (", detail.substr(0, 400), ")"));
}

// The NCCL plugin's entry points (extern "C", looked up with dlsym).
// Each returns null / -1 and sets *error on failure.
using NcclCreateFn = Collective* (*)(const CollectiveOptions* options, std::string* error);
using CudaDeviceCountFn = int (*)(std::string* error);
constexpr char kNcclCreateSymbol[] = "PstrainNcclCreate";
constexpr char kCudaDeviceCountSymbol[] = "PstrainCudaDeviceCount";

}  // namespace pstrain

#endif  // PSTRAIN_COLLECTIVE_COLLECTIVE_INTERNAL_H_
