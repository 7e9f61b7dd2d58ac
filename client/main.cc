// pstrain: the command-line client.
//
//   pstrain local JOB.yaml [--output_dir DIR] [--data_root DIR]   a whole cluster on this machine
//   pstrain submit JOB.yaml [--output_dir DIR]  prints the job id
//   pstrain status JOB | list | watch JOB | cancel JOB | scale JOB --workers N | cluster
//
// The coordinator is --coordinator HOST:PORT, else $PSTRAIN_COORDINATOR,
// else 127.0.0.1:7000. -o table (default) or -o json.
//
// Exit codes: 0 success; 1 the job failed or was cancelled (watch, local);
// 2 bad usage or an invalid job spec; 3 the coordinator is unreachable;
// 4 no such job; 130 interrupted.
#include <grpcpp/client_context.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "client/cli_security.h"
#include "client/credentials_command.h"
#include "client/embedding_export_command.h"
#include "client/local_cluster.h"
#include "rpc/health_check.h"
#include "client/progress_view.h"
#include "client/quantize_command.h"
#include "client/render.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "proto/control.grpc.pb.h"
#include "rpc/grpc_channel.h"
#include "rpc/status_util.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

constexpr int kFailed = 1, kUsage = 2, kUnreachable = 3, kNoSuchJob = 4, kInterrupted = 130;

int ExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: return kUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: return kUnreachable;
    case absl::StatusCode::kNotFound: return kNoSuchJob;
    default: return kFailed;
  }
}

int Fail(const absl::Status& s, const std::string& coordinator) {
  const std::string msg(s.message());
  const bool unreachable = s.code() == absl::StatusCode::kDeadlineExceeded ||
                           (s.code() == absl::StatusCode::kUnavailable &&
                            (msg.find("failed to connect") != std::string::npos ||
                             msg.find("Connection refused") != std::string::npos ||
                             msg.find("Socket closed") != std::string::npos));
  if (unreachable) {
    std::fprintf(stderr, "pstrain: cannot reach the coordinator at %s (%s); set --coordinator or PSTRAIN_COORDINATOR\n",
                 coordinator.c_str(), msg.c_str());
    return kUnreachable;
  }
  std::fprintf(stderr, "pstrain: %s\n", msg.c_str());
  return s.code() == absl::StatusCode::kUnavailable ? kFailed : ExitCodeFor(s);
}


std::string FindBinary(const char* env, const std::string& name, const std::string& bazel_rel) {
  if (const char* v = std::getenv(env)) return v;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (const auto& candidate : {dir / name, dir / ".." / bazel_rel}) {
    if (std::filesystem::exists(candidate, ec)) return std::filesystem::canonical(candidate, ec).string();
  }
  return name;
}

class Client {
 public:
  explicit Client(std::string target)
      : target_(std::move(target)), stub_(pstrain::JobService::NewStub(pstrain::CreateChannel(target_, 64 << 20))) {}
  const std::string& target() const { return target_; }
  pstrain::JobService::Stub* stub() { return stub_.get(); }
  static void Deadline(grpc::ClientContext* ctx, absl::Duration d = absl::Seconds(15)) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  }

 private:
  std::string target_;
  std::unique_ptr<pstrain::JobService::Stub> stub_;
};

// Streams the job's status into `view` until it ends; the job's final status.
absl::StatusOr<pstrain::JobStatus> Watch(Client& c, const std::string& job, pstrain::ProgressView& view) {
  grpc::ClientContext ctx;
  pstrain::WatchJobRequest req;
  req.set_job_id(job);
  auto reader = c.stub()->WatchJob(&ctx, req);
  pstrain::JobStatus st, last;
  while (!g_stop && reader->Read(&st)) {
    view.OnStatus(st);
    last = st;
  }
  if (g_stop) {
    ctx.TryCancel();
    reader->Finish();
    return absl::CancelledError("interrupted");
  }
  absl::Status s = pstrain::FromGrpcStatus(reader->Finish());
  if (!s.ok()) return s;
  return last;
}

int JobOutcome(const pstrain::JobStatus& st, pstrain::ProgressView& view) {
  view.ClearLine();
  std::printf("%s\n", pstrain::SummaryLine(st).c_str());
  return st.state() == pstrain::SUCCEEDED ? 0 : kFailed;
}

