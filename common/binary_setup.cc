#include "common/binary_setup.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "common/env_flags.h"
#include "common/quote.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, log_level, "info", "Least severe log messages printed: trace, debug, info, warn, error or off.");

namespace pstrain {

void StartBinary(const char* name, int argc, char** argv) {
  if (absl::Status env = ApplyEnvironmentToFlags(); !env.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(env.message()).c_str());
    std::exit(2);
  }
  absl::ParseCommandLine(argc, argv);
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  // from_str answers "off" for anything it does not know.
  if (parsed == spdlog::level::off && level != "off") {
    std::fprintf(stderr, "%s: --log_level=%s: expected trace, debug, info, warn, error or off\n", name,
                 Quote(level, 32).c_str());
    std::exit(2);
  }
  spdlog::set_level(parsed);
  // Debian's Abseil is built without NDEBUG, so absl::Mutex looks for
  // lock-order cycles on every Lock, recording each lock in one
  // process-wide graph under one global lock (GraphCycles: 0.7-1.3% of a
  // process's cycles in `bench/run.sh pushpull`, and a point every thread
  // meets). The binaries do without; the tests keep it, which is where a
  // lock-order mistake shows.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace pstrain
