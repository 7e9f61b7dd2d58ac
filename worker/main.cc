// pstrain-worker: trains one rank of a job against the parameter shards.
//
//   pstrain-worker --spec=job.yaml --rank=0 --world_size=2 --shards=H:P,H:P
//
// Writes one JSON event per line on stdout (progress, evaluation, result)
// and logs on stderr. Exit code 0 on success, 1 on a training error, 2 on bad
// flags or a bad job spec.
#include <signal.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <iostream>
#include <mutex>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "common/malloc_tuning.h"
#include "rpc/grpc_remote_shard.h"
#include "spdlog/spdlog.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, spec, "", "Job spec (YAML).");
ABSL_FLAG(int, rank, 0, "This worker's rank, 0 <= rank < world_size.");
ABSL_FLAG(int, world_size, 0, "Number of workers (default: the spec's `workers`).");
ABSL_FLAG(std::string, shards, "", "Comma-separated host:port of shard 0, 1, ...");
ABSL_FLAG(std::string, output_dir, "", "Overrides the spec's output_dir.");
ABSL_FLAG(int, rpc_timeout_s, 120, "Deadline of each call to the shards, in seconds.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pstrain::KeepBulkBuffersMapped();
  auto spec = pstrain::LoadJobSpec(absl::GetFlag(FLAGS_spec));
  if (!spec.ok()) {
    std::fprintf(stderr, "pstrain-worker: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  if (!absl::GetFlag(FLAGS_output_dir).empty()) spec->output_dir = absl::GetFlag(FLAGS_output_dir);
  pstrain::TrainerOptions options;
  options.spec = *spec;
  options.rank = absl::GetFlag(FLAGS_rank);
  options.world_size = absl::GetFlag(FLAGS_world_size) > 0 ? absl::GetFlag(FLAGS_world_size)
                                                           : spec->workers;
  if (options.rank < 0 || options.rank >= options.world_size) {
    std::fprintf(stderr, "pstrain-worker: need 0 <= --rank < world size (%d, %d)\n", options.rank,
                 options.world_size);
    return 2;
  }
  const std::vector<std::string> targets =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  if (static_cast<int>(targets.size()) != spec->shards) {
    std::fprintf(stderr, "pstrain-worker: the spec asks for %d shards but --shards lists %zu\n",
                 spec->shards, targets.size());
    return 2;
  }
  at::set_num_threads(spec->threads_per_worker);
  at::set_num_interop_threads(1);

  std::vector<std::unique_ptr<pstrain::GrpcRemoteShard>> remotes;
  for (const auto& t : targets) {
    pstrain::RemoteShardOptions ro;
    ro.target = t;
    ro.default_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
    remotes.push_back(std::make_unique<pstrain::GrpcRemoteShard>(ro));
    options.shards.push_back(remotes.back().get());
  }
  std::mutex out_mu;
  options.emit = [&out_mu](const std::string& json) {
    std::lock_guard<std::mutex> lock(out_mu);
    std::cout << json << std::endl;
  };
  options.write_weights = options.rank == 0;

  spdlog::info("pstrain-worker rank {}/{}: loading data ({})", options.rank, options.world_size,
               spec->data.format);
  auto data = pstrain::LoadData(spec->data, spec->seed);
  if (!data.ok()) {
    std::fprintf(stderr, "pstrain-worker: %s\n", std::string(data.status().message()).c_str());
    return 2;
  }
  auto result = pstrain::RunTrainer(options, *data);
  if (!result.ok()) {
    std::fprintf(stderr, "pstrain-worker rank %d: %s\n", options.rank,
                 result.status().ToString().c_str());
    return 1;
  }
  return 0;
}
