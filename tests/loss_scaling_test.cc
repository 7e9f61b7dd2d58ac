// Dynamic loss scaling (precision fp16) through the real training loop.
// LibTorch 1.13's CPU autocast has no float16, so most of these drive the
// scaler in fp32 (TrainerOptions.loss_scaling): everything fp16 adds besides
// the narrow arithmetic -- the scaled backward, the unscale and check, a
// skipped step as an empty push (parameter server) or skipped on every rank
// (all-reduce), the scale's updates and their reports. fp16 autocast itself
// runs in Fp16AutocastTrainsWithinOnePointOfFp32 where the LibTorch has it
// on the CPU (make test-torch2), and on a GPU (tests/gpu_test).
#include <ATen/ops/equal.h>
#include <ATen/ops/isfinite.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "common/torch_compat.h"
#include "tests/trainer_testing.h"
#include "worker/model.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

LossScalerOptions Scaling(double init, int growth_interval = 2000, int max_consecutive_skips = 32) {
  LossScalerOptions o;
  o.init_scale = init;
  o.growth_interval = growth_interval;
  o.max_consecutive_skips = max_consecutive_skips;
  return o;
}

// Scaling by a power of two and unscaling is exact: two SYNC workers that
// scale their losses by 1024 train exactly like one unscaled worker on the
// concatenated batches -- in both modes (all-reduce unscales the reduced
// buckets, and clips after it). Without the unscale every update would be
// 1024 times too large.
TEST(LossScalingTest, APowerOfTwoScaleChangesNothingInEitherMode) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  auto scaled = [](TrainerOptions& o) { o.loss_scaling = Scaling(1024); };
  JobSpec ps = TwoWorkerSyncSpec("scaled-ps");
  ps.max_steps = 20;
  Shards shards(2);
  ExpectLikeOneWorkerOnTheConcatenatedBatch(ps, *data, RunTwoWorkers(ps, *data, shards.ptrs, scaled));
  JobSpec ar = TwoWorkerSyncSpec("scaled-ar", TrainMode::kAllReduce);
  ar.max_steps = 20;
  ar.clip_grad_norm = 5.0;
  ExpectLikeOneWorkerOnTheConcatenatedBatch(ar, *data, RunTwoAllReduceWorkers(ar, *data, scaled));
}

struct TwoRanks {
  std::vector<absl::StatusOr<TrainResult>> results;
  std::vector<std::vector<WorkerEvent::Progress>> progress{2};
};

TwoRanks TrainTwo(const JobSpec& spec, const TrainTest& data, const LossScalerOptions& scaling) {
  TwoRanks run;
  absl::Mutex mu;
  auto adjust = [&](TrainerOptions& o) {
    o.loss_scaling = scaling;
    const int rank = o.rank;
    o.emit = [&, rank](const WorkerEvent& e) {
      absl::MutexLock lock(&mu);
      if (e.has_progress()) run.progress[rank].push_back(e.progress());
    };
  };
  if (spec.allreduce()) {
    run.results = RunTwoAllReduceWorkers(spec, data, adjust);
  } else {
    Shards shards(spec.shards);
    run.results = RunTwoWorkers(spec, data, shards.ptrs, adjust);
  }
  return run;
}

std::vector<JobSpec> EveryMode(const std::string& name) {
  JobSpec async = TwoWorkerSyncSpec(name + "-async");
  async.consistency = ASYNC;
  JobSpec ssp = TwoWorkerSyncSpec(name + "-ssp");
  ssp.consistency = SSP;
  ssp.staleness = 1;
  return {async, ssp, TwoWorkerSyncSpec(name + "-sync"), TwoWorkerSyncSpec(name + "-ar", TrainMode::kAllReduce)};
}

