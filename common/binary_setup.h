// The start of every pstrain server binary (pstrain-ps, pstrain-worker,
// pstrain-coordinator): flags from their PSTRAIN_* variables, then the
// command line (which wins), then logging -- spdlog to stderr at
// --log_level (PSTRAIN_LOG_LEVEL) -- and Abseil's mutex deadlock detector
// off (see binary_setup.cc), and protobuf's own log messages bounded
// (LimitProtobufLogs). The CLI is not one of them: what it prints is for a
// person, not a log.
#ifndef PSTRAIN_COMMON_BINARY_SETUP_H_
#define PSTRAIN_COMMON_BINARY_SETUP_H_

#include <signal.h>

#include "absl/time/time.h"

namespace pstrain {

// Exits with status 2 and one line naming `name` when a variable or
// --log_level does not parse.
void StartBinary(const char* name, int argc, char** argv);

// Blocks SIGTERM and SIGINT in the calling thread and so in every thread it
// starts afterwards (they inherit the mask): only a sigwait() on the
// returned set sees them. Call before any thread starts.
sigset_t BlockStopSignals();

// Protobuf writes a line to stderr for every parse of a message whose
// string field is not UTF-8 -- bytes any client can send, request after
// request (the request itself is refused, INVALID_ARGUMENT): unbounded log
// output at the sender's rate. Routes protobuf's messages through spdlog
// instead (errors as warnings: a bad request is not a server fault), at
// most `burst` of them per `window`; the first message after a window
// that dropped some says how many. FATAL passes through unlimited (the
// process ends). Process-wide; StartBinary calls it with the defaults.
void LimitProtobufLogs(int burst = 10, absl::Duration window = absl::Minutes(1));

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BINARY_SETUP_H_
