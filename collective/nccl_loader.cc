// Loads the NCCL backend, libpstrain_nccl.so, on first use. Looked for in
// $PSTRAIN_NCCL_PLUGIN, next to the executable, in Bazel's layout
// (bazel-bin/collective/, runfiles' collective/), then on the library path.
// Where it is missing (a build without CUDA) or cannot load (no CUDA
// libraries on this machine) the backend reports why, and nothing else
// changes: the binaries never need CUDA to start.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/collective.h"
#include "collective/collective_internal.h"

namespace pstrain {
namespace {

constexpr char kPlugin[] = "libpstrain_nccl.so";

struct Plugin {
  NcclCreateFn create = nullptr;
  CudaDeviceCountFn device_count = nullptr;
  std::string error;  // why it is not loaded
};

const Plugin& LoadPlugin() {
  static Plugin plugin;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* p = std::getenv("PSTRAIN_NCCL_PLUGIN")) candidates.push_back(p);
    std::error_code ec;
    const std::filesystem::path exe_dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
    if (!ec) {
      candidates.push_back((exe_dir / kPlugin).string());
      candidates.push_back((exe_dir / ".." / "collective" / kPlugin).string());
    }
    candidates.push_back(std::string("collective/") + kPlugin);
    candidates.push_back(kPlugin);
    std::vector<std::string> errors;
    for (const std::string& c : candidates) {
      if (c.find('/') != std::string::npos && !std::filesystem::exists(c, ec)) continue;
      void* handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        errors.push_back(dlerror());
        continue;
      }
      plugin.create = reinterpret_cast<NcclCreateFn>(dlsym(handle, kNcclCreateSymbol));
      plugin.device_count = reinterpret_cast<CudaDeviceCountFn>(dlsym(handle, kCudaDeviceCountSymbol));
      if (plugin.create != nullptr && plugin.device_count != nullptr) return;
      errors.push_back(absl::StrCat(c, ": not a pstrain NCCL plugin"));
    }
    plugin.error = errors.empty()
                       ? absl::StrCat("the NCCL backend is not built (no ", kPlugin,
                                      "; build with a CUDA toolkit and NCCL: PSTRAIN_CUDA, default /usr/local/cuda)")
                       : absl::StrCat("the NCCL backend cannot load: ", absl::StrJoin(errors, "; "));
  });
  return plugin;
}

}  // namespace

bool NcclBuilt() { return LoadPlugin().create != nullptr; }

absl::StatusOr<int> CudaDeviceCount() {
  const Plugin& p = LoadPlugin();
  if (p.device_count == nullptr) return absl::FailedPreconditionError(p.error);
  std::string error;
  const int n = p.device_count(&error);
  if (n < 0) return absl::FailedPreconditionError(error);
  return n;
}

absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions& options) {
  const Plugin& p = LoadPlugin();
  if (p.create == nullptr) return absl::FailedPreconditionError(p.error);
  std::string error;
  Collective* c = p.create(&options, &error);
  if (c == nullptr) return absl::FailedPreconditionError(error);
  return std::unique_ptr<Collective>(c);
}

}  // namespace pstrain
