// The trainer on a CUDA device (tagged gpu): parameter-server mode with CPU
// shards, all-reduce over NCCL and over Gloo (host staging), and the demo's
// job on the GPU. Each test skips where this LibTorch has no CUDA or the
// machine no GPU, saying so; tools/gpu/run.sh runs them on a GPU machine.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "collective/collective.h"
#include "tests/trainer_testing.h"
#include "worker/device.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

const c10::Device kGpu(c10::kCUDA, 0);

// Exact fp32 for comparisons: cuDNN's convolutions run in TF32 by default
// (PyTorch's default too), which rounds a batch of 32 differently from two
// of 16 at the 1e-4 level; and deterministic algorithms.
void ExactFp32() {
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setDeterministicCuDNN(true);
}

#define REQUIRE_CUDA()                                                                                     \
  if (CudaDevices() == 0) {                                                                                \
    GTEST_SKIP() << "no CUDA device: this LibTorch has no CUDA (Debian's 1.13 is CPU-only) or the machine " \
                    "no GPU or driver; tools/gpu/run.sh runs these tests on a GPU machine";               \
  }                                                                                                        \
  ExactFp32()

// TrainRanks with every rank on the GPU; `setup` completes each rank's
// options (shards, collective).
std::vector<absl::StatusOr<TrainResult>> TrainRanksOnGpu(const JobSpec& spec, const TrainTest& data, int ranks,
                                                         const RankSetup& setup) {
  return TrainRanks(spec, data, ranks, [&](int r, TrainerOptions& o) {
    o.device = kGpu;
    return setup(r, o);
  });
}

// Two SYNC ps workers of `model` sharing the GPU, with two CPU shards, 20
// steps, compared with one GPU worker on the concatenated batches.
void ExpectTwoPsWorkersLikeOne(const std::string& model, double rtol, double atol) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec two = TwoWorkerSyncSpec("gpu-sync-two");
  two.model = model;
  two.max_steps = 20;
  Shards shards(2);
  auto results = TrainRanksOnGpu(two, *data, 2, [&](int, TrainerOptions& o) {
    o.shards = shards.ptrs;
    return absl::OkStatus();
  });
  ExpectLikeOneWorkerOnTheConcatenatedBatch(two, *data, results, kGpu, rtol, atol);
}

// The float64 TorchScript module (worker/testdata/make_scripted_mlp.py
// --float64), or a skip.
#define REQUIRE_FLOAT64_MODEL(model)                                                  \
  const std::string model = "worker/testdata/small_net_f64.pt";                       \
  if (!std::filesystem::exists(model)) {                                              \
    GTEST_SKIP() << model << " is missing (tools/gpu/run.sh writes it)";              \
  }

// In fp32 cuDNN sums a batch of 32 in another order than two of 16, and 20
// steps of momentum carry that to ~1e-3 (measured on an H100: 1.0e-3 at
// most, deterministic algorithms and no TF32); the float64 test is the exact
// check.
TEST(GpuTest, SyncTwoWorkersOnOneGpuEqualOneWorkerOnTheConcatenatedBatch) {
  REQUIRE_CUDA();
  ExpectTwoPsWorkersLikeOne("lenet", 1e-2, 3e-3);
}

// With rounding out of the way the two runs differ only in the order of
// additions, so an ordering bug between the compute and copy streams would
// show far above 1e-9.
TEST(GpuTest, SyncTwoWorkersOnOneGpuEqualOneWorkerInFloat64) {
  REQUIRE_CUDA();
  REQUIRE_FLOAT64_MODEL(model);
  ExpectTwoPsWorkersLikeOne("torchscript:" + model, 1e-9, 1e-11);
}

std::vector<absl::StatusOr<TrainResult>> TrainAllReduce(const JobSpec& spec, const TrainTest& data, int ranks,
                                                        Collective::Backend backend) {
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Collective>> collectives(ranks);
  std::vector<std::unique_ptr<Shards>> locals(ranks);
  return TrainRanksOnGpu(spec, data, ranks, [&](int r, TrainerOptions& o) -> absl::Status {
    CollectiveOptions co;
    co.rank = r;
    co.size = ranks;
    co.store = store;
    co.hostname = "127.0.0.1";
    co.device = 0;
    auto c = CreateCollective(backend, co);
    if (!c.ok()) return c.status();
    collectives[r] = std::move(*c);
    locals[r] = std::make_unique<Shards>(1);
    o.local_store = locals[r]->stores[0].get();
    o.collective = collectives[r].get();
    return absl::OkStatus();
  });
}

// NCCL end to end with the one rank a single GPU allows: equals a PS worker
// with one shard on the same GPU (in float64: the device optimizer and the
// shard's loops round differently in fp32).
TEST(GpuTest, AllReduceNcclOneRankEqualsOneWorker) {
  REQUIRE_CUDA();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL backend (libpstrain_nccl.so)";
  REQUIRE_FLOAT64_MODEL(model);
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec one = AllReduceSpec("gpu-nccl", "torchscript:" + model, 1, 32, 20);
  one.bucket_bytes = 8 << 10;
  auto results = TrainAllReduce(one, *data, 1, Collective::Backend::kNccl);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  JobSpec ps = one;
  ps.mode = TrainMode::kParameterServer;
  ps.shards = 1;
  Shards shards(1);
  auto ref = TrainRanksOnGpu(ps, *data, 1, [&](int, TrainerOptions& o) {
    o.shards = shards.ptrs;
    return absl::OkStatus();
  });
  ASSERT_TRUE(ref[0].ok()) << ref[0].status();
  for (size_t i = 0; i < ref[0]->parameters.size(); ++i) {
    const at::Tensor& a = ref[0]->parameters[i].second;
    const at::Tensor& b = results[0]->parameters[i].second;
    EXPECT_TRUE(at::allclose(a, b, 1e-9, 1e-11))
        << ref[0]->parameters[i].first << " differs by " << a.sub(b).abs().max().item<double>();
  }
}

