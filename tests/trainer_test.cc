// The training loop against in-process shards (ShardStore behind the
// ParameterStore interface): the correctness test of the SYNC path, and the
// TorchScript model path.
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "collective/collective.h"
#include "tests/trainer_testing.h"
#include "worker/model.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

// Two SYNC workers with batch B must train exactly like one worker with
// batch 2B on the concatenated batches: the shard averages the two halves'
// mean gradients, which is the mean gradient over all 2B examples.
TEST(TrainerTest, SyncTwoWorkersEqualOneWorkerOnTheConcatenatedBatch) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  const int kSteps = 20;

  JobSpec two = SyntheticSpec("sync-two", "lenet");
  two.consistency = SYNC;
  two.workers = 2;
  two.shards = 2;
  two.batch_size = 16;
  two.max_steps = kSteps;
  two.chunk_bytes = 16 << 10;  // several chunks per shard
  two.bucket_bytes = 8 << 10;  // several buckets
  Shards shards2(2);
  ExpectLikeOneWorkerOnTheConcatenatedBatch(two, *data, RunTwoWorkers(two, *data, shards2.ptrs));
}

// All-reduce mode: two workers averaging their gradients with Gloo (real
// sockets) train exactly like one worker on the concatenated batches, with
// the bucket reductions overlapping backward (several buckets).
TEST(TrainerTest, AllReduceTwoWorkersEqualOneWorkerOnTheConcatenatedBatch) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  const int kSteps = 20;
  JobSpec two = AllReduceSpec("ar-two", "lenet", 2, 16, kSteps);
  two.bucket_bytes = 8 << 10;  // several buckets
  two.clip_grad_norm = 5.0;    // applied to the averaged gradients
  auto results = RunTwoAllReduceWorkers(two, *data);
  ExpectLikeOneWorkerOnTheConcatenatedBatch(two, *data, results);
}

// Quantization-aware training on two all-reduce workers: every activation
// observer takes the range of both ranks' batches, so both ranks hold the
// same quantizers bit for bit (without the reduction each rank's observers
// see only its batch), and they are those of one worker on the
// concatenated batch. One QAT step after two fp32 ones: fake quantization
// rounds, so over many steps a last-bit difference between the two runs'
// kernels (batch 16 against 32) may flip a rounding and grow.
void ExpectQatWorkersLikeOneWorker(const JobSpec& two, const TrainTest& data,
                                   const std::vector<absl::StatusOr<TrainResult>>& results) {
  TrainResult one;
  // One element of a parameter may be further off: for a weight right at
  // a rounding or clamping edge of its fake quantization, the last bit
  // (two workers' sums ordered unlike one worker's) decides the step, and
  // the straight-through estimator's mask with it. Seen with
  // ATEN_CPU_CAPABILITY avx2 and avx512: one of fc3.weight's 840 elements
  // off by 3.9e-4, every other element of every parameter within 2e-8.
  ExpectLikeOneWorkerOnTheConcatenatedBatch(two, data, results, c10::Device(c10::kCPU), 1e-4, 1e-5, &one,
                                            /*stray=*/1);
  if (::testing::Test::HasFailure()) return;
  ASSERT_EQ(results[0]->buffers.size(), one.buffers.size());
  ASSERT_GT(one.buffers.size(), 8u);
  for (size_t i = 0; i < one.buffers.size(); ++i) {
    const auto& [name, a] = one.buffers[i];
    const at::Tensor& b = results[0]->buffers[i].second;
    EXPECT_TRUE(at::equal(b, results[1]->buffers[i].second)) << name << ": the two workers' quantizers disagree";
    if (name.rfind("qat.input.", 0) == 0) {
      EXPECT_TRUE(at::equal(a, b)) << name << ": the inputs' range is exact";
    } else if (a.is_floating_point()) {
      EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-5)) << name << " differs by " << a.sub(b).abs().max().item<double>();
    } else {
      EXPECT_LE(a.sub(b).abs().max().item<int64_t>(), 1) << name;  // a zero point, rounded
    }
  }
}

TEST(TrainerTest, AllReduceQatWorkersShareTheirObserversAndTrainLikeOneWorker) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec two = AllReduceSpec("ar-qat", "lenet", 2, 16, 3);
  two.quantization.mode = "qat";
  two.quantization.start_step = 2;  // fp32 steps first, as a job has them
  ExpectQatWorkersLikeOneWorker(two, *data, RunTwoAllReduceWorkers(two, *data));
}

