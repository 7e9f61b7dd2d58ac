// Configuration from the environment, for containers and Kubernetes: every
// flag --some_flag of a pstrain binary may be given as PSTRAIN_SOME_FLAG.
// A flag on the command line wins over the environment.
#ifndef PSTRAIN_COMMON_ENV_FLAGS_H_
#define PSTRAIN_COMMON_ENV_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pstrain {

// The variable that sets --flag: PSTRAIN_ + the name in upper case.
std::string EnvNameForFlag(const std::string& flag);

// Sets every registered flag whose variable is in `env` ("NAME=value"
// entries; default: this process's environment). Call before
// absl::ParseCommandLine so that the command line overrides. A value that
// does not parse is an INVALID_ARGUMENT naming the variable.
absl::Status ApplyEnvironmentToFlags(const std::vector<std::string>& env);
absl::Status ApplyEnvironmentToFlags();

// A StatefulSet pod's ordinal, from its hostname "<statefulset>-<ordinal>"
// (pstrain-worker-3 -> 3); -1 when the name does not end in one.
int OrdinalFromHostname(const std::string& hostname);
// This host's ordinal (gethostname), or -1.
int HostOrdinal();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_ENV_FLAGS_H_
