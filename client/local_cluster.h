// LocalCluster: runs a job's shards and workers as child processes on
// 127.0.0.1 for `pstrain local`. Shards bind port 0 and report their address
// through a file; workers get the addresses on their command line and report
// progress as JSON lines on stdout, which are handed to `on_event`. Each
// child's stderr goes to <output_dir>/logs/<name>.log.
//
// Stop() (also run by the destructor, and on any child failure) sends
// SIGTERM to every child, then SIGKILL to those still running after a grace
// period; children also die with the launcher (PR_SET_PDEATHSIG), so no run
// leaves orphans.
#ifndef PSTRAIN_CLIENT_LOCAL_CLUSTER_H_
#define PSTRAIN_CLIENT_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace pstrain {

struct LocalClusterOptions {
  std::string spec_path;
  JobSpec spec;
  std::string ps_binary;
  std::string worker_binary;
  std::string output_dir;
};

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  ~LocalCluster() { Stop(); }

  // Starts the shards, waits for their addresses, starts the workers, and
  // runs until every worker has exited. Returns OK when all workers exited
  // 0; otherwise an error naming the failing process with the last lines of
  // its log. `stop_requested` (set from a signal handler) ends it early.
  absl::Status Run(const std::function<void(const std::string& line)>& on_event,
                   const std::atomic<bool>& stop_requested);
  void Stop();

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    int stdout_fd = -1;
    std::string log_path;
    std::string partial;  // incomplete stdout line
    bool exited = false;
    int exit_code = 0;
  };
  absl::Status Spawn(const std::string& name, const std::vector<std::string>& argv,
                     bool capture_stdout, Child* child);
  absl::Status ChildFailed(const Child& c, const std::string& what) const;
  void Reap();

  LocalClusterOptions options_;
  std::vector<Child> shards_;
  std::vector<Child> workers_;
};

// Last `n` lines of a file ("" if unreadable).
std::string TailFile(const std::string& path, int n);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_LOCAL_CLUSTER_H_
