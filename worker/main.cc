// pstrain-worker: trains one rank of a job against the parameter shards.
//
// Standalone (pstrain local without a coordinator, tests):
//   pstrain-worker --spec=job.yaml --rank=0 --world_size=2 --shards=H:P,H:P
// Pool member (Kubernetes, pstrain local):
//   pstrain-worker --coordinator=H:P [--name=worker-0]
//   registers with the coordinator, waits for an assignment, trains it,
//   reports progress, and waits for the next one until SIGTERM.
//   SIGTERM drains: the running job goes on until the coordinator has
//   checkpointed it and stopped it (it resumes elsewhere from that
//   checkpoint), at most --drain_timeout_s, then the worker exits 0.
//   SIGINT stops at the next step boundary.
//
// Events (one JSON object per line) go to stdout and, as a pool member, to
// the coordinator; logs go to stderr. Exit code: 0 success, 1 a training
// error, 2 bad flags, spec or data.
#include <ATen/Parallel.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/manifest.h"
#include "common/binary_setup.h"
#include "common/env_flags.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "common/malloc_tuning.h"
#include "common/metrics_server.h"
#include "google/protobuf/util/json_util.h"
#include "proto/events.pb.h"
#include "rpc/cluster_member.h"
#include "rpc/grpc_channel.h"
#include "rpc/grpc_embedding_client.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/shard_routing.h"
#include "rpc/security_flags.h"
#include "spdlog/spdlog.h"
#include "worker/activity.h"
#include "worker/allreduce_setup.h"
#include "worker/ctr_trainer.h"
#include "worker/device.h"
#include "worker/launch_env.h"
#include "worker/checkpoint_buffers.h"
#include "worker/pause_protocol.h"
#include "worker/sparse_embeddings.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, spec, "", "Job spec (YAML), standalone mode.");
ABSL_FLAG(int, rank, -1,
          "This worker's rank, 0 <= rank < world_size (standalone; default: RANK, else the StatefulSet "
          "ordinal of the host name, pstrain-worker-3 -> 3, else 0).");
ABSL_FLAG(int, world_size, 0, "Number of workers (default: the spec's `workers`).");
ABSL_FLAG(std::string, shards, "", "Comma-separated host:port of shard 0, 1, ... (standalone).");
ABSL_FLAG(std::string, output_dir, "", "Overrides the spec's output_dir.");
ABSL_FLAG(std::string, data_root, "data",
          "The directory a job's data files (data.dir, data.train_csv, ...) and TorchScript models "
          "(model: torchscript:<path>) are named relative to; nothing outside it is read for a job "
          "(default: data/ in the working directory).");
ABSL_FLAG(uint64_t, max_data_file_bytes, uint64_t{4} << 30,
          "The most bytes read of one data file or TorchScript model, on disk and decompressed (gzip).");
ABSL_FLAG(int, rpc_timeout_s, 120, "Deadline of each call to the shards, in seconds.");
ABSL_FLAG(std::string, coordinator, "", "host:port of pstrain-coordinator: run as a pool member.");
ABSL_FLAG(std::string, name, "", "Member name (default: <hostname>-<pid>).");
ABSL_FLAG(std::string, device, "",
          "Where this worker trains jobs whose spec says device: auto or cuda: cpu, cuda (cuda:LOCAL_RANK) or "
          "cuda:N (default: cuda:LOCAL_RANK when a CUDA device is there, else the CPU).");
ABSL_FLAG(std::string, resume_from, "", "Standalone all-reduce: checkpoint directory to resume from.");
ABSL_FLAG(std::string, gloo_hostname, "",
          "All-reduce (gloo): the address peers reach this worker at (default: this host's name; "
          "GLOO_SOCKET_IFNAME picks an interface instead).");
ABSL_FLAG(int, drain_timeout_s, 120,
          "On SIGTERM, how long the running job may go on while the coordinator checkpoints and stops it.");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "Address of the Prometheus /metrics endpoint.");
ABSL_FLAG(int, metrics_port, -1, "Prometheus /metrics HTTP port (0 picks one; -1 off).");
ABSL_FLAG(std::string, metrics_port_file, "", "If set, write the metrics host:port here.");

