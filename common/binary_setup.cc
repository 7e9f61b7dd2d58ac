#include "common/binary_setup.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "common/env_flags.h"
#include "common/quote.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, log_level, "info", "Least severe log messages printed: trace, debug, info, warn, error or off.");

namespace pstrain {
namespace {

struct ProtobufLogLimit {
  absl::Mutex mu;
  int burst ABSL_GUARDED_BY(mu) = 10;
  absl::Duration window ABSL_GUARDED_BY(mu) = absl::Minutes(1);
  absl::Time window_start ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  int in_window ABSL_GUARDED_BY(mu) = 0;
  int64_t dropped ABSL_GUARDED_BY(mu) = 0;  // since the last message that went out
};

ProtobufLogLimit& Limit() {
  static ProtobufLogLimit* limit = new ProtobufLogLimit;  // used until exit, by any thread
  return *limit;
}

void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  // Protobuf's messages name types and fields, not the bytes of the input;
  // bounded all the same.
  const std::string text = Quote(message, 300);
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    spdlog::critical("protobuf ({}:{}): {}", file, line, text);
    return;
  }
  int64_t dropped = 0;
  int burst = 0;
  absl::Duration window;
  {
    ProtobufLogLimit& l = Limit();
    absl::MutexLock lock(&l.mu);
    const absl::Time now = absl::Now();
    if (now - l.window_start >= l.window) {
      l.window_start = now;
      l.in_window = 0;
    }
    if (l.in_window >= l.burst) {
      ++l.dropped;
      return;
    }
    ++l.in_window;
    dropped = l.dropped;
    l.dropped = 0;
    burst = l.burst;
    window = l.window;
  }
  const spdlog::level::level_enum to = level == google::protobuf::LOGLEVEL_INFO ? spdlog::level::info
                                                                                : spdlog::level::warn;
  if (dropped > 0) {
    spdlog::log(to, "protobuf: {} (and {} more such messages dropped before this one: at most {} per {})", text,
                dropped, burst, absl::FormatDuration(window));
  } else {
    spdlog::log(to, "protobuf: {}", text);
  }
}

}  // namespace

void LimitProtobufLogs(int burst, absl::Duration window) {
  {
    ProtobufLogLimit& l = Limit();
    absl::MutexLock lock(&l.mu);
    l.burst = burst;
    l.window = window;
    l.window_start = absl::InfinitePast();
    l.in_window = 0;
    l.dropped = 0;
  }
  google::protobuf::SetLogHandler(&ProtobufLog);
}

sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

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
  LimitProtobufLogs();
}

}  // namespace pstrain
