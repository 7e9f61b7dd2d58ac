// Push/pull throughput of pstrain's parameter service, one process per
// worker (bench/run.sh starts the shards and the workers), and the tensor
// codec's encode/decode speed.
//
//   pushpull_bench --role=worker --shards=H:P,H:P --model=flat --worker=0
//       --num_workers=2 --start_at_ms=... --seconds=8   (one command line)
//   pushpull_bench --role=codec
//
// Each prints one JSON object on its last line.
#include <ATen/ops/randn.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/malloc_tuning.h"
#include "rpc/grpc_remote_shard.h"
#include "rpc/local_credentials.h"
#include "rpc/security_flags.h"
#include "rpc/grpc_tensor_coding.h"
#include "rpc/tensor_codec.h"
#include "worker/ps_client.h"

ABSL_FLAG(std::string, role, "worker", "worker | codec | credentials (a CA, certificate and tokens in --out)");
ABSL_FLAG(std::string, out, "", "--role=credentials: the directory to write them to.");
ABSL_FLAG(std::string, shards, "", "Comma-separated shard addresses.");
ABSL_FLAG(std::string, model, "flat", "flat: one 10M float32 tensor; mixed: 20 tensors, 10M in all.");
ABSL_FLAG(std::string, job, "bench", "Job name (one table per model).");
ABSL_FLAG(int, worker, 0, "This worker's index.");
ABSL_FLAG(int, num_workers, 1, "Workers in the run.");
ABSL_FLAG(int64_t, start_at_ms, 0, "Unix time (ms) at which the timed phase starts.");
ABSL_FLAG(double, seconds, 8, "Length of the timed phase.");
ABSL_FLAG(std::string, wire_dtype, "fp32", "fp32 | bf16 | fp16: what gradients and values travel as.");
ABSL_FLAG(std::string, requests, "training",
          "training: push-pull as the trainer does it with a job spec's defaults (1 MiB chunks, PushPullAsync "
          "cutting requests at 1 MiB, 2 in flight per shard); whole: one PushPull request per shard (4 MiB chunks).");
ABSL_FLAG(int64_t, chunk_bytes, 0, "The partition plan's chunk size (0: as --requests says).");
ABSL_FLAG(int, replicas, 0,
          "Backups of each chunk on other shards (docs/replication.md): each update is forwarded to them before "
          "its answer.");
ABSL_FLAG(int, requests_in_flight, 2, "--requests=training: requests in flight per shard (0: no limit).");