namespace {

std::atomic<bool> g_stop{false};   // SIGINT, or a second signal: stop now
std::atomic<bool> g_drain{false};  // SIGTERM: leave once the job is checkpointed
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void OnSignal(int sig) {
  if (sig == SIGTERM && !g_drain.exchange(true)) return;
  g_stop = true;
}
ABSL_CONST_INIT absl::Mutex g_out_mu(absl::kConstInit);  // one event per line, whole

// One event per line on stdout, in protobuf's JSON form.
void Print(const pstrain::WorkerEvent& event) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(event, &json, options);
  absl::MutexLock lock(&g_out_mu);
  std::cout << json << std::endl;
}

pstrain::WorkerEvent ErrorEvent(int rank, const std::string& message, bool retryable) {
  pstrain::WorkerEvent e;
  e.set_rank(rank);
  e.mutable_error()->set_message(message.size() > 4096 ? message.substr(0, 4096) + "..." : message);
  e.mutable_error()->set_retryable(retryable);
  return e;
}

// Errors that come from losing a peer or a shard, not from the job itself:
// the coordinator may restart the job from its last checkpoint.
bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s);
}

// What a job runs with besides its spec; all optional.
struct RunContext {
  const std::atomic<bool>* stop = nullptr;                        // stop at the next step boundary
  std::function<void(const pstrain::WorkerEvent&)> emit = Print;  // receives every event
  const pstrain::Assignment* assignment = nullptr;
  pstrain::ClusterMember* member = nullptr;
  pstrain::WorkerMetrics* metrics = nullptr;
  pstrain::LaunchEnv launch;  // torchrun's variables, read once
};

// All-reduce mode: the group and the in-process store, from the
// coordinator's rendezvous or torchrun's variables; fills `options`. A ps
// QAT job's workers: the group, for their observers alone.
absl::StatusOr<std::unique_ptr<pstrain::AllReduceSetup>> SetUpAllReduce(const pstrain::JobSpec& spec, int rank,
                                                                        int world_size, const RunContext& ctx,
                                                                        pstrain::TrainerOptions* options) {
  pstrain::AllReduceOptions ao;
  ao.spec = spec;
  ao.rank = rank;
  ao.world_size = world_size;
  ao.member = ctx.member;
  ao.master_addr = ctx.launch.master_addr;
  ao.master_port = ctx.launch.master_port;
  ao.device = options->device;
  ao.resume_from = ctx.assignment != nullptr ? ctx.assignment->resume_from() : absl::GetFlag(FLAGS_resume_from);
  ao.gloo_hostname = absl::GetFlag(FLAGS_gloo_hostname);
  ao.gloo_interface = ctx.launch.gloo_interface;
  spdlog::info("pstrain-worker rank {}/{} of {}: all-reduce rendezvous ({})", rank, world_size, spec.name,
               ctx.member != nullptr ? "coordinator" : absl::StrCat(ao.master_addr, ":", ao.master_port));
  auto allreduce = pstrain::AllReduceSetup::Create(ao);
  if (!allreduce.ok()) return allreduce.status();
  (*allreduce)->Wire(options);
  return allreduce;
}

