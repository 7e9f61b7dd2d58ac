// The start of every pstrain server binary (pstrain-ps, pstrain-worker,
// pstrain-coordinator): flags from their PSTRAIN_* variables, then the
// command line (which wins), then logging -- spdlog to stderr at
// --log_level (PSTRAIN_LOG_LEVEL) -- and Abseil's mutex deadlock detector
// off (see binary_setup.cc). The CLI is not one of them: what it prints is
// for a person, not a log.
#ifndef PSTRAIN_COMMON_BINARY_SETUP_H_
#define PSTRAIN_COMMON_BINARY_SETUP_H_

namespace pstrain {

// Exits with status 2 and one line naming `name` when a variable or
// --log_level does not parse.
void StartBinary(const char* name, int argc, char** argv);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BINARY_SETUP_H_