// One unary JobService call under a deadline, as an absl::Status.
template <typename Req, typename Resp>
absl::Status Call(Client& c,
                  grpc::Status (pstrain::JobService::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
                  const Req& req, Resp* resp, absl::Duration deadline = absl::Seconds(15)) {
  grpc::ClientContext ctx;
  Client::Deadline(&ctx, deadline);
  return pstrain::FromGrpcStatus((c.stub()->*rpc)(&ctx, req, resp));
}

// What the command line asked for.
struct Args {
  std::string coordinator;
  bool json = false;
  std::string spec_path, output_dir, job_id, resume, export_path, export_embeddings, health_target, health_service;
  int workers = 0;
  bool secure = false;
  int http_port = 0;
  std::string data_root;
  pstrain::QuantizeArgs quantize;
};

// A command's answer: the call's failure (Fail), or the message `m`, as
// JSON with -o json, else shown to a person by `print`. The exit code.
template <typename Message, typename Print>
int Answer(const absl::Status& s, const Args& a, const Message& m, Print print) {
  if (!s.ok()) return Fail(s, a.coordinator);
  if (a.json) {
    std::printf("%s\n", Json(m).c_str());
  } else {
    print(m);
  }
  return 0;
}

// The spec file's text, read and checked (its parsed form in *spec).
absl::StatusOr<std::string> ReadSpec(const std::string& path, pstrain::JobSpec* spec) {
  auto text = pstrain::ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("cannot read job spec ", path));
  auto parsed = pstrain::ParseJobSpec(*text, path);
  if (!parsed.ok()) return parsed.status();
  absl::Status names = pstrain::CheckDataFileNames(*parsed, path);
  if (!names.ok()) return names;
  *spec = *parsed;
  return *text;
}

int RunLocal(const Args& a) {
  pstrain::JobSpec spec;
  auto yaml = ReadSpec(a.spec_path, &spec);
  if (!yaml.ok()) {
    std::fprintf(stderr, "pstrain: %s\n", std::string(yaml.status().message()).c_str());
    return kUsage;
  }
  pstrain::LocalClusterOptions o;
  o.spec_yaml = *yaml;
  o.spec = spec;
  o.output_dir = std::filesystem::absolute(a.output_dir.empty() ? spec.output_dir : a.output_dir).string();
  if (!a.data_root.empty()) o.data_root = std::filesystem::absolute(a.data_root).string();
  o.secure = a.secure;
  o.http_port = a.http_port;
  o.on_dashboard = [](const std::string& url) {
    std::printf("dashboard: %s (live curves, ranks, shards; open it in a browser)\n", url.c_str());
    std::fflush(stdout);
  };
  o.coordinator_binary = FindBinary("PSTRAIN_COORDINATOR_BIN", "pstrain-coordinator",
                                    "server/coordinator/pstrain-coordinator");
  o.ps_binary = FindBinary("PSTRAIN_PS_BIN", "pstrain-ps", "server/ps/pstrain-ps");
  o.worker_binary = FindBinary("PSTRAIN_WORKER_BIN", "pstrain-worker", "worker/pstrain-worker");
  for (const std::string& b : {o.coordinator_binary, o.ps_binary, o.worker_binary}) {
    if (access(b.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "pstrain: cannot find %s (build with `bazel build //...`)\n", b.c_str());
      return kUsage;
    }
  }
  std::printf("pstrain local: job '%s': %s, %d shard(s), %d worker(s), %s, %d epoch(s), batch %lld\n",
              spec.name.c_str(), spec.model.c_str(), spec.shards, spec.workers,
              spec.consistency == pstrain::SYNC ? "sync" : spec.consistency == pstrain::SSP ? "ssp" : "async",
              spec.epochs, static_cast<long long>(spec.batch_size));
  std::printf("output: %s (logs in %s/logs)\n", o.output_dir.c_str(), o.output_dir.c_str());
  std::fflush(stdout);
  pstrain::ProgressView view(stdout, isatty(STDOUT_FILENO) == 1);
  pstrain::LocalCluster cluster_run(o);
  auto st = cluster_run.Run([&](const pstrain::JobStatus& s) { view.OnStatus(s); }, g_stop);
  view.ClearLine();
  if (!st.ok()) {
    std::fprintf(stderr, "pstrain: job '%s' %s\n", spec.name.c_str(), std::string(st.status().message()).c_str());
    return g_stop ? kInterrupted : kFailed;
  }
  const int outcome = JobOutcome(*st, view);
  std::printf("curves: tensorboard --logdir %s/tensorboard\n", pstrain::JobDir(o.output_dir, st->job_id()).c_str());
  return outcome;
}

