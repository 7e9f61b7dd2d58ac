// One rank of `bench/run.sh allreduce`: times pstrain's Collective (gloo
// backend) all-reducing float32 tensors of several sizes, the way
// nccl-tests does: warm-up, back-to-back all-reduces after a barrier, time per op on
// rank 0. Rendezvous as torchrun's: rank 0 serves MASTER_ADDR:MASTER_PORT.
// Prints (rank 0) one JSON line: {"sizes": [...], "seconds": [...]}.
#include <ATen/ops/ones.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "collective/collective.h"

ABSL_FLAG(int, rank, 0, "This rank.");
ABSL_FLAG(int, world, 2, "Number of ranks.");
ABSL_FLAG(std::string, master, "127.0.0.1", "Rendezvous host (rank 0 serves it).");
ABSL_FLAG(int, port, 29500, "Rendezvous port.");
ABSL_FLAG(std::string, sizes, "4096,1048576,16777216,67108864,268435456", "Message sizes in bytes.");
ABSL_FLAG(double, seconds_per_size, 2.0, "Roughly how long to time each size.");
ABSL_FLAG(int, gloo_threads, pstrain::CollectiveOptions().gloo_threads, "Threads of the gloo group.");
ABSL_FLAG(int, split_parts, pstrain::CollectiveOptions().gloo_split_parts,
          "Tensors of 8 MiB or more are reduced as this many concurrent parts (1: whole).");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  at::set_num_threads(1);
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world);
  auto store = pstrain::ConnectTcpStore(absl::GetFlag(FLAGS_master), absl::GetFlag(FLAGS_port), rank == 0, world,
                                        absl::Seconds(60));
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  pstrain::CollectiveOptions o;
  o.rank = rank;
  o.size = world;
  o.store = *store;
  o.hostname = absl::GetFlag(FLAGS_master);
  o.timeout = absl::Seconds(300);
  o.gloo_threads = absl::GetFlag(FLAGS_gloo_threads);
  o.gloo_split_parts = absl::GetFlag(FLAGS_split_parts);
  auto c = pstrain::CreateCollective(pstrain::Collective::Backend::kGloo, o);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  std::vector<int64_t> sizes;
  std::vector<double> seconds;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(s, &bytes)) return 2;
    at::Tensor t = at::ones({bytes / 4}, at::kFloat);
    // Warm-up, then a first timing decides the iteration count; every rank
    // must run the same count, so rank 0 broadcasts it.
    // Warm-up: at least 3 operations and a quarter of a second (the first
    // operations of a size pay for buffer and connection warm-up). Rank 0
    // decides when it is over, so that all ranks run the same number.
    const auto warm_start = std::chrono::steady_clock::now();
    for (int i = 0;; ++i) {
      (void)(*c)->AllReduce(t)->Wait();
      at::Tensor more = at::ones({1}, at::kLong).mul_(
          i < 2 || std::chrono::steady_clock::now() - warm_start < std::chrono::milliseconds(250) ? 1 : 0);
      (void)(*c)->Broadcast(more, 0)->Wait();
      if (more.item<int64_t>() == 0) break;
    }
    (void)(*c)->Barrier()->Wait();
    auto start = std::chrono::steady_clock::now();
    (void)(*c)->AllReduce(t)->Wait();
    const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    at::Tensor iters = at::ones({1}, at::kLong).mul_(
        std::max<int64_t>(3, static_cast<int64_t>(absl::GetFlag(FLAGS_seconds_per_size) / std::max(one, 1e-6))));
    (void)(*c)->Broadcast(iters, 0)->Wait();
    const int64_t n = std::min<int64_t>(iters.item<int64_t>(), 2000);
    (void)(*c)->Barrier()->Wait();
    start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      absl::Status st = (*c)->AllReduce(t)->Wait();
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return 1;
      }
    }
    sizes.push_back(bytes);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / n);
  }
  if (rank == 0) {
    std::printf("{\"sizes\": [%s], \"seconds\": [%s]}\n", absl::StrJoin(sizes, ", ").c_str(),
                absl::StrJoin(seconds, ", ").c_str());
  }
  std::fflush(stdout);
  _exit(0);  // as the worker: no gRPC/gloo teardown under running threads
}