// Where the rank starts and what it carries: the coordinator's assignment,
// or (standalone, all-reduce, --resume_from) the checkpoint's place.
absl::Status SetStart(const pstrain::JobSpec& spec, int rank, int world_size, const pstrain::Assignment* assignment,
                      pstrain::TrainerOptions* options) {
  if (assignment != nullptr) {
    options->attempt = assignment->attempt();
    options->start_step = assignment->start_step();
    options->start_epoch = assignment->start_epoch();
    options->start_epoch_step = assignment->start_epoch_step();
    options->start_loss_scale = assignment->start_loss_scale();
    options->generation = assignment->generation();
    options->job_secret = assignment->job_secret();
    options->table_grant = assignment->table_grant();
    if (assignment->replacement()) options->rejoin_step = assignment->replacement_step();
  } else if (spec.allreduce() && !absl::GetFlag(FLAGS_resume_from).empty()) {
    // Standalone: the checkpoint's place, as the coordinator would assign
    // it (the values alone, from step 0, replayed the epoch's first batches
    // and restarted the learning-rate schedule).
    auto manifest = pstrain::ReadManifest(absl::GetFlag(FLAGS_resume_from));
    if (!manifest.ok()) return manifest.status();
    for (const auto& w : pstrain::StartPositions(*manifest, world_size)) {
      if (w.rank != rank) continue;
      options->start_step = w.step;
      options->start_epoch = w.epoch;
      options->start_epoch_step = w.epoch_step;
      options->start_loss_scale = w.loss_scale;
    }
  }
  // QAT: the checkpoint's quantizers (a replacement joining a running job
  // would find the original checkpoint's, stale: it starts afresh).
  const std::string dir = assignment == nullptr       ? absl::GetFlag(FLAGS_resume_from)
                          : assignment->replacement() ? std::string()
                                                      : assignment->resume_from();
  if (spec.quantization.qat() && !dir.empty()) {
    options->restore_buffers = [dir] { return pstrain::ReadCheckpointBuffers(dir); };
  }
  return absl::OkStatus();
}

// A checkpoint pauses every worker before one agreed step
// (worker/pause_protocol.h); all-reduce worker 0 writes the model then (a
// pipelined job's worker s < stages, stage s of its first replica).
std::unique_ptr<pstrain::CheckpointPause> SetUpPause(int rank, const RunContext& ctx, pstrain::Activity* activity,
                                                     pstrain::AllReduceSetup* allreduce,
                                                     pstrain::TrainerOptions* options) {
  if (ctx.member == nullptr) return nullptr;
  pstrain::CheckpointPause::SaveTableFn save;
  const int writers = options->spec.pipeline.enabled() ? options->spec.pipeline.stages : 1;
  if (rank < writers && allreduce != nullptr) {
    save = [allreduce](const std::string& path, const std::function<absl::Status()>& flush) {
      return allreduce->SaveTable(path, flush);
    };
  }
  auto pause =
      std::make_unique<pstrain::CheckpointPause>(ctx.member, rank, ctx.emit, activity, ctx.stop, std::move(save));
  options->at_step_boundary = [p = pause.get()](const pstrain::StepBoundary& at) { p->AtStepBoundary(at); };
  return pause;
}

// model: dlrm. The embedding tables live on the job's shards beside its dense tables (pstrain-ps serves both).
absl::Status RunCtrJob(const pstrain::TrainerOptions& options, const std::vector<std::string>& targets) {
  const pstrain::JobSpec& spec = options.spec;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const auto& t : targets) channels.push_back(pstrain::CreateChannel(t));
  pstrain::EmbeddingClientOptions eo;
  eo.job = spec.name;
  eo.attempt = options.attempt;
  eo.rank = static_cast<uint32_t>(options.rank);
  eo.job_secret = options.job_secret;
  eo.table_grant = options.table_grant;
  eo.timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  eo.replicas = static_cast<uint32_t>(spec.replicas);  // R + 1 copies of a slot's rows; routings say which lead
  eo.targets = targets;
  eo.next_routing = options.next_routing;
  eo.stop = options.stop;
  pstrain::GrpcEmbeddingClient client(std::move(channels), eo);
  pstrain::InitEmbeddingsRequest init;
  init.set_num_workers(static_cast<uint32_t>(options.world_size));
  init.set_consistency(spec.consistency);
  init.set_staleness(spec.staleness);
  for (const auto& table : spec.embeddings.tables) *init.add_tables() = table;
  spdlog::info("pstrain-worker rank {}/{} of {}: {} embedding table(s) on {} shard(s)", options.rank,
               options.world_size, spec.name, init.tables_size(), targets.size());
  if (absl::Status s = client.Init(init); !s.ok()) return s;
  pstrain::RemoteEmbeddingRows rows(&client, spec.embeddings.tables.size());
  return pstrain::RunCtrTrainer(options, &rows).status();
}