// A loss scale of 2^135 overflows float32 (2^128 and up is Inf, and with a
// loss above 2 so is 2^127): the first 8 steps of every worker overflow, so
// after 8 steps nothing may have changed -- not the values, not the
// optimizer state (the next test trains on) -- in every mode, and each rank
// says it skipped 8 steps, its scale down to 2^127.
TEST(LossScalingTest, OverflowingStepsChangeNothingInAnyMode) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  auto init = CreateModel("lenet", {1, 28, 28}, 10, 7);
  ASSERT_TRUE(init.ok());
  for (JobSpec spec : EveryMode("overflow")) {
    SCOPED_TRACE(spec.name);
    spec.max_steps = 8;
    spec.log_every_steps = 8;
    TwoRanks run = TrainTwo(spec, *data, Scaling(0x1p135));
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(run.results[r].ok()) << run.results[r].status();
      EXPECT_EQ(run.results[r]->steps, 8);
      EXPECT_EQ(run.results[r]->skipped_steps, 8) << "rank " << r;
      const auto params = (*init)->NamedParameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(at::equal(run.results[r]->parameters[i].second, params[i].second.detach()))
            << params[i].first << " changed on rank " << r;
      }
      ASSERT_FALSE(run.progress[r].empty());
      const WorkerEvent::Progress& last = run.progress[r].back();
      EXPECT_EQ(last.skipped_steps(), 8);
      EXPECT_EQ(last.loss_scale(), 0x1p127);
      EXPECT_TRUE(std::isfinite(last.loss())) << "the reported loss is the unscaled one";
    }
  }
}

// The same start, trained on: once the scale is low enough the steps go
// through, in every mode, and the SYNC jobs learn; SYNC ranks end with the
// same values, and all-reduce ranks (checking the same reduced gradients)
// skip the very same steps. (Parameter-server workers each check their own
// gradients: their counts may differ.) And the scale grows back: from 1, doubling after every
// 10 clean steps, 60 steps end at 64 with nothing skipped.
TEST(LossScalingTest, TrainingRecoversAndTheScaleGrowsInEveryMode) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  for (JobSpec spec : EveryMode("recover")) {
    SCOPED_TRACE(spec.name);
    spec.epochs = 3;
    spec.max_steps = 150;
    // At lr 0.01 this run converges: 0.9395 in both SYNC modes under every
    // ATEN_CPU_CAPABILITY (default, avx2, avx512). At the helpers' 0.05 it
    // was chaotic, and its accuracy a matter of which kernels LibTorch
    // picked: 0.50 to 0.85 across CPUs, 0.59 on LibTorch 2.6.
    spec.optimizer.set_lr(0.01);
    TwoRanks run = TrainTwo(spec, *data, Scaling(0x1p135, /*growth_interval=*/10));
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(run.results[r].ok()) << run.results[r].status();
      const TrainResult& result = *run.results[r];
      std::printf("%s rank %d: %lld of %lld steps skipped\n", spec.name.c_str(), r,
                  static_cast<long long>(result.skipped_steps), static_cast<long long>(result.steps));
      EXPECT_GE(result.skipped_steps, 8);
      EXPECT_LT(result.skipped_steps, 30);
    }
    std::printf("%s: accuracy %.4f\n", spec.name.c_str(), run.results[0]->final_accuracy);
    for (const auto& [name, t] : run.results[0]->parameters) EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << name;
    if (spec.consistency == SYNC) {
      // Seeded and synchronous: the same figures every run on one machine,
      // and a bound with a wide margin across kernels (measured 0.9395
      // everywhere; 10 classes: chance is 0.1). ASYNC/SSP accuracy is also
      // a matter of thread timing (0.86 to 0.98 measured): not asserted.
      EXPECT_GT(run.results[0]->final_accuracy, 0.8);
      for (size_t i = 0; i < run.results[0]->parameters.size(); ++i) {
        EXPECT_TRUE(at::equal(run.results[0]->parameters[i].second, run.results[1]->parameters[i].second));
      }
    }
    if (spec.allreduce()) {
      EXPECT_EQ(run.results[0]->skipped_steps, run.results[1]->skipped_steps);
    }
    spec.max_steps = 60;
    TwoRanks growing = TrainTwo(spec, *data, Scaling(1.0, /*growth_interval=*/10));
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(growing.results[r].ok()) << growing.results[r].status();
      EXPECT_EQ(growing.results[r]->skipped_steps, 0);
      ASSERT_FALSE(growing.progress[r].empty());
      EXPECT_EQ(growing.progress[r].back().step(), 60);
      EXPECT_EQ(growing.progress[r].back().loss_scale(), 64.0);
    }
  }
}

