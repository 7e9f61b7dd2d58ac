#include "tests/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/subprocess.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  SpawnOptions o;
  o.argv = argv;
  o.log_path = log_path;
  absl::StatusOr<pid_t> pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  return std::unique_ptr<ChildProcess>(new ChildProcess(*pid));
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (std::optional<int> code = PollExit(pid_)) {
      pid_ = 0;
      return *code;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (std::optional<std::string> line = FirstLine(path)) return *line;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("no address in ", path, " after ",
                                                  absl::FormatDuration(timeout)));
}

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base ? base : "/tmp", "/", name, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace pstrain
