// The launch environment a worker reads once: torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as a Kubeflow
// PyTorchJob sets them too) and GLOO_SOCKET_IFNAME. Every number is checked
// here, with an error naming the variable, instead of atoi's silent 0.
#ifndef PSTRAIN_WORKER_LAUNCH_ENV_H_
#define PSTRAIN_WORKER_LAUNCH_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace pstrain {

struct LaunchEnv {
  int rank = -1;        // -1: RANK unset
  int world_size = 0;   // 0: WORLD_SIZE unset
  int local_rank = 0;   // LOCAL_RANK, 0 when unset
  std::string master_addr;
  int master_port = 0;  // 0: MASTER_PORT unset
  std::string gloo_interface;
};

// `getenv` returns null for an unset variable (default: the process's).
absl::StatusOr<LaunchEnv> ReadLaunchEnv(
    const std::function<const char*(const char*)>& getenv = [](const char* n) { return std::getenv(n); });

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_LAUNCH_ENV_H_