absl::Status RunJobOrThrow(pstrain::JobSpec spec, int rank, int world_size, const std::vector<std::string>& targets,
                           const RunContext& ctx) {
  const std::atomic<bool>* stop = ctx.stop;
  const auto& emit = ctx.emit;
  const pstrain::Assignment* assignment = ctx.assignment;
  pstrain::ClusterMember* member = ctx.member;
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("need 0 <= rank < world size (", rank, ", ", world_size, ")"));
  }
  if (static_cast<int>(targets.size()) != spec.shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("the spec asks for ", spec.shards, " shards but ", targets.size(), " addresses were given"));
  }
  at::set_num_threads(spec.threads_per_worker);
  auto device = pstrain::ResolveDevice(spec.device, absl::GetFlag(FLAGS_device), ctx.launch.local_rank);
  if (!device.ok()) return device.status();
  spdlog::info("pstrain-worker rank {}/{} of {}: training on {}", rank, world_size, spec.name, device->str());
  pstrain::TrainerOptions options;
  options.spec = spec;
  options.rank = rank;
  options.world_size = world_size;
  options.device = *device;
  options.data_root.dir = absl::GetFlag(FLAGS_data_root);
  options.data_root.max_file_bytes = absl::GetFlag(FLAGS_max_data_file_bytes);
  std::unique_ptr<pstrain::AllReduceSetup> allreduce;
  if (spec.allreduce() || (spec.quantization.qat() && world_size > 1) || spec.pipeline.enabled()) {
    auto ar = SetUpAllReduce(spec, rank, world_size, ctx, &options);
    if (!ar.ok()) return ar.status();
    allreduce = std::move(*ar);
  }
  // Held for the job (the shared cache destroys no client in use; see SharedRemoteShard).
  // All-reduce jobs keep no dense table on shards (a hybrid's shards hold only its embedding rows).
  std::vector<std::shared_ptr<pstrain::GrpcRemoteShard>> remote_shards;
  for (const auto& t : spec.allreduce() ? std::vector<std::string>() : targets) {
    pstrain::RemoteShardOptions ro;
    ro.target = t;
    ro.default_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
    // Replicated shards: a call to a shard that is gone fails over to the
    // chunks' new primaries (PsClient), which itself waits between tries;
    // backing off here first only delays that.
    if (spec.replicas > 0) ro.max_attempts = 2;
    remote_shards.push_back(pstrain::SharedRemoteShard(ro));
    options.shards.push_back(remote_shards.back().get());
  }
  if (spec.replicas > 0) {
    // The coordinator's routings (a hybrid job's: for its rows), and spares at new addresses.
    options.shard_targets = targets;
    if (member != nullptr) options.next_routing = pstrain::RoutingsFrom(member);
    options.connect_shard = pstrain::SpareShardClients(absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s)));
  }
  options.emit = emit;
  // The heartbeat says what the loop is doing (a stuck rank included).
  auto activity = std::make_shared<pstrain::Activity>();
  options.activity = activity.get();
  struct ActivityScope {
    pstrain::ClusterMember* member;
    ~ActivityScope() {
      if (member != nullptr) member->SetActivitySource(nullptr);
    }
  } activity_scope{member};
  if (member != nullptr) member->SetActivitySource([activity] { return activity->Snapshot(); });
  options.write_weights = rank == 0;
  options.stop = stop;
  if (ctx.metrics != nullptr) {
    options.on_step = [metrics = ctx.metrics, job = spec.name, rank](int64_t step, double loss, int64_t samples,
                                                                     double seconds, double wait) {
      metrics->RecordStep(job, rank, step, loss, samples, seconds, wait);
    };
  }
  if (absl::Status s = SetStart(spec, rank, world_size, assignment, &options); !s.ok()) return s;
  std::unique_ptr<pstrain::CheckpointPause> pause =
      SetUpPause(rank, ctx, activity.get(), spec.allreduce() ? allreduce.get() : nullptr, &options);
  if (!spec.embeddings.empty()) return RunCtrJob(options, targets);
  spdlog::info("pstrain-worker rank {}/{} of {}: loading data ({})", rank, world_size, spec.name, spec.data.format);
  auto data = pstrain::LoadData(spec.data, spec.seed, options.data_root);
  if (!data.ok()) return data.status();
  auto result = pstrain::RunTrainer(options, *data);
  return result.status();
}