int RunHealth(const Args& a) {
  auto st = pstrain::CheckHealth(a.health_target, a.health_service, absl::Seconds(10));
  if (!st.ok()) {
    std::fprintf(stderr, "pstrain: %s: %s\n", a.health_target.c_str(), std::string(st.status().message()).c_str());
    return st.status().code() == absl::StatusCode::kNotFound ? kFailed : kUnreachable;
  }
  std::printf("%s\n", st->c_str());
  return *st == "SERVING" ? 0 : kFailed;
}

// submit, and restore (a submit with resume_from).
int RunSubmit(Client& client, const Args& a) {
  pstrain::SubmitJobRequest req;
  if (!a.spec_path.empty()) {
    pstrain::JobSpec spec;
    auto yaml = ReadSpec(a.spec_path, &spec);
    if (!yaml.ok()) {
      std::fprintf(stderr, "pstrain: %s\n", std::string(yaml.status().message()).c_str());
      return kUsage;
    }
    req.set_spec_yaml(*yaml);
  }
  // Paths are the cluster's, not this machine's: a relative one is taken
  // from the coordinator's working directory (in Kubernetes, the shared
  // volume every member mounts at the same place).
  if (!a.resume.empty()) req.set_resume_from(a.resume);
  if (!a.output_dir.empty()) req.set_output_dir(a.output_dir);
  pstrain::SubmitJobResponse resp;
  absl::Status s = Call(client, &pstrain::JobService::Stub::SubmitJob, req, &resp);
  if (!s.ok()) return Fail(s, a.coordinator);
  std::printf(a.json ? "{\"job_id\": \"%s\"}\n" : "%s\n", resp.job_id().c_str());
  return 0;
}

int RunStatus(Client& client, const Args& a) {
  pstrain::GetJobRequest req;
  req.set_job_id(a.job_id);
  pstrain::JobStatus st;
  return Answer(Call(client, &pstrain::JobService::Stub::GetJob, req, &st), a, st, PrintJobTable);
}

int RunList(Client& client, const Args& a) {
  pstrain::ListJobsResponse resp;
  return Answer(Call(client, &pstrain::JobService::Stub::ListJobs, pstrain::ListJobsRequest(), &resp), a, resp,
                PrintJobList);
}

int RunWatch(Client& client, const Args& a) {
  pstrain::ProgressView view(stdout, isatty(STDOUT_FILENO) == 1);
  auto st = Watch(client, a.job_id, view);
  if (!st.ok()) {
    view.ClearLine();
    if (g_stop) return kInterrupted;
    return Fail(st.status(), a.coordinator);
  }
  return JobOutcome(*st, view);
}

int RunCheckpoint(Client& client, const Args& a) {
  pstrain::CheckpointRequest req;
  req.set_job_id(a.job_id);
  pstrain::CheckpointResponse resp;
  absl::Status s = Call(client, &pstrain::JobService::Stub::Checkpoint, req, &resp, absl::Minutes(15));
  if (!s.ok()) return Fail(s, a.coordinator);
  std::printf(a.json ? "{\"path\": \"%s\", \"step\": %lld}\n" : "%s (step %lld)\n", resp.path().c_str(),
              static_cast<long long>(resp.step()));
  return 0;
}

// --embeddings: a dlrm job's tables, from its newest checkpoint.
int ExportEmbeddings(const pstrain::JobStatus& st, const Args& a) {
  const std::string dir = st.last_checkpoint().empty() ? st.resumed_from() : st.last_checkpoint();
  if (dir.empty()) {
    std::fprintf(stderr,
                 "pstrain: job %s has no checkpoint; its embedding tables are exported from its newest checkpoint "
                 "(checkpoint_every_steps, or `pstrain checkpoint %s` while it runs)\n",
                 a.job_id.c_str(), a.job_id.c_str());
    return kFailed;
  }
  const std::string tool = FindBinary("PSTRAIN_EMBEDDING_EXPORT_BIN", "embedding_export_tool",
                                      "worker/embedding_export_tool");
  auto step = pstrain::ExportCheckpointEmbeddings(dir, a.export_embeddings, tool, absl::Minutes(30));
  if (!step.ok()) return Fail(step.status(), a.coordinator);
  std::printf("%s (embedding tables of %s, step %lld)\n", a.export_embeddings.c_str(), dir.c_str(),
              static_cast<long long>(*step));
  return 0;
}