// The same with two SYNC parameter-server workers (issue 36): their
// observers share every batch's range over a Gloo group of their own
// (TrainerOptions::observer_group), the shards average the gradients.
TEST(TrainerTest, SyncPsQatWorkersShareTheirObserversAndTrainLikeOneWorker) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec two = SyntheticSpec("ps-qat", "lenet");
  two.consistency = SYNC;
  two.workers = two.min_workers = 2;
  two.shards = 2;
  two.batch_size = 16;
  two.max_steps = 3;
  two.quantization.mode = "qat";
  two.quantization.start_step = 2;
  Shards shards(2);
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Collective>> groups(2);
  auto results = TrainRanks(two, *data, 2, [&](int r, TrainerOptions& o) -> absl::Status {
    auto group = LoopbackGlooRank(store, r, 2);
    if (!group.ok()) return group.status();
    groups[r] = std::move(*group);
    o.shards = shards.ptrs;
    o.observer_group = groups[r].get();
    return absl::OkStatus();
  });
  ExpectQatWorkersLikeOneWorker(two, *data, results);
}

// NaN in one rank's batch: every rank's averaged gradient is NaN, and the
// job (the table's default policy, REJECT) fails on every rank naming that
// step -- at once where the host checks (LibTorch 1.13), at the next step
// where the device decided (fused SGD, 2.4+) -- with nothing applied.
TEST(TrainerTest, AllReduceNaNStepFailsEveryRankNamingIt) {
  auto clean = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(clean.ok());
  const JobSpec two = AllReduceSpec("ar-nan", "lenet", 2, 16, 8);
  auto results = RunTwoAllReduceWorkers(two, WithNaNInBatch(*clean, two, 2, /*micro=*/3));
  for (int r = 0; r < 2; ++r) ExpectFailedOnNaNStep(results[r], 3);
}

std::vector<double> Losses(const std::vector<WorkerEvent>& events) {
  std::vector<double> out;
  for (const auto& e : events) {
    if (e.has_progress()) out.push_back(e.progress().loss());
  }
  return out;
}

TEST(TrainerTest, AllReduceResumeStartsFromTheRestoredValues) {
  ExpectAllReduceResumeStartsFromTheTablesValues(c10::Device(c10::kCPU), Collective::Backend::kGloo);
}

TEST(TrainerTest, TorchScriptModuleWrittenInPythonTrains) {
  JobSpec spec = SyntheticSpec("scripted", "torchscript:worker/testdata/small_net.pt");
  spec.batch_size = 32;
  spec.max_steps = 60;
  Shards shards(2);
  spec.shards = 2;
  auto data = LoadData(spec.data, spec.seed);
  ASSERT_TRUE(data.ok());
  std::vector<WorkerEvent> events;
  TrainerOptions o;
  o.spec = spec;
  o.data_root = TestModelsRoot();
  o.shards = shards.ptrs;
  o.write_weights = false;
  o.emit = [&](const WorkerEvent& e) { events.push_back(e); };
  int64_t steps_seen = 0, samples_seen = 0;
  o.on_step = [&](int64_t step, double loss, int64_t samples, double secs, double wait) {
    EXPECT_EQ(step, steps_seen + 1);
    EXPECT_GE(loss, 0);
    EXPECT_GE(secs, wait);
    steps_seen = step;
    samples_seen += samples;
  };
  auto result = RunTrainer(o, *data);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(steps_seen, 60);
  EXPECT_EQ(samples_seen, 60 * 32);
  std::vector<double> losses = Losses(events);
  ASSERT_GE(losses.size(), 4u);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "loss did not fall";
  EXPECT_GT(result->final_accuracy, 0.5);  // 10 classes: chance is 0.1
  // Its parameters are the module's own, by name.
  EXPECT_EQ(result->parameters.front().first, "conv.weight");
}

