#include "client/local_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace pstrain {

std::string TailFile(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.pop_front();
  }
  return absl::StrJoin(lines, "\n");
}

absl::Status LocalCluster::Spawn(const std::string& name, const std::vector<std::string>& argv,
                                 bool capture_stdout, Child* child) {
  child->name = name;
  child->log_path = absl::StrCat(options_.output_dir, "/logs/", name, ".log");
  int pipe_fds[2] = {-1, -1};
  if (capture_stdout && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    setpgid(0, 0);  // Ctrl-C reaches the launcher only; it stops the children
    int log = open(child->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) dup2(log, 2);
    if (capture_stdout) {
      dup2(pipe_fds[1], 1);
    } else if (log >= 0) {
      dup2(log, 1);
    }
    // One BLAS thread: LibTorch's own threads are the ones to size.
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_NUM_THREADS", std::to_string(options_.spec.threads_per_worker).c_str(), 1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  child->pid = pid;
  if (capture_stdout) {
    close(pipe_fds[1]);
    child->stdout_fd = pipe_fds[0];
    fcntl(child->stdout_fd, F_SETFL, O_NONBLOCK);
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::ChildFailed(const Child& c, const std::string& what) const {
  return absl::AbortedError(absl::StrCat(c.name, " ", what, "; last lines of ", c.log_path, ":\n",
                                         TailFile(c.log_path, 15)));
}

void LocalCluster::Reap() {
  for (auto* group : {&shards_, &workers_}) {
    for (Child& c : *group) {
      if (c.pid <= 0 || c.exited) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.exited = true;
        c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
  }
}

absl::Status LocalCluster::Run(const std::function<void(const std::string& line)>& on_event,
                               const std::atomic<bool>& stop_requested) {
  const JobSpec& spec = options_.spec;
  std::filesystem::create_directories(options_.output_dir + "/logs");
  const std::string addr_dir = options_.output_dir + "/logs";
  // Shards.
  shards_.resize(spec.shards);
  for (int i = 0; i < spec.shards; ++i) {
    const std::string port_file = absl::StrCat(addr_dir, "/shard-", i, ".addr");
    std::filesystem::remove(port_file);
    absl::Status s = Spawn(absl::StrCat("shard-", i),
                           {options_.ps_binary, "--host=127.0.0.1", "--port=0",
                            "--port_file=" + port_file, absl::StrCat("--shard_index=", i),
                            absl::StrCat("--num_shards=", spec.shards)},
                           false, &shards_[i]);
    if (!s.ok()) return s;
  }
  std::vector<std::string> addresses(spec.shards);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < spec.shards; ++i) {
    const std::string port_file = absl::StrCat(addr_dir, "/shard-", i, ".addr");
    while (true) {
      std::ifstream in(port_file);
      if (in && std::getline(in, addresses[i]) && !addresses[i].empty()) break;
      Reap();
      if (shards_[i].exited) return ChildFailed(shards_[i], absl::StrCat("exited with code ", shards_[i].exit_code, " while starting"));
      if (stop_requested) return absl::CancelledError("interrupted");
      if (absl::Now() > deadline) return ChildFailed(shards_[i], "did not report its address within 60 s");
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  // Workers.
  workers_.resize(spec.workers);
  for (int r = 0; r < spec.workers; ++r) {
    absl::Status s = Spawn(absl::StrCat("worker-", r),
                           {options_.worker_binary, "--spec=" + options_.spec_path,
                            absl::StrCat("--rank=", r), absl::StrCat("--world_size=", spec.workers),
                            "--shards=" + absl::StrJoin(addresses, ","),
                            "--output_dir=" + options_.output_dir},
                           true, &workers_[r]);
    if (!s.ok()) return s;
  }
  // Relay events until every worker is done; stop at the first failure.
  while (true) {
    std::vector<pollfd> fds;
    for (Child& w : workers_) {
      if (w.stdout_fd >= 0) fds.push_back({w.stdout_fd, POLLIN, 0});
    }
    if (!fds.empty()) poll(fds.data(), fds.size(), 200);
    else absl::SleepFor(absl::Milliseconds(50));
    for (Child& w : workers_) {
      if (w.stdout_fd < 0) continue;
      char buf[8192];
      while (true) {
        ssize_t n = read(w.stdout_fd, buf, sizeof(buf));
        if (n > 0) {
          w.partial.append(buf, n);
          size_t nl;
          while ((nl = w.partial.find('\n')) != std::string::npos) {
            on_event(w.partial.substr(0, nl));
            w.partial.erase(0, nl + 1);
          }
          continue;
        }
        if (n == 0) {  // EOF
          close(w.stdout_fd);
          w.stdout_fd = -1;
        }
        break;
      }
    }
    Reap();
    if (stop_requested) {
      Stop();
      return absl::CancelledError("interrupted; every shard and worker was stopped");
    }
    bool all_done = true;
    for (Child& w : workers_) {
      if (w.exited && w.exit_code != 0) {
        Stop();
        return ChildFailed(w, absl::StrCat("failed (exit code ", w.exit_code, ")"));
      }
      all_done = all_done && w.exited && w.stdout_fd < 0;
    }
    for (Child& s : shards_) {
      if (s.exited && !all_done) {
        Stop();
        return ChildFailed(s, absl::StrCat("exited during the job (code ", s.exit_code, ")"));
      }
    }
    if (all_done) break;
  }
  Stop();
  return absl::OkStatus();
}

void LocalCluster::Stop() {
  bool any = false;
  for (auto* group : {&workers_, &shards_}) {
    for (Child& c : *group) {
      if (c.pid > 0 && !c.exited) {
        kill(c.pid, SIGTERM);
        any = true;
      }
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (any && absl::Now() < deadline) {
    Reap();
    any = false;
    for (auto* group : {&workers_, &shards_}) {
      for (Child& c : *group) any = any || (c.pid > 0 && !c.exited);
    }
    if (any) absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto* group : {&workers_, &shards_}) {
    for (Child& c : *group) {
      if (c.pid > 0 && !c.exited) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        c.exited = true;
        c.exit_code = 128 + SIGKILL;
      }
      if (c.stdout_fd >= 0) {
        close(c.stdout_fd);
        c.stdout_fd = -1;
      }
    }
  }
}

}  // namespace pstrain