int RunExport(Client& client, const Args& a) {
  if (a.export_path.empty() && a.export_embeddings.empty()) {
    std::fprintf(stderr, "pstrain: export needs -f FILE (the final weights), --embeddings FILE, or both\n");
    return kUsage;
  }
  if (!a.quantize.mode.empty() && a.export_path.empty()) {
    std::fprintf(stderr, "pstrain: export --quantize converts the final weights: it needs -f FILE\n");
    return kUsage;
  }
  pstrain::GetJobRequest req;
  req.set_job_id(a.job_id);
  pstrain::JobStatus st;
  absl::Status s = Call(client, &pstrain::JobService::Stub::GetJob, req, &st);
  if (!s.ok()) return Fail(s, a.coordinator);
  if (!a.export_embeddings.empty()) {
    const int code = ExportEmbeddings(st, a);
    if (code != 0 || a.export_path.empty()) return code;
  }
  if (st.weights_path().empty()) {
    std::fprintf(stderr, "pstrain: job %s has no final weights yet (it is %s); export works on a finished job\n",
                 a.job_id.c_str(), StateName(st.state()));
    return kFailed;
  }
  auto bytes = pstrain::ReadFile(st.weights_path());
  if (!bytes.ok()) {
    std::fprintf(stderr, "pstrain: cannot read %s (is its file system mounted here?)\n", st.weights_path().c_str());
    return kFailed;
  }
  s = pstrain::WriteFileAtomically(a.export_path, *bytes);
  if (!s.ok()) return Fail(s, a.coordinator);
  std::printf("%s\n", a.export_path.c_str());
  if (a.quantize.mode.empty()) return 0;
  return pstrain::RunQuantize(
      a.quantize, FindBinary("PSTRAIN_QUANTIZE_BIN", "pstrain-quantize", "quantize/pstrain-quantize"), a.export_path);
}

int RunCancel(Client& client, const Args& a) {
  pstrain::CancelJobRequest req;
  req.set_job_id(a.job_id);
  pstrain::CancelJobResponse resp;
  absl::Status s = Call(client, &pstrain::JobService::Stub::CancelJob, req, &resp);
  if (!s.ok()) return Fail(s, a.coordinator);
  std::printf(a.json ? "{\"job_id\": \"%s\", \"state\": \"%s\"}\n" : "%s %s\n", a.job_id.c_str(),
              StateName(resp.state()));
  return 0;
}

int RunScale(Client& client, const Args& a) {
  pstrain::ScaleJobRequest req;
  req.set_job_id(a.job_id);
  req.set_workers(a.workers);
  pstrain::JobStatus st;
  return Answer(Call(client, &pstrain::JobService::Stub::ScaleJob, req, &st), a, st,
                [&](const pstrain::JobStatus& m) {
                  std::printf("%s: %d workers asked for, %d training now\n", a.job_id.c_str(), a.workers,
                              m.num_workers() - m.vacant_ranks_size());
                });
}