// LibTorch (and the libraries under it) report errors by throwing: a job
// that throws fails with INTERNAL, the worker lives on.
absl::Status RunJob(pstrain::JobSpec spec, int rank, int world_size, const std::vector<std::string>& targets,
                    const RunContext& ctx) {
  try {
    return RunJobOrThrow(std::move(spec), rank, world_size, targets, ctx);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.size() > 4096) what = what.substr(0, 4096) + "...";
    return absl::InternalError(absl::StrCat("training threw: ", what));
  }
}

int RunPoolMember(pstrain::WorkerMetrics* metrics) {
  pstrain::ClusterMemberOptions mo;
  mo.coordinator = absl::GetFlag(FLAGS_coordinator);
  mo.role = pstrain::MEMBER_ROLE_WORKER;
  mo.name = pstrain::MemberName(absl::GetFlag(FLAGS_name));
  pstrain::ClusterMember member(mo);
  absl::Status s = member.Start(absl::Seconds(60));
  if (!s.ok()) {
    spdlog::error("pstrain-worker: {}", std::string(s.message()));
    return 1;
  }
  while (!g_stop && !g_drain) {
    auto a = member.WaitForAssignment(absl::Seconds(2));
    if (!a.ok()) {
      spdlog::warn("pstrain-worker {}: {}", mo.name, a.status().ToString());
      absl::SleepFor(absl::Seconds(1));
      continue;
    }
    if (a->job_id().empty()) continue;
    auto spec = pstrain::ParseJobSpec(a->spec_yaml(), a->job_id());
    member.SetRunning(a->job_id(), a->rank(), a->attempt());
    auto emit = [&](const pstrain::WorkerEvent& event) {
      Print(event);
      member.Report(event);
    };
    if (spec.ok()) {
      spec->name = a->job_id();  // the shards' table name: unique per job
      if (!a->output_dir().empty()) spec->output_dir = a->output_dir();
      std::vector<std::string> targets(a->shard_addresses().begin(), a->shard_addresses().end());
      // Stop on cancellation (the coordinator stopped or requeued the job)
      // and SIGINT. SIGTERM asks the coordinator to checkpoint the job and
      // take it off this worker, and stops it here only after the timeout.
      std::atomic<bool> stop_job{false};
      std::atomic<bool> drain_expired{false};
      std::thread watch([&, rank = a->rank()] {
        absl::Time drain_until = absl::InfiniteFuture();
        while (!stop_job) {
          if (g_stop || member.cancelled()) stop_job = true;
          if (g_drain && drain_until == absl::InfiniteFuture()) {
            drain_until = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
            spdlog::info(
                "pstrain-worker: SIGTERM: the coordinator checkpoints the job, then this worker leaves "
                "(at most {} s; a second signal stops at once)",
                absl::GetFlag(FLAGS_drain_timeout_s));
            pstrain::WorkerEvent draining;
            draining.set_rank(rank);
            draining.mutable_draining()->set_role(pstrain::MEMBER_ROLE_WORKER);
            emit(draining);
          }
          if (absl::Now() > drain_until) {
            drain_expired = true;
            stop_job = true;
          }
          absl::SleepFor(absl::Milliseconds(50));
        }
      });
      if (metrics != nullptr) metrics->SetRunning(a->job_id(), a->rank(), true);
      RunContext ctx;
      ctx.stop = &stop_job;
      ctx.emit = emit;
      ctx.assignment = &*a;
      ctx.member = &member;
      ctx.metrics = metrics;
      s = RunJob(*spec, a->rank(), a->world_size(), targets, ctx);
      if (metrics != nullptr) metrics->SetRunning(a->job_id(), a->rank(), false);
      const bool cancelled = member.cancelled();
      stop_job = true;
      watch.join();
      if (!s.ok() && !cancelled) {
        const std::string why =
            drain_expired ? absl::StrCat("shut down (SIGTERM) and the job was not checkpointed and stopped within ",
                                         absl::GetFlag(FLAGS_drain_timeout_s), " s")
                          : std::string(s.message());
        emit(ErrorEvent(a->rank(), why, Retryable(s) && !drain_expired));
        spdlog::error("pstrain-worker {}: job {} failed: {}", mo.name, a->job_id(), s.ToString());
      }
    } else {
      emit(ErrorEvent(a->rank(), std::string(spec.status().message()), /*retryable=*/false));
    }
    member.Flush(absl::Seconds(30));
    member.SetRunning("", -1, 0);
  }
  member.Flush(absl::Seconds(5));
  return 0;
}

}  // namespace