// eval_every_epochs: rank 0 evaluates after every N epochs while training
// (never after the last: the final evaluation follows it), or only at the
// end with 0.
TEST(TrainerTest, EvaluatesEveryNEpochsOrOnlyAtTheEnd) {
  JobSpec spec = SyntheticSpec("eval-every", "mlp");
  spec.batch_size = 256;  // 8 steps an epoch
  spec.epochs = 6;
  auto data = LoadData(spec.data, spec.seed);
  ASSERT_TRUE(data.ok());
  for (auto [every, expect] : {std::pair{1, std::vector<int>{1, 2, 3, 4, 5}}, std::pair{2, std::vector<int>{2, 4}},
                               std::pair{4, std::vector<int>{4}}, std::pair{0, std::vector<int>{}}}) {
    spec.eval_every_epochs = every;
    Shards shards(1);
    TrainerOptions o;
    o.spec = spec;
    o.shards = shards.ptrs;
    o.write_weights = false;
    std::vector<int> mid_run;
    int finals = 0;
    o.emit = [&](const WorkerEvent& e) {
      if (!e.has_eval()) return;
      if (e.eval().final()) {
        ++finals;
      } else {
        mid_run.push_back(e.eval().epoch());
      }
    };
    auto result = RunTrainer(o, *data);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(mid_run, expect) << "eval_every_epochs " << every;
    EXPECT_EQ(finals, 1) << "eval_every_epochs " << every;
  }
}

// bf16 autocast on the CPU (what CI can run): forward and backward in bf16,
// the parameters and the shard's optimizer in fp32. It must really change
// the arithmetic (the parameters differ from fp32's) and still train as
// well: within one point of fp32's accuracy.
TEST(TrainerTest, Bf16AutocastTrainsWithinOnePointOfFp32) {
  ExpectAutocastWithinOnePointOfFp32(c10::Device(c10::kCPU), Precision::kBf16);
}

// wire_dtype: two SYNC workers pushing bf16 (and fp16) gradients and
// pulling narrow values through the shards' float32 state train like fp32
// to within a point of accuracy (an MLP on a Fashion-MNIST subset), with and
// without error feedback; the wire really changed the arithmetic; the two
// workers still agree exactly.
TEST(TrainerTest, NarrowWireTrainsLikeFp32) {
  const std::string dir = FashionMnistDir();
  if (dir.empty()) GTEST_SKIP() << "no Fashion-MNIST (make setup installs dataset-fashion-mnist)";
  JobSpec spec = SyntheticSpec("wire", "mlp");
  const DataRoot root = UseIdxDir(dir, &spec);
  spec.data.limit_train = 12000;
  spec.data.limit_test = 2000;
  spec.consistency = SYNC;
  spec.workers = 2;
  spec.shards = 2;
  spec.batch_size = 32;
  spec.epochs = 2;
  spec.chunk_bytes = 64 << 10;
  auto data = LoadData(spec.data, spec.seed, root);
  ASSERT_TRUE(data.ok());
  struct Variant {
    const char* name;
    WireDtype wire;
    bool feedback;
  };
  std::map<std::string, std::vector<absl::StatusOr<TrainResult>>> results;
  for (const Variant& v : {Variant{"fp32", WireDtype::kFp32, false}, Variant{"bf16", WireDtype::kBf16, false},
                           Variant{"bf16+feedback", WireDtype::kBf16, true}, Variant{"fp16", WireDtype::kFp16, false}}) {
    JobSpec s = spec;
    s.wire_dtype = v.wire;
    s.wire_error_feedback = v.feedback;
    Shards shards(2);
    auto& r = results[v.name];
    r = RunTwoWorkers(s, *data, shards.ptrs);
    ASSERT_TRUE(r[0].ok() && r[1].ok()) << v.name << ": " << (r[0].ok() ? r[1].status() : r[0].status());
    std::printf("wire %s: accuracy %.4f\n", v.name, r[0]->final_accuracy);
    for (size_t i = 0; i < r[0]->parameters.size(); ++i) {
      EXPECT_TRUE(at::equal(r[0]->parameters[i].second, r[1]->parameters[i].second)) << v.name;
    }
  }
  const TrainResult& fp32 = *results["fp32"][0];
  EXPECT_GT(fp32.final_accuracy, 0.75);
  for (const char* name : {"bf16", "bf16+feedback", "fp16"}) {
    const TrainResult& narrow = *results[name][0];
    // SYNC and seeded: the same figures every run (2000 test images: a
    // point is 20 of them).
    EXPECT_GE(narrow.final_accuracy, fp32.final_accuracy - 0.01) << name;
    EXPECT_FALSE(at::equal(fp32.parameters[0].second, narrow.parameters[0].second)) << name << " changed nothing";
  }
}

