// LocalCluster: a whole pstrain cluster as child processes on 127.0.0.1,
// for `pstrain local`: a coordinator, the job's shards and workers (pool
// members that register with the coordinator), then the job submitted and
// watched through the same JobService API a remote user has. Every server
// binds port 0 and reports its address through a file; every child's output
// goes to <output_dir>/logs/<name>.log.
//
// Stop() (also run by the destructor, on Ctrl-C and on any failure) sends
// SIGTERM to every child, then SIGKILL to those still running after a grace
// period; children also die with the launcher (PR_SET_PDEATHSIG), so no run
// leaves orphans.
#ifndef PSTRAIN_CLIENT_LOCAL_CLUSTER_H_
#define PSTRAIN_CLIENT_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "proto/control.pb.h"
#include "rpc/local_credentials.h"
#include "rpc/security.h"

namespace pstrain {

struct LocalClusterOptions {
  std::string spec_yaml;
  JobSpec spec;
  std::string coordinator_binary;
  std::string ps_binary;
  std::string worker_binary;
  std::string output_dir;
  // The workers' --data_root (the directory a spec's data files and
  // TorchScript models are named relative to); empty: the workers' default,
  // data/ in the working directory.
  std::string data_root;
  // TLS and tokens between every process (`pstrain local --secure`): a CA,
  // certificates and tokens made for this run in <output_dir>/credentials.
  bool secure = false;
  // The coordinator's web dashboard on 127.0.0.1 (0 picks a port; -1 off);
  // `on_dashboard` is told its URL once it serves.
  int http_port = 0;
  std::function<void(const std::string& url)> on_dashboard;
};

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  ~LocalCluster() { Stop(); }

  // Runs the job to its end and returns its final status (whatever the
  // outcome). An error means the cluster itself failed (a process died, an
  // interrupt): it names the process and quotes the end of its log.
  absl::StatusOr<JobStatus> Run(const std::function<void(const JobStatus&)>& on_status,
                                const std::atomic<bool>& stop_requested);
  void Stop();

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    std::string log_path;
    bool exited = false;
    int exit_code = 0;
  };
  absl::Status Spawn(const std::string& name, const std::vector<std::string>& argv);
  absl::StatusOr<std::string> WaitForAddress(const std::string& port_file, Child& child,
                                             const std::atomic<bool>& stop_requested);
  absl::Status ChildFailed(const Child& c, const std::string& what) const;
  void Reap();
  // With `secure`: makes the credentials; the flags each process gets
  // (`role`: coordinator, shard or worker; each has its own token, and the
  // coordinator and the shards the table grant key).
  absl::Status MakeCredentials();
  std::vector<std::string> SecurityFlags(const std::string& role) const;
  // `argv` with SecurityFlags(role) appended.
  std::vector<std::string> WithSecurity(std::vector<std::string> argv, const std::string& role) const;
  // The security of the user who submits and watches the job: with
  // `secure`, the user token made for this run.
  SecurityOptions UserSecurity() const;

  // The steps of Run: the coordinator, up to its address in coordinator_
  // (and the dashboard's URL told); then the job's shards and workers.
  absl::Status StartCoordinator(const std::atomic<bool>& stop_requested);
  absl::Status StartShardsAndWorkers();
  // While the job runs: an error when interrupted or when a child exited.
  absl::Status CheckChildren(const std::atomic<bool>& stop_requested);

  LocalClusterOptions options_;
  std::vector<Child> children_;  // coordinator, shards, workers
  std::string coordinator_;
  std::optional<LocalCredentials> credentials_;
};

// Last `n` lines of a file ("" if unreadable).
std::string TailFile(const std::string& path, int n);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_LOCAL_CLUSTER_H_