int RunCluster(Client& client, const Args& a) {
  pstrain::ListMembersResponse resp;
  return Answer(Call(client, &pstrain::JobService::Stub::ListMembers, pstrain::ListMembersRequest(), &resp), a,
                resp, PrintMembers);
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"pstrain: distributed training for LibTorch models"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may come after the subcommand
  Args a;
  std::string output = "table";
  if (const char* env = std::getenv("PSTRAIN_COORDINATOR")) a.coordinator = env;
  app.add_option("--coordinator", a.coordinator, "coordinator host:port (default $PSTRAIN_COORDINATOR or 127.0.0.1:7000)");
  app.add_option("-o,--output", output, "table or json")->check(CLI::IsMember({"table", "json"}));
  pstrain::SecurityOptions security;
  pstrain::AddSecurityOptions(app, &security);
  // Each subcommand and what runs it: with the coordinator's client, or not.
  std::vector<std::pair<CLI::App*, std::function<int(Client&)>>> commands;
  auto with_client = [&](CLI::App* cmd, int (*run)(Client&, const Args&)) {
    commands.emplace_back(cmd, [run, &a](Client& c) { return run(c, a); });
    return cmd;
  };
  auto standalone = [&](CLI::App* cmd, int (*run)(const Args&)) {
    commands.emplace_back(cmd, [run, &a](Client&) { return run(a); });
    return cmd;
  };
  CLI::App* local = standalone(app.add_subcommand("local", "run a job on a whole cluster on this machine"), RunLocal);
  local->add_option("spec", a.spec_path, "job spec (YAML)")->required();
  local->add_option("--output_dir", a.output_dir, "overrides the spec's output_dir");
  local->add_flag("--secure", a.secure, "TLS and tokens between every process (credentials made for the run)");
  local->add_option("--http_port", a.http_port, "the dashboard's port on 127.0.0.1 (0 picks one, -1 off)");
  local->add_option("--data_root", a.data_root,
                    "the workers' --data_root: the spec's data files and torchscript: models are named relative "
                    "to it (default: data/ in the working directory; make demo uses /usr/share/datasets)");
  CLI::App* submit = with_client(app.add_subcommand("submit", "submit a job; prints its id"), RunSubmit);
  submit->add_option("spec", a.spec_path, "job spec (YAML)")->required();
  submit->add_option("--output_dir", a.output_dir, "overrides the spec's output_dir");
  submit->add_option("--resume", a.resume, "start from this checkpoint directory (ckpt-<step>/)");
  with_client(app.add_subcommand("status", "a job's status"), RunStatus)->add_option("job", a.job_id)->required();
  with_client(app.add_subcommand("list", "every job"), RunList);
  with_client(app.add_subcommand("watch", "live progress until the job ends; exit code = result"), RunWatch)
      ->add_option("job", a.job_id)
      ->required();
  with_client(app.add_subcommand("cancel", "cancel a job"), RunCancel)->add_option("job", a.job_id)->required();
  CLI::App* scale = with_client(
      app.add_subcommand("scale", "change a running ps job's worker count (min_workers..workers)"), RunScale);
  scale->add_option("job", a.job_id)->required();
  scale->add_option("--workers", a.workers, "the new worker count")->required();
  with_client(app.add_subcommand("cluster", "the pool: shards and workers and their health"), RunCluster);
  with_client(app.add_subcommand("checkpoint", "checkpoint a running job now; prints the directory"), RunCheckpoint)
      ->add_option("job", a.job_id)
      ->required();
  CLI::App* restore = with_client(
      app.add_subcommand("restore", "a new job continuing from a checkpoint (its spec, or --spec)"), RunSubmit);
  restore->add_option("--from", a.resume, "checkpoint directory (ckpt-<step>/)")->required();
  restore->add_option("--spec", a.spec_path, "job spec to use instead of the checkpoint's (e.g. more shards)");
  restore->add_option("--output_dir", a.output_dir, "overrides the spec's output_dir");
  CLI::App* export_cmd = with_client(
      app.add_subcommand("export", "write a finished job's weights, or a dlrm job's embedding tables (torch.load "
                                   "reads them)"),
      RunExport);
  export_cmd->add_option("job", a.job_id)->required();
  export_cmd->add_option("-f,--file", a.export_path, "destination of the final weights");
  export_cmd->add_option("--embeddings", a.export_embeddings,
                         "destination of the embedding tables of the job's newest checkpoint (model dlrm)");
  pstrain::AddQuantizeOptions(export_cmd, &a.quantize);
  CLI::App* health = standalone(
      app.add_subcommand("health", "ask a server (coordinator, shard) for its gRPC health; exit 0 when SERVING"),
      RunHealth);
  health->add_option("address", a.health_target, "host:port")->required();
  health->add_option("--service", a.health_service, "a service name (default: the whole server)");
  pstrain::CredentialsArgs credentials;
  CLI::App* credentials_cmd = pstrain::AddCredentialsCommand(app, &credentials);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsage;
  }
  if (credentials_cmd->parsed()) return pstrain::RunCredentials(credentials);
  if (a.coordinator.empty()) a.coordinator = "127.0.0.1:7000";
  a.json = output == "json";
  if (absl::Status s = pstrain::InstallClientSecurity(security); !s.ok()) {
    std::fprintf(stderr, "pstrain: %s\n", std::string(s.message()).c_str());
    return kUsage;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  for (auto& [cmd, run] : commands) {
    if (!cmd->parsed()) continue;
    Client client(a.coordinator);
    return run(client);
  }
  return kUsage;
}

// No exception ends the CLI with a core dump: it is reported and exits 1.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain: internal error: %s\n", e.what());
    return 1;
  }
}