// All-reduce with a narrow wire: fp16 buckets (averaged, narrowed, summed by
// Gloo, widened) train like fp32 within a point; bf16, which Gloo cannot sum
// here, falls back to fp32 and gives fp32's result exactly.
TEST(TrainerTest, AllReduceFp16WireTrainsLikeFp32AndBf16FallsBack) {
  const std::string dir = FashionMnistDir();
  if (dir.empty()) GTEST_SKIP() << "no Fashion-MNIST (make setup installs dataset-fashion-mnist)";
  JobSpec spec = SyntheticSpec("ar-wire", "mlp");
  spec.mode = TrainMode::kAllReduce;
  spec.shards = 0;
  spec.consistency = SYNC;
  spec.workers = 2;
  const DataRoot root = UseIdxDir(dir, &spec);
  spec.data.limit_train = 12000;
  spec.data.limit_test = 2000;
  spec.batch_size = 32;
  spec.epochs = 2;
  spec.bucket_bytes = 256 << 10;  // several buckets
  auto data = LoadData(spec.data, spec.seed, root);
  ASSERT_TRUE(data.ok());
  std::map<std::string, TrainResult> results;
  for (WireDtype wire : {WireDtype::kFp32, WireDtype::kFp16, WireDtype::kBf16}) {
    JobSpec s = spec;
    s.wire_dtype = wire;
    auto r = RunTwoAllReduceWorkers(s, *data);
    ASSERT_TRUE(r[0].ok() && r[1].ok()) << Name(wire) << ": " << (r[0].ok() ? r[1].status() : r[0].status());
    std::printf("all-reduce wire %s: accuracy %.4f\n", Name(wire), r[0]->final_accuracy);
    for (size_t i = 0; i < r[0]->parameters.size(); ++i) {
      EXPECT_TRUE(at::equal(r[0]->parameters[i].second, r[1]->parameters[i].second)) << Name(wire);
    }
    results[Name(wire)] = *r[0];
  }
  EXPECT_GT(results["fp32"].final_accuracy, 0.75);
  EXPECT_GE(results["fp16"].final_accuracy, results["fp32"].final_accuracy - 0.01);
  EXPECT_FALSE(at::equal(results["fp32"].parameters[0].second, results["fp16"].parameters[0].second));
  for (size_t i = 0; i < results["fp32"].parameters.size(); ++i) {
    EXPECT_TRUE(at::equal(results["fp32"].parameters[i].second, results["bf16"].parameters[i].second))
        << "bf16 should fall back to fp32 with Gloo";
  }
}

// A worker covering a vacant rank (SYNC) finishes each rank's batch on its
// own -- clipped, and with loss scaling unscaled, as that rank's worker
// would -- before summing, so covering trains exactly like the two workers.
// Rank 1 pushes steps 0 and 1 and leaves; the coordinator's view marks it
// vacant after its step-1 push arrived and before rank 0's (rank 0 waits at
// its step boundary), so no batch is lost: step 1 completes with both, and
// from step 2 rank 0 trains its own batch and rank 1's. Clipping binds
// (gradient norms above clip_grad_norm): clipping the sum instead would
// halve every covered step.
TEST(TrainerTest, ACoveringWorkerClipsEachRanksBatchOnItsOwn) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec spec = TwoWorkerSyncSpec("cover-clip");
  // The test lets rank 0 push step 1 only after all of rank 1's step-1
  // pushes arrived; with requests taking turns rank 1 would wait for rank
  // 0's answers first.
  spec.requests_in_flight = 0;
  spec.max_steps = 12;
  spec.clip_grad_norm = 0.2;
  spec.log_every_steps = 1;
  for (bool scaled : {false, true}) {
    SCOPED_TRACE(scaled ? "loss scaling" : "no loss scaling");
    auto scale = [&](TrainerOptions& o) {
      if (!scaled) return;
      LossScalerOptions l;
      l.init_scale = 1024;
      o.loss_scaling = l;
    };
    Shards reference_shards(2);
    auto reference = RunTwoWorkers(spec, *data, reference_shards.ptrs, scale);
    ASSERT_TRUE(reference[0].ok()) << reference[0].status();

    Shards shards(2);
    std::vector<double> norms;
    absl::Status seats = absl::UnknownError("rank 0 never reached step 1");
    auto results = RunTwoWorkers(spec, *data, shards.ptrs, [&](TrainerOptions& o) {
      scale(o);
      if (o.rank == 1) {
        o.spec.max_steps = 2;
        return;
      }
      o.emit = [&](const WorkerEvent& e) {
        if (e.has_progress() && e.progress().has_grad_norm()) norms.push_back(e.progress().grad_norm());
      };
      o.at_step_boundary = [&](const StepBoundary& at) {
        if (at.step != 1) return;
        // Rank 1's step-1 push on every chunk of both shards (step 0: two
        // arrivals per chunk, step 1: one), then rank 1 leaves the view.
        seats = AwaitPushes(shards, spec.name, 3);
        if (seats.ok()) seats = SetSeats(shards, spec.name, {true, false});
      };
    });
    ASSERT_TRUE(seats.ok()) << seats;
    ASSERT_TRUE(results[0].ok()) << results[0].status();
    ASSERT_TRUE(results[1].ok()) << results[1].status();
    EXPECT_EQ(results[1]->steps, 2);
    // Rank 0 trained its own 12 batches and rank 1's of steps 2..11.
    EXPECT_EQ(results[0]->samples, (12 + 10) * 16);
    ASSERT_FALSE(norms.empty());
    EXPECT_GT(*std::max_element(norms.begin(), norms.end()), 2 * spec.clip_grad_norm) << "clipping never bound";
    for (size_t i = 0; i < reference[0]->parameters.size(); ++i) {
      const auto& [name, want] = reference[0]->parameters[i];
      const at::Tensor& got = results[0]->parameters[i].second;
      EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5))
          << name << " differs by " << got.sub(want).abs().max().item<double>();
    }
  }
}

