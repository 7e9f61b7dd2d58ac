// Starting pstrain's own binaries as child processes, for the launcher
// (`pstrain local`) and the multi-process tests alike: argv[0] with its
// arguments, stdout and stderr into a log file, a signal when the parent
// dies (so nothing outlives a crashed launcher or test), optionally its own
// process group (Ctrl-C reaches the launcher only) and extra environment.
#ifndef PSTRAIN_COMMON_SUBPROCESS_H_
#define PSTRAIN_COMMON_SUBPROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pstrain {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0]: the binary's path
  std::string log_path;           // stdout and stderr, truncated
  int parent_death_signal = SIGKILL;
  bool own_process_group = false;
  std::vector<std::pair<std::string, std::string>> env;  // set in the child
};

absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

// The child's exit code (128 + signal when a signal ended it) once it has
// exited and was reaped here; nullopt while it runs.
std::optional<int> PollExit(pid_t pid);

// The first line of `path` when the file exists and it is not empty (a
// server's --port_file).
std::optional<std::string> FirstLine(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SUBPROCESS_H_