namespace pstrain {
namespace {

std::vector<std::vector<int64_t>> ModelShapes(const std::string& model) {
  if (model == "flat") return {{10'000'000}};
  // 20 tensors of mixed sizes adding up to 10M elements: a few large
  // matrices, medium ones and small biases, like a real network.
  std::vector<std::vector<int64_t>> shapes = {
      {2048, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024},
      {512, 1024},  {512, 512},   {256, 512},   {256, 256},   {128, 256},   {4096},
      {2048},       {1024},       {1024},       {512},        {256},        {128},
      {10, 256}};
  int64_t total = 0;
  for (auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    total += n;
  }
  shapes.push_back({10'000'000 - total});  // the 20th tensor makes it exactly 10M
  return shapes;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

int RunWorker() {
  const std::vector<std::string> targets = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',');
  const std::string model = absl::GetFlag(FLAGS_model);
  std::vector<ParameterSpec> specs;
  const auto shapes = ModelShapes(model);
  for (size_t i = 0; i < shapes.size(); ++i) specs.push_back({"t" + std::to_string(i), shapes[i], DT_FLOAT32});
  const std::string requests = absl::GetFlag(FLAGS_requests);
  if (requests != "training" && requests != "whole") {
    std::fprintf(stderr, "--requests=%s: training | whole\n", requests.c_str());
    return 1;
  }
  const bool split = requests == "training";
  int64_t chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk_bytes <= 0) chunk_bytes = split ? 1 << 20 : static_cast<int64_t>(kDefaultChunkBytes);
  auto plan = MakePartitionPlan(specs, static_cast<int>(targets.size()), static_cast<size_t>(chunk_bytes),
                                absl::GetFlag(FLAGS_replicas));
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<GrpcRemoteShard>> remotes;
  std::vector<ParameterStore*> stores;
  for (const auto& t : targets) {
    RemoteShardOptions ro;
    ro.target = t;
    remotes.push_back(std::make_unique<GrpcRemoteShard>(ro));
    stores.push_back(remotes.back().get());
  }
  PsClientOptions o;
  o.job = absl::GetFlag(FLAGS_job) + "-" + model;
  o.worker = static_cast<uint32_t>(absl::GetFlag(FLAGS_worker));
  o.plan = *plan;
  o.shard_targets = targets;
  const std::string wire = absl::GetFlag(FLAGS_wire_dtype);
  o.wire_dtype = wire == "bf16" ? DT_BFLOAT16 : wire == "fp16" ? DT_FLOAT16 : DT_FLOAT32;
  o.max_in_flight_per_shard = absl::GetFlag(FLAGS_requests_in_flight);
  auto client = PsClient::Create(o, stores);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  at::manual_seed(0);
  std::vector<at::Tensor> params, grads;
  int64_t bytes_per_step = 0;
  for (const auto& s : shapes) {
    params.push_back(at::randn(s));
    grads.push_back(at::randn(s).mul_(1e-4));
    bytes_per_step += 2 * params.back().nbytes();  // gradient pushed + value pulled
  }
  TableConfig config;
  config.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  config.mutable_optimizer()->set_lr(0.01);
  config.set_consistency(ASYNC);
  config.set_num_workers(static_cast<uint32_t>(absl::GetFlag(FLAGS_num_workers)));
  absl::Status s = (*client)->InitTables(params, config);
  if (!s.ok()) {
    std::fprintf(stderr, "InitTables: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<size_t> all(params.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  auto push_pull = [&](int64_t at) {
    if (!split) return (*client)->PushPull(at, grads, params);
    absl::Notification finished;
    absl::Status result;
    (*client)->PushPullAsync(at, all, grads, params, 0, [&](absl::Status st) {
      result = st;
      finished.Notify();
    });
    finished.WaitForNotification();
    return result;
  };
  int64_t step = 0;
  for (int i = 0; i < 3; ++i) {  // warm-up: connections, allocator
    s = push_pull(step++);
    if (!s.ok()) {
      std::fprintf(stderr, "PushPull: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const int64_t start_at = absl::GetFlag(FLAGS_start_at_ms);
  if (start_at > 0) absl::SleepFor(absl::FromUnixMillis(start_at) - absl::Now());
  std::vector<double> latencies_ms;
  const auto t0 = std::chrono::steady_clock::now();
  const double limit = absl::GetFlag(FLAGS_seconds);
  double elapsed = 0;
  while (elapsed < limit) {
    const auto a = std::chrono::steady_clock::now();
    s = push_pull(step++);
    const auto b = std::chrono::steady_clock::now();
    if (!s.ok()) {
      std::fprintf(stderr, "PushPull: %s\n", s.ToString().c_str());
      return 1;
    }
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
    elapsed = std::chrono::duration<double>(b - t0).count();
  }
  // gb_per_s: float32 bytes of the parameters moved (whatever the wire
  // dtype), so fp32 and bf16 runs compare as parameters per second.
  const double gbps = static_cast<double>(bytes_per_step) * latencies_ms.size() / elapsed / 1e9;
  std::printf(
      "{\"model\": \"%s\", \"requests\": \"%s\", \"wire_dtype\": \"%s\", \"worker\": %d, \"steps\": %zu, \"seconds\": %.3f, "
      "\"bytes_per_step\": %lld, \"gb_per_s\": %.4f, \"params_per_s\": %.4g, \"p50_ms\": %.3f, \"p99_ms\": %.3f}\n",
      model.c_str(), requests.c_str(), wire.c_str(), absl::GetFlag(FLAGS_worker), latencies_ms.size(), elapsed,
      static_cast<long long>(bytes_per_step), gbps, gbps * 1e9 / 4, Percentile(latencies_ms, 0.5),
      Percentile(latencies_ms, 0.99));
  return 0;
}

// A 64 MiB message as the system sends it: 16 chunks of 4 MiB (the default
// chunk size of the partition plan).
int RunCodec() {
  at::Tensor t = at::randn({16 << 20});
  std::vector<TensorBuffer> chunks;
  auto whole = TensorToBuffer(t);
  const size_t chunk = kDefaultChunkBytes;
  for (size_t off = 0; off < whole->nbytes; off += chunk) {
    TensorBuffer v = *whole;
    v.data = whole->data + off;
    v.nbytes = std::min(chunk, whole->nbytes - off);
    v.shape = {static_cast<int64_t>(v.nbytes / 4)};
    chunks.push_back(v);
  }
  PullResponse header;
  const int reps = 20;
  grpc::ByteBuffer bb;
  auto a = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    if (!EncodeTensorMessage(header, chunks, &bb).ok()) return 1;
  }
  auto b = std::chrono::steady_clock::now();
  const double encode_s = std::chrono::duration<double>(b - a).count() / reps;
  // Decode from 64 KiB slices, as bytes arrive from a socket: one copy.
  std::vector<grpc::Slice> all;
  if (!bb.Dump(&all).ok()) return 1;
  std::string wire;
  for (auto& s : all) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::vector<grpc::Slice> pieces;
  for (size_t i = 0; i < wire.size(); i += 65536) {
    pieces.emplace_back(wire.data() + i, std::min<size_t>(65536, wire.size() - i));
  }
  grpc::ByteBuffer received(pieces.data(), pieces.size());
  a = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    std::vector<TensorBuffer> out;
    if (!DecodeTensorMessage(received, &header, &out).ok()) return 1;
  }
  b = std::chrono::steady_clock::now();
  const double decode_s = std::chrono::duration<double>(b - a).count() / reps;
  const double gb = static_cast<double>(t.nbytes()) / 1e9;
  std::printf("{\"codec_bytes\": %lld, \"encode_gb_per_s\": %.2f, \"decode_gb_per_s\": %.2f}\n",
              static_cast<long long>(t.nbytes()), gb / encode_s, gb / decode_s);
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pstrain::KeepBulkBuffersMapped();
  // As the server binaries (common/binary_setup.cc).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const std::string role = absl::GetFlag(FLAGS_role);
  int code = 2;
  if (role == "credentials") {
    auto made = pstrain::WriteLocalCredentials(absl::GetFlag(FLAGS_out));
    if (!made.ok()) std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    std::fflush(nullptr);
    _exit(made.ok() ? 0 : 1);
  }
  // --tls_ca and --token_file: the run over TLS with a token.
  pstrain::InstallSecurityFromFlags("pushpull_bench", false);
  if (role == "worker") {
    code = pstrain::RunWorker();
  } else if (role == "codec") {
    code = pstrain::RunCodec();
  } else {
    std::fprintf(stderr, "unknown --role=%s (worker | codec)\n", role.c_str());
  }
  // Exit without tearing gRPC down under its own callback threads (see
  // worker/main.cc, ExitNow); flush what we printed first.
  std::fflush(nullptr);
  _exit(code);
}