// Resuming: the scale a checkpoint kept replaces the initial one, and every
// step boundary (where a checkpoint pauses the worker) tells the scale the
// step will use; without loss scaling it tells none.
TEST(LossScalingTest, TheScaleIsGivenAtEveryStepBoundaryAndResumedFrom) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  for (bool scaled : {true, false}) {
    JobSpec spec = SyntheticSpec(scaled ? "resume-scale" : "no-scale", "lenet");
    spec.max_steps = 6;
    Shards shards(1);
    TrainerOptions o;
    o.spec = spec;
    o.shards = shards.ptrs;
    o.write_weights = false;
    if (scaled) {
      o.loss_scaling = Scaling(1024);
      o.start_loss_scale = 256;
    }
    std::vector<std::optional<double>> seen;
    o.at_step_boundary = [&](const StepBoundary& at) {
      seen.push_back(at.loss_scale ? std::optional<double>(at.loss_scale()) : std::nullopt);
    };
    double reported = -1;
    o.emit = [&](const WorkerEvent& e) {
      if (e.has_progress() && e.progress().has_loss_scale()) reported = e.progress().loss_scale();
    };
    auto r = RunTrainer(o, *data);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(seen.size(), 6u);
    for (const auto& scale : seen) {
      if (scaled) {
        ASSERT_TRUE(scale.has_value());
        EXPECT_EQ(*scale, 256.0);
      } else {
        EXPECT_FALSE(scale.has_value());
      }
    }
    EXPECT_EQ(reported, scaled ? 256.0 : -1.0);
  }
}

// Gradients that are not finite at any scale (here: a scale that stays
// Inf) fail the job after max_consecutive_skips steps, in both modes, with a
// message that says what to do.
TEST(LossScalingTest, ARunOfOverflowsFailsTheJob) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  for (JobSpec spec : {TwoWorkerSyncSpec("diverged-ps"), TwoWorkerSyncSpec("diverged-ar", TrainMode::kAllReduce)}) {
    SCOPED_TRACE(spec.name);
    spec.max_steps = 20;
    TwoRanks run = TrainTwo(spec, *data, Scaling(0x1p200, 2000, /*max_consecutive_skips=*/4));
    for (int r = 0; r < 2; ++r) {
      ASSERT_FALSE(run.results[r].ok());
      EXPECT_EQ(run.results[r].status().code(), absl::StatusCode::kFailedPrecondition) << run.results[r].status();
      EXPECT_NE(run.results[r].status().message().find("4 steps in a row"), std::string::npos)
          << run.results[r].status();
    }
  }
}

// precision fp16 for real: autocast to float16 on the CPU where this
// LibTorch has it (2.2 on); where not (Debian's 1.13), the worker refuses
// the job at start saying why, and the accuracy comparison is left to make
// test-torch2 and the GPU.
TEST(LossScalingTest, Fp16AutocastTrainsWithinOnePointOfFp32) {
  if (!kCpuAutocastHasFp16) {
    JobSpec spec = SyntheticSpec("fp16-cpu", "lenet");
    spec.precision = Precision::kFp16;
    Shards shards(1);
    auto data = LoadData(spec.data, spec.seed);
    ASSERT_TRUE(data.ok());
    TrainerOptions o;
    o.spec = spec;
    o.shards = shards.ptrs;
    o.write_weights = false;
    auto r = RunTrainer(o, *data);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("LibTorch 2.2"), std::string::npos) << r.status();
    GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION << ") has no float16 CPU autocast (2.2 on): the refusal was "
                 << "checked; make test-torch2 (LibTorch 2.6) and tests/gpu_test train in fp16";
  }
  ExpectAutocastWithinOnePointOfFp32(c10::Device(c10::kCPU), Precision::kFp16);
}

}  // namespace
}  // namespace pstrain
