// ChildProcess: a server binary started by a multi-process test. The child
// binds port 0 and writes its address to a file; the parent waits for that
// file with a deadline. The destructor SIGKILLs a child that is still running,
// and the child dies with its parent too (PR_SET_PDEATHSIG), so a failing test
// never leaves orphans.
#ifndef PSTRAIN_TESTS_CHILD_PROCESS_H_
#define PSTRAIN_TESTS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pstrain {

class ChildProcess {
 public:
  // Starts argv[0] with the arguments; stdout and stderr go to `log_path`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit; returns the exit code, or 128 + signal. -1 on timeout.
  int Wait(absl::Duration timeout = absl::Seconds(30));
  bool running() const { return pid_ > 0; }

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

// Waits until `path` exists and is non-empty; returns its first line.
absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, absl::Duration timeout);

// A fresh empty directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_CHILD_PROCESS_H_