// Leaves without running destructors: gRPC's callback threads may still be
// finishing the last completion (after our callback returned) when main
// returns, and tearing the channels down under them crashed the process at
// exit (a double free in grpc_cq_internal_unref, seen with ASan). Output is
// flushed first.
[[noreturn]] void ExitNow(int code) {
  std::fflush(stdout);
  std::cout.flush();
  std::fflush(stderr);
  _exit(code);
}

int Main(int argc, char** argv) {
  pstrain::StartBinary("pstrain-worker", argc, argv);
  pstrain::InstallSecurityFromFlags("pstrain-worker", false);
  pstrain::KeepBulkBuffersMapped();
  at::set_num_interop_threads(1);
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    // A pool member: SIGTERM drains, SIGINT (or a second signal) stops.
    // Handlers, not sigwait: libraries start threads before main (OpenBLAS's
    // pool) that would not inherit a blocked mask.
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
  }
  // Never destroyed: the process leaves through ExitNow.
  std::unique_ptr<pstrain::MetricsServer> metrics_server;
  std::unique_ptr<pstrain::WorkerMetrics> metrics;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    auto m = pstrain::MetricsServer::Start(absl::GetFlag(FLAGS_metrics_host), absl::GetFlag(FLAGS_metrics_port),
                                           absl::GetFlag(FLAGS_metrics_port_file));
    if (!m.ok()) {
      spdlog::error("pstrain-worker: {}", std::string(m.status().message()));
      return 1;
    }
    metrics_server = std::move(*m);
    metrics = std::make_unique<pstrain::WorkerMetrics>(metrics_server->registry());
    spdlog::info("pstrain-worker: Prometheus metrics on port {}", metrics_server->port());
  }
  if (!absl::GetFlag(FLAGS_coordinator).empty()) return RunPoolMember(metrics.get());

  auto spec = pstrain::LoadJobSpec(absl::GetFlag(FLAGS_spec));
  if (!spec.ok()) {
    spdlog::error("pstrain-worker: {}", std::string(spec.status().message()));
    return 2;
  }
  if (!absl::GetFlag(FLAGS_output_dir).empty()) spec->output_dir = absl::GetFlag(FLAGS_output_dir);
  int world = absl::GetFlag(FLAGS_world_size) > 0 ? absl::GetFlag(FLAGS_world_size) : spec->workers;
  auto launch = pstrain::ReadLaunchEnv();
  if (!launch.ok()) {
    spdlog::error("pstrain-worker: {}", std::string(launch.status().message()));
    return 2;
  }
  int rank = absl::GetFlag(FLAGS_rank);
  if (rank < 0 && launch->rank >= 0) {
    // Launched the torchrun way (torchrun, a Kubeflow PyTorchJob).
    rank = launch->rank;
    if (absl::GetFlag(FLAGS_world_size) <= 0 && launch->world_size > 0) world = launch->world_size;
  }
  if (rank < 0) rank = std::max(0, pstrain::HostOrdinal());  // a StatefulSet pod
  const std::vector<std::string> targets = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  RunContext ctx;
  ctx.metrics = metrics.get();
  ctx.launch = *launch;
  absl::Status s = RunJob(*spec, rank, world, targets, ctx);
  if (!s.ok()) {
    spdlog::error("pstrain-worker rank {}: {}", rank, s.ToString());
    return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound ? 2 : 1;
  }
  return 0;
}

int main(int argc, char** argv) { ExitNow(Main(argc, argv)); }