// A NaN step with NCCL: the host never waits for a step, so the verdict
// comes from the device (fused SGD skipped the update) a step later; the job
// fails naming the step.
TEST(GpuTest, AllReduceNcclNaNStepFailsNamingIt) {
  REQUIRE_CUDA();
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL backend (libpstrain_nccl.so)";
  auto clean = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(clean.ok());
  const JobSpec one = AllReduceSpec("gpu-nccl-nan", "lenet", 1, 32, 8);
  auto results = TrainAllReduce(one, WithNaNInBatch(*clean, one, 1, /*micro=*/3), 1, Collective::Backend::kNccl);
  ExpectFailedOnNaNStep(results[0], 3);
}

// Resuming on the GPU: the restored values are uploaded to the device
// parameters (NCCL where this build has it, else Gloo over host copies).
TEST(GpuTest, AllReduceResumeStartsFromTheRestoredValues) {
  REQUIRE_CUDA();
  ExpectAllReduceResumeStartsFromTheTablesValues(
      kGpu, NcclBuilt() ? Collective::Backend::kNccl : Collective::Backend::kGloo);
}

// Gloo reduces host copies of CUDA gradients: two ranks on one GPU train
// like one worker on the concatenated batches (float64, as above).
TEST(GpuTest, AllReduceGlooOnCudaTensorsTwoRanks) {
  REQUIRE_CUDA();
  REQUIRE_FLOAT64_MODEL(model);
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec two = AllReduceSpec("gpu-gloo", "torchscript:" + model, 2, 16, 20);
  two.bucket_bytes = 8 << 10;
  two.clip_grad_norm = 5.0;
  auto results = TrainAllReduce(two, *data, 2, Collective::Backend::kGloo);
  ExpectLikeOneWorkerOnTheConcatenatedBatch(two, *data, results, kGpu, 1e-9, 1e-11);
}

TEST(GpuTest, Bf16AutocastTrainsWithinOnePointOfFp32) {
  REQUIRE_CUDA();
  ExpectAutocastWithinOnePointOfFp32(kGpu, Precision::kBf16);
}

// fp16 autocast with dynamic loss scaling on the GPU (its fused unscale
// kernel): within a point of fp32, the scale reported, few steps skipped.
TEST(GpuTest, Fp16AutocastWithLossScalingTrainsWithinOnePointOfFp32) {
  REQUIRE_CUDA();
  ExpectAutocastWithinOnePointOfFp32(kGpu, Precision::kFp16);
}

// The demo's job (LeNet, Fashion-MNIST, 2 async workers, 2 CPU shards, 3
// epochs) with both workers on one GPU reaches the demo's accuracy; `wire`
// bf16 narrows gradients and widens values on the GPU (narrow_on_device).
void ExpectPsDemoOnOneGpu(WireDtype wire) {
  const char* env = std::getenv("PSTRAIN_FASHION_MNIST");
  const std::string dir = env != nullptr ? env : "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "no Fashion-MNIST at " << dir << " (PSTRAIN_FASHION_MNIST)";
  }
  JobSpec spec;
  spec.name = "gpu-demo";
  spec.model = "lenet";
  const DataRoot root = UseIdxDir(dir, &spec);
  spec.optimizer.set_kind(OptimizerConfig::SGD);
  spec.optimizer.set_lr(0.05);
  spec.optimizer.set_momentum(0.9);
  spec.lr_schedule.kind = "cosine";
  spec.workers = 2;
  spec.shards = 2;
  spec.epochs = 3;
  spec.batch_size = 64;
  spec.seed = 42;
  spec.wire_dtype = wire;
  spec.wire_error_feedback = wire != WireDtype::kFp32;
  auto data = LoadData(spec.data, spec.seed, root);
  ASSERT_TRUE(data.ok()) << data.status();
  Shards shards(2);
  auto results = TrainRanksOnGpu(spec, *data, 2, [&](int, TrainerOptions& o) {
    o.shards = shards.ptrs;
    return absl::OkStatus();
  });
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  std::printf("gpu demo (wire %s): final accuracy %.4f, %.0f samples/s per worker\n",
              wire == WireDtype::kFp32 ? "fp32" : "bf16", results[0]->final_accuracy,
              results[0]->samples / std::max(1e-9, results[0]->seconds));
  EXPECT_GE(results[0]->final_accuracy, 0.87);
}

TEST(GpuTest, PsTwoWorkersOnOneGpuReachTheDemosAccuracy) {
  REQUIRE_CUDA();
  ExpectPsDemoOnOneGpu(WireDtype::kFp32);
}

// The same over a bf16 wire with error feedback, narrowed on the GPU.
TEST(GpuTest, PsTwoWorkersOnOneGpuOverABf16WireReachTheDemosAccuracy) {
  REQUIRE_CUDA();
  ExpectPsDemoOnOneGpu(WireDtype::kBf16);
}

}  // namespace
}  // namespace pstrain
