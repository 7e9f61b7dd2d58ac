#include "client/local_cluster.h"

#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "proto/control.grpc.pb.h"
#include "rpc/grpc_channel.h"
#include "rpc/status_util.h"

namespace pstrain {
namespace {
bool IsTerminalState(JobState s) { return s == SUCCEEDED || s == FAILED || s == CANCELLED; }

// Submits the job as `pstrain submit` would; returns its id.
absl::StatusOr<std::string> SubmitJob(JobService::Stub& jobs, const LocalClusterOptions& options) {
  SubmitJobRequest submit;
  submit.set_spec_yaml(options.spec_yaml);
  submit.set_output_dir(options.output_dir);
  SubmitJobResponse submitted;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  absl::Status s = FromGrpcStatus(jobs.SubmitJob(&ctx, submit, &submitted));
  if (!s.ok()) return s;
  return submitted.job_id();
}

// Watches job `job_id` on a thread of its own, passing each status to
// `on_status` and keeping the latest in `last`, while this thread calls
// `check_cluster` every 50 ms. Returns at the end of the watch or at
// check_cluster's first error: that error; else, when the watch ended before
// a terminal state, the watch's own status; else OK.
absl::Status WatchJob(JobService::Stub& jobs, const std::string& job_id,
                      const std::function<void(const JobStatus&)>& on_status,
                      const std::function<absl::Status()>& check_cluster, JobStatus& last) {
  absl::Mutex mu;
  bool watch_done ABSL_GUARDED_BY(mu) = false;
  absl::Status watch_status ABSL_GUARDED_BY(mu);
  grpc::ClientContext watch_ctx;
  std::thread watcher([&] {
    WatchJobRequest req;
    req.set_job_id(job_id);
    auto reader = jobs.WatchJob(&watch_ctx, req);
    JobStatus st;
    while (reader->Read(&st)) {
      on_status(st);
      absl::MutexLock lock(&mu);
      last = st;
    }
    grpc::Status end = reader->Finish();
    absl::MutexLock lock(&mu);
    watch_status = FromGrpcStatus(end);
    watch_done = true;
  });
  absl::Status failure;
  while (true) {
    {
      absl::MutexLock lock(&mu);
      if (watch_done) break;
    }
    failure = check_cluster();
    if (!failure.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  watch_ctx.TryCancel();
  watcher.join();
  absl::MutexLock lock(&mu);
  if (failure.ok() && !IsTerminalState(last.state())) failure = watch_status;
  return failure;
}

// For a FAILED job: the coordinator's reason with the end of the log of the
// worker it blames; OK when the reason names no worker.
absl::Status QuoteBlamedWorkerLog(const JobStatus& failed, const std::string& logs) {
  const std::string why = failed.conditions().empty() ? "" : failed.conditions().rbegin()->message();
  std::smatch m;
  if (!std::regex_search(why, m, std::regex("worker[ -](\\d+)"))) return absl::OkStatus();
  const std::string log = absl::StrCat(logs, "/worker-", m[1].str(), ".log");
  return absl::AbortedError(absl::StrCat(why, "; last lines of ", log, ":\n", TailFile(log, 15)));
}
}  // namespace

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

absl::Status LocalCluster::Spawn(const std::string& name, const std::vector<std::string>& argv) {
  Child child;
  child.name = name;
  child.log_path = absl::StrCat(options_.output_dir, "/logs/", name, ".log");
  SpawnOptions o;
  o.argv = argv;
  o.log_path = child.log_path;
  o.parent_death_signal = SIGINT;  // stop now (SIGTERM would drain a worker)
  o.own_process_group = true;      // Ctrl-C reaches the launcher only; it stops the children
  // One BLAS thread: LibTorch's own threads are the ones to size.
  o.env = {{"OPENBLAS_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", std::to_string(options_.spec.threads_per_worker)}};
  absl::StatusOr<pid_t> pid = pstrain::Spawn(o);
  if (!pid.ok()) return pid.status();
  child.pid = *pid;
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

absl::Status LocalCluster::ChildFailed(const Child& c, const std::string& what) const {
  return absl::AbortedError(absl::StrCat(c.name, " ", what, "; last lines of ", c.log_path, ":\n",
                                         TailFile(c.log_path, 15)));
}

void LocalCluster::Reap() {
  for (Child& c : children_) {
    if (c.pid <= 0 || c.exited) continue;
    if (std::optional<int> code = PollExit(c.pid)) {
      c.exited = true;
      c.exit_code = *code;
    }
  }
}

absl::StatusOr<std::string> LocalCluster::WaitForAddress(const std::string& port_file, Child& child,
                                                         const std::atomic<bool>& stop_requested) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    if (std::optional<std::string> address = FirstLine(port_file)) return *address;
    Reap();
    if (child.exited) return ChildFailed(child, absl::StrCat("exited with code ", child.exit_code, " while starting"));
    if (stop_requested) return absl::CancelledError("interrupted");
    if (absl::Now() > deadline) return ChildFailed(child, "did not report its address within 60 s");
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status LocalCluster::MakeCredentials() {
  auto made = WriteLocalCredentials(options_.output_dir + "/credentials");
  if (!made.ok()) return made.status();
  credentials_ = *made;
  return absl::OkStatus();
}

std::vector<std::string> LocalCluster::SecurityFlags(const std::string& role) const {
  if (!credentials_.has_value()) return {};
  const LocalCredentials& c = *credentials_;
  const std::string& token = role == "coordinator" ? c.coordinator_token_file
                             : role == "shard"     ? c.shard_token_file
                                                   : c.worker_token_file;
  std::vector<std::string> flags = {"--tls_ca=" + c.ca, "--tls_cert=" + c.cert, "--tls_key=" + c.key,
                                    "--token_file=" + token};
  if (role != "worker") flags.push_back("--token_auth_file=" + c.token_auth_file);
  if (role == "coordinator") flags.push_back("--table_grant_key_file=" + c.table_grant_key_file);
  if (role == "shard") flags.push_back("--table_grant_public_key_file=" + c.table_grant_public_key_file);
  return flags;
}

std::vector<std::string> LocalCluster::WithSecurity(std::vector<std::string> argv, const std::string& role) const {
  for (std::string& flag : SecurityFlags(role)) argv.push_back(std::move(flag));
  return argv;
}

absl::Status LocalCluster::StartCoordinator(const std::atomic<bool>& stop_requested) {
  const std::string logs = options_.output_dir + "/logs";
  // The coordinator; members re-check it every 200 ms and are lost after 2 s.
  const std::string coord_file = logs + "/coordinator.addr";
  std::filesystem::remove(coord_file);
  const std::string http_file = logs + "/dashboard.addr";
  std::filesystem::remove(http_file);
  std::vector<std::string> coordinator_argv = {options_.coordinator_binary,
                                               "--host=127.0.0.1",
                                               "--port=0",
                                               "--port_file=" + coord_file,
                                               "--db=" + options_.output_dir + "/coordinator.db",
                                               "--heartbeat_ms=200",
                                               "--missed_heartbeats=10",
                                               "--checkpoint_root=" + options_.output_dir};
  if (options_.http_port >= 0) {
    coordinator_argv.push_back(absl::StrCat("--http_port=", options_.http_port));
    coordinator_argv.push_back("--http_port_file=" + http_file);
  }
  absl::Status s = Spawn("coordinator", WithSecurity(std::move(coordinator_argv), "coordinator"));
  if (!s.ok()) return s;
  Child& coordinator_child = children_.back();
  auto address = WaitForAddress(coord_file, coordinator_child, stop_requested);
  if (!address.ok()) return address.status();
  coordinator_ = *address;
  if (options_.http_port >= 0) {
    // Written before the gRPC port file, so it is there now.
    std::optional<std::string> http = FirstLine(http_file);
    if (http.has_value() && options_.on_dashboard) {
      // Plain HTTP on 127.0.0.1 (see server/coordinator/dashboard.h); with
      // --secure its API asks for the user's token.
      options_.on_dashboard(absl::StrCat("http://", *http, "/",
                                         credentials_.has_value()
                                             ? absl::StrCat(" (token: ", credentials_->user_token_file, ")")
                                             : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::StartShardsAndWorkers() {
  const JobSpec& spec = options_.spec;
  for (int i = 0; i < spec.shards; ++i) {
    absl::Status s = Spawn(absl::StrCat("shard-", i),
                           WithSecurity({options_.ps_binary, "--host=127.0.0.1", "--port=0",
                                         "--advertise_host=127.0.0.1", "--coordinator=" + coordinator_,
                                         absl::StrCat("--name=shard-", i), absl::StrCat("--shard_index=", i),
                                         absl::StrCat("--num_shards=", spec.shards),
                                         "--checkpoint_root=" + options_.output_dir},
                                        "shard"));
    if (!s.ok()) return s;
  }
  for (int r = 0; r < spec.workers; ++r) {
    // All on this machine: gloo peers meet on the loopback interface.
    std::vector<std::string> worker_argv = {options_.worker_binary, "--coordinator=" + coordinator_,
                                            absl::StrCat("--name=worker-", r), "--gloo_hostname=127.0.0.1"};
    if (!options_.data_root.empty()) worker_argv.push_back("--data_root=" + options_.data_root);
    absl::Status s = Spawn(absl::StrCat("worker-", r), WithSecurity(std::move(worker_argv), "worker"));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

SecurityOptions LocalCluster::UserSecurity() const {
  SecurityOptions user = ProcessSecurity();
  if (credentials_.has_value()) {
    user.tls_ca = credentials_->ca;
    user.token_file = credentials_->user_token_file;
  }
  return user;
}

absl::Status LocalCluster::CheckChildren(const std::atomic<bool>& stop_requested) {
  Reap();
  if (stop_requested) return absl::CancelledError("interrupted; every process of the cluster was stopped");
  for (const Child& c : children_) {
    if (c.exited) return ChildFailed(c, absl::StrCat("exited during the job (code ", c.exit_code, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobStatus> LocalCluster::Run(const std::function<void(const JobStatus&)>& on_status,
                                            const std::atomic<bool>& stop_requested) {
  const std::string logs = options_.output_dir + "/logs";
  std::filesystem::create_directories(logs);
  if (options_.secure) {
    absl::Status made = MakeCredentials();
    if (!made.ok()) return made;
  }
  absl::Status s = StartCoordinator(stop_requested);
  if (!s.ok()) return s;
  s = StartShardsAndWorkers();
  if (!s.ok()) return s;

  // Submit through the JobService, as `pstrain submit` would.
  // With --secure, as the user of the token file made for this run.
  auto jobs = JobService::NewStub(CreateChannel(coordinator_, 64 << 20, UserSecurity()));
  absl::StatusOr<std::string> job_id = SubmitJob(*jobs, options_);
  if (!job_id.ok()) return job_id.status();

  JobStatus last;
  absl::Status failure =
      WatchJob(*jobs, *job_id, on_status, [&] { return CheckChildren(stop_requested); }, last);
  if (failure.ok() && last.state() == FAILED) failure = QuoteBlamedWorkerLog(last, logs);
  Stop();
  if (!failure.ok()) return failure;
  return last;
}

void LocalCluster::Stop() {
  bool any = false;
  for (Child& c : children_) {
    if (c.pid > 0 && !c.exited) {
      kill(c.pid, SIGINT);  // stop now: SIGTERM would make workers drain
      any = true;
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (any && absl::Now() < deadline) {
    Reap();
    any = false;
    for (Child& c : children_) any = any || (c.pid > 0 && !c.exited);
    if (any) absl::SleepFor(absl::Milliseconds(20));
  }
  for (Child& c : children_) {
    if (c.pid > 0 && !c.exited) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
      c.exited = true;
      c.exit_code = 128 + SIGKILL;
    }
  }
}

}  // namespace pstrain
