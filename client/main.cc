// pstrain: the command-line client.
//
//   pstrain local JOB.yaml [--output_dir DIR]
//       Runs the job on this machine: its shards and workers as child
//       processes on 127.0.0.1, with live progress and a final summary.
//
// Exit codes: 0 success; 1 the job failed; 2 bad usage or job spec;
// 130 interrupted (Ctrl-C).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <filesystem>

#include "client/local_cluster.h"
#include "client/progress_view.h"
#include "common/job_spec.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop = true; }

// The server and worker binaries: beside this one (an installed layout or a
// container image), or where Bazel puts them (bazel-bin/client/pstrain ->
// bazel-bin/server/ps/pstrain-ps); PSTRAIN_PS_BIN / PSTRAIN_WORKER_BIN win.
std::string FindBinary(const char* env, const std::string& name, const std::string& bazel_rel) {
  if (const char* v = std::getenv(env)) return v;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path dir = self.parent_path();
  for (const auto& candidate : {dir / name, dir / ".." / bazel_rel}) {
    if (std::filesystem::exists(candidate, ec)) return std::filesystem::canonical(candidate, ec).string();
  }
  return name;  // from PATH: execv needs a path, so this fails with a clear message
}

int RunLocal(const std::string& spec_path, const std::string& output_dir_flag) {
  auto spec = pstrain::LoadJobSpec(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "pstrain: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  pstrain::LocalClusterOptions options;
  options.spec_path = std::filesystem::absolute(spec_path).string();
  options.spec = *spec;
  options.output_dir = output_dir_flag.empty() ? spec->output_dir : output_dir_flag;
  options.ps_binary = FindBinary("PSTRAIN_PS_BIN", "pstrain-ps", "server/ps/pstrain-ps");
  options.worker_binary = FindBinary("PSTRAIN_WORKER_BIN", "pstrain-worker", "worker/pstrain-worker");
  for (const std::string& b : {options.ps_binary, options.worker_binary}) {
    if (access(b.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "pstrain: cannot find %s (build with `bazel build //...`)\n", b.c_str());
      return 2;
    }
  }
  std::printf("pstrain local: job '%s': %s, %d shard(s), %d worker(s), %s, %d epoch(s), batch %lld\n",
              spec->name.c_str(), spec->model.c_str(), spec->shards, spec->workers,
              spec->consistency == pstrain::SYNC  ? "sync"
              : spec->consistency == pstrain::SSP ? "ssp"
                                                  : "async",
              spec->epochs, static_cast<long long>(spec->batch_size));
  std::printf("output: %s (logs in %s/logs)\n", options.output_dir.c_str(), options.output_dir.c_str());
  std::fflush(stdout);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  pstrain::ProgressView view(stdout, isatty(STDOUT_FILENO) == 1, spec->workers);
  pstrain::LocalCluster cluster(options);
  absl::Status s = cluster.Run([&](const std::string& line) { view.OnEvent(line); }, g_stop);
  view.ClearLine();
  if (!s.ok()) {
    std::fprintf(stderr, "pstrain: job '%s' %s\n", spec->name.c_str(),
                 std::string(s.message()).c_str());
    return g_stop ? 130 : 1;
  }
  const pstrain::RunSummary& sum = view.summary();
  std::printf("done: %.1f s, %.0f samples/s", sum.seconds,
              sum.seconds > 0 ? sum.samples / sum.seconds : 0.0);
  if (sum.final_accuracy >= 0) std::printf(", final test accuracy %.4f", sum.final_accuracy);
  if (!sum.weights_path.empty()) std::printf("\nweights: %s", sum.weights_path.c_str());
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pstrain: distributed training for LibTorch models"};
  app.require_subcommand(1);
  std::string spec_path, output_dir;
  CLI::App* local = app.add_subcommand("local", "run a job on this machine (shards and workers as child processes)");
  local->add_option("spec", spec_path, "job spec (YAML)")->required();
  local->add_option("--output_dir", output_dir, "overrides the spec's output_dir");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (local->parsed()) return RunLocal(spec_path, output_dir);
  return 2;
}