// Requests take turns at each shard (requests_in_flight: 1), and under SYNC
// a request is answered only when every active worker sent it: so every
// worker must send its buckets in one order. Here rank 0 covers vacant rank
// 2's batch and offers its gradients after backward, while rank 1 trains
// only its own and offers them during backward, from its hooks: without one
// order the two would each wait for the other's first request (until the
// 120 s deadline). Rank 2 never starts; rank 0 marks it vacant before step
// 0, so from step 1 on rank 0 covers it.
TEST(TrainerTest, ACoveringWorkerAndAHookWorkerSendTheirBucketsInOneOrder) {
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  ASSERT_TRUE(data.ok());
  JobSpec spec = TwoWorkerSyncSpec("turns");
  spec.workers = 3;
  spec.requests_in_flight = 1;
  spec.max_steps = 6;
  Shards shards(2);
  absl::Status seats = absl::UnknownError("rank 0 never reached step 0");
  auto results = RunTwoWorkers(spec, *data, shards.ptrs, [&](TrainerOptions& o) {
    o.world_size = 3;
    if (o.rank != 0) return;
    o.at_step_boundary = [&](const StepBoundary& at) {
      if (at.step == 0) seats = SetSeats(shards, spec.name, {true, true, false});
    };
  });
  ASSERT_TRUE(seats.ok()) << seats;
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->samples, (6 + 5) * 16) << "rank 0 covers rank 2 from step 1";
  EXPECT_EQ(results[1]->samples, 6 * 16);
  for (size_t i = 0; i < results[0]->parameters.size(); ++i) {
    EXPECT_TRUE(at::equal(results[0]->parameters[i].second, results[1]->parameters[i].second));
  }
}

TEST(TrainerTest, MissingTorchScriptFileIsAClearError) {
  JobSpec spec = SyntheticSpec("missing", "torchscript:nonexistent/net.pt");
  Shards shards(1);
  auto data = LoadData(spec.data, spec.seed);
  TrainerOptions o;
  o.spec = spec;
  o.shards = shards.ptrs;
  o.data_root = TestModelsRoot();
  auto result = RunTrainer(o, *data);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound) << result.status();
  EXPECT_NE(result.status().message().find("nonexistent/net.pt"), absl::string_view::npos);
  EXPECT_NE(result.status().message().find("--data_root"), absl::string_view::npos);
}

// A model is code (aten::from_file reads files): only one the worker's
// operator put under --data_root is loaded.
TEST(TrainerTest, TorchScriptOutsideTheDataRootIsRefused) {
  Shards shards(1);
  auto data = LoadData(SyntheticSpec("x", "lenet").data, 7);
  const std::string outside = std::filesystem::absolute("worker/testdata/small_net.pt").string();
  for (const std::string& model : {"torchscript:" + outside, std::string("torchscript:../small_net.pt")}) {
    TrainerOptions o;
    o.spec = SyntheticSpec("outside", model);
    o.shards = shards.ptrs;
    std::filesystem::create_directories(::testing::TempDir() + "/empty_root");
    o.data_root = DataRoot{::testing::TempDir() + "/empty_root"};
    auto result = RunTrainer(o, *data);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << model << ": " << result.status();
  }
}

}  // namespace
}  // namespace pstrain
