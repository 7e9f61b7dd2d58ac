// Helpers of the trainer tests (CPU and GPU): a synthetic job, in-process
// shards, and the check that N synchronous workers train like one worker on
// the concatenated batches.
#ifndef PSTRAIN_TESTS_TRAINER_TESTING_H_
#define PSTRAIN_TESTS_TRAINER_TESTING_H_

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective/collective.h"
#include "common/partition_plan.h"
#include "rpc/tensor_codec.h"
#include "table/shard_store.h"
#include "worker/model.h"
#include "worker/sampler.h"
#include "worker/trainer.h"

namespace pstrain {

// A data root for tests' torchscript:worker/testdata/<file>.pt models: a
// temporary directory with copies of them (Bazel's runfiles are symbolic
// links out of the tree, which a data root refuses to follow).
inline DataRoot TestModelsRoot() {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / "models_root";
  std::error_code ec;
  fs::create_directories(root / "worker/testdata", ec);
  for (const char* name : {"small_net.pt", "small_net_f64.pt", "sequential_net.pt", "not_sequential_net.pt",
                           "named_stages_net.pt", "shared_stages_net.pt"}) {
    const fs::path from = fs::path("worker/testdata") / name;
    if (fs::exists(from) && !fs::exists(root / from)) fs::copy_file(from, root / from, ec);
  }
  return DataRoot{root.string()};
}


inline JobSpec SyntheticSpec(const std::string& name, const std::string& model) {
  JobSpec spec;
  spec.name = name;
  spec.model = model;
  spec.data.format = "synthetic";
  spec.data.synthetic_train = 2048;
  spec.data.synthetic_test = 512;
  spec.optimizer.set_kind(OptimizerConfig::SGD);
  spec.optimizer.set_lr(0.05);
  spec.optimizer.set_momentum(0.9);
  spec.epochs = 1;
  spec.seed = 7;
  spec.log_every_steps = 5;
  return spec;
}

// `workers` all-reduce workers of `model` on synthetic data (no shards),
// `batch_size` each, `max_steps` steps.
inline JobSpec AllReduceSpec(const std::string& name, const std::string& model, int workers, int64_t batch_size,
                             int64_t max_steps) {
  JobSpec spec = SyntheticSpec(name, model);
  spec.mode = TrainMode::kAllReduce;
  spec.consistency = SYNC;
  spec.workers = workers;
  spec.shards = 0;
  spec.batch_size = batch_size;
  spec.max_steps = max_steps;
  return spec;
}

// A run that must have failed on a NaN step: INVALID_ARGUMENT naming `step`.
inline void ExpectFailedOnNaNStep(const absl::StatusOr<TrainResult>& result, int64_t step) {
  ASSERT_FALSE(result.ok()) << "trained through a NaN step";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find("gradients of step " + std::to_string(step) + " have NaN or Inf"),
            std::string::npos)
      << result.status();
}

// Two SYNC workers of a LeNet on synthetic data, batch 16; ps mode on two
// shards with several chunks and buckets, or all-reduce.
inline JobSpec TwoWorkerSyncSpec(const std::string& name, TrainMode mode = TrainMode::kParameterServer) {
  JobSpec spec = SyntheticSpec(name, "lenet");
  spec.mode = mode;
  spec.consistency = SYNC;
  spec.workers = 2;
  spec.shards = mode == TrainMode::kAllReduce ? 0 : 2;
  spec.batch_size = 16;
  spec.chunk_bytes = 16 << 10;
  spec.bucket_bytes = 8 << 10;
  return spec;
}

struct Shards {
  explicit Shards(int n) {
    for (int i = 0; i < n; ++i) {
      ShardStoreOptions o;
      o.shard_index = i;
      o.num_shards = n;
      stores.push_back(std::make_unique<ShardStore>(o));
      ptrs.push_back(stores.back().get());
    }
  }
  std::vector<std::unique_ptr<ShardStore>> stores;
  std::vector<ParameterStore*> ptrs;
};

// Calls an in-process store's method and waits for its callback.
template <typename Call>
absl::Status Await(Call call) {
  std::promise<absl::Status> done;
  call([&](absl::Status s) { done.set_value(s); });
  return done.get_future().get();
}

// The coordinator's view of the job's ranks, on every shard: seat r active
// when active[r] (generation 0).
inline absl::Status SetSeats(Shards& shards, const std::string& job, const std::vector<bool>& active) {
  for (auto& store : shards.stores) {
    SetWorkersRequest req;
    req.set_job(job);
    for (bool a : active) req.add_seats()->set_active(a);
    SetWorkersResponse resp;
    absl::Status s = Await([&](StatusCallback cb) { store->SetWorkersAsync(req, &resp, {}, cb); });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Until every shard's table of `job` has taken `per_chunk` pushes per chunk
// (30 s at most).
inline absl::Status AwaitPushes(Shards& shards, const std::string& job, int64_t per_chunk) {
  for (auto& store : shards.stores) {
    for (int i = 0; i < 30000; ++i) {
      StatsRequest req;
      req.set_job(job);
      StatsResponse resp;
      absl::Status s = Await([&](StatusCallback cb) { store->StatsAsync(req, &resp, {}, cb); });
      if (!s.ok()) return s;
      if (resp.tables_size() == 0) break;
      const TableStats& t = resp.tables(0);
      if (t.pushes_applied() >= per_chunk * t.num_chunks()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return absl::OkStatus();
}

// Completes a rank's options before it runs (tests: loss scaling, say).
using AdjustOptions = std::function<void(TrainerOptions&)>;

// Completes rank r's options before it runs (its shards, collective or
// device), on that rank's thread; an error is the rank's result.
using RankSetup = std::function<absl::Status(int, TrainerOptions&)>;

// Ranks 0 .. ranks-1 of `spec` trained at once (threads), weights not
// written, each rank's options completed by `setup`.
inline std::vector<absl::StatusOr<TrainResult>> TrainRanks(const JobSpec& spec, const TrainTest& data, int ranks,
                                                           const RankSetup& setup) {
  std::vector<absl::StatusOr<TrainResult>> results(ranks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      TrainerOptions o;
      o.spec = spec;
      o.data_root = TestModelsRoot();  // torchscript:worker/testdata/...
      o.rank = r;
      o.world_size = ranks;
      o.write_weights = false;
      absl::Status s = setup(r, o);
      results[r] = s.ok() ? RunTrainer(o, data) : absl::StatusOr<TrainResult>(s);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Ranks 0 and 1 of `spec` trained at once (threads) against `shards`.
inline std::vector<absl::StatusOr<TrainResult>> RunTwoWorkers(const JobSpec& spec, const TrainTest& data,
                                                              const std::vector<ParameterStore*>& shards,
                                                              const AdjustOptions& adjust = {}) {
  return TrainRanks(spec, data, 2, [&](int, TrainerOptions& o) {
    o.shards = shards;
    if (adjust) adjust(o);
    return absl::OkStatus();
  });
}

// Ranks 0 and 1 of an all-reduce `spec` at once (threads), meeting through
// an in-memory store over real Gloo sockets.
// Rank r of `size` in a Gloo group meeting through `store` (real sockets
// on the loopback).
inline absl::StatusOr<std::unique_ptr<Collective>> LoopbackGlooRank(const std::shared_ptr<KeyValueStore>& store,
                                                                    int r, int size) {
  CollectiveOptions co;
  co.rank = r;
  co.size = size;
  co.store = store;
  co.hostname = "127.0.0.1";
  return CreateCollective(Collective::Backend::kGloo, co);
}

inline std::vector<absl::StatusOr<TrainResult>> RunTwoAllReduceWorkers(const JobSpec& spec, const TrainTest& data,
                                                                       const AdjustOptions& adjust = {}) {
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Collective>> collectives(2);
  std::vector<std::unique_ptr<Shards>> locals(2);
  return TrainRanks(spec, data, 2, [&](int r, TrainerOptions& o) -> absl::Status {
    auto collective = LoopbackGlooRank(store, r, 2);
    if (!collective.ok()) return collective.status();
    collectives[r] = std::move(*collective);
    locals[r] = std::make_unique<Shards>(1);
    o.local_store = locals[r]->stores[0].get();
    o.collective = collectives[r].get();
    if (adjust) adjust(o);
    return absl::OkStatus();
  });
}

// Where Fashion-MNIST is ($PSTRAIN_FASHION_MNIST, else Debian's), or "" when
// it is not installed (the caller skips).
inline std::string FashionMnistDir() {
  const char* env = std::getenv("PSTRAIN_FASHION_MNIST");
  const std::string dir = env != nullptr ? env : "/usr/share/datasets/fashion-mnist";
  return std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz") ? dir : "";
}

// Points `spec` at the idx files in `dir` as a worker reads them: data.dir
// relative to a data root (the directory above `dir`), which is returned.
inline DataRoot UseIdxDir(const std::string& dir, JobSpec* spec) {
  const std::filesystem::path path(dir);
  spec->data.format = "idx";
  spec->data.dir = path.filename().string();
  return DataRoot{path.parent_path().string()};
}

// `data` with one NaN in the first example of rank 0's micro-batch `micro`
// in epoch 0, for `world` ranks of `spec`: that step's gradients (and, in
// all-reduce mode, every rank's averaged ones) are NaN.
inline TrainTest WithNaNInBatch(const TrainTest& data, const JobSpec& spec, int world, int64_t micro) {
  TrainTest out = data;
  out.train.inputs = data.train.inputs.clone();
  const std::vector<int64_t> order = DistributedSampler(data.train.size(), 0, world, spec.seed).Indices(0);
  out.train.inputs[order.at(static_cast<size_t>(micro * spec.batch_size))].fill_(NAN);
  return out;
}

// `two` trained by two workers gave `results`: both succeeded, agree exactly,
// and match one worker (ps mode, one shard) trained on the concatenated
// batches up to float rounding; and training moved the parameters from the
// seeded start (of a LeNet).
// `one_out`: where the one worker's result goes (optional). `stray`
// elements of a parameter may be further off (QAT: see
// ExpectQatWorkersLikeOneWorker).
inline void ExpectLikeOneWorkerOnTheConcatenatedBatch(const JobSpec& two, const TrainTest& data,
                                                      const std::vector<absl::StatusOr<TrainResult>>& results,
                                                      c10::Device device = c10::Device(c10::kCPU),
                                                      double rtol = 1e-4, double atol = 1e-5,
                                                      TrainResult* one_out = nullptr, int64_t stray = 0) {
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[0]->steps, two.max_steps);
  JobSpec one = two;
  one.mode = TrainMode::kParameterServer;
  one.name = two.name + "-one";
  one.workers = 1;
  one.shards = 1;
  one.batch_size = 2 * two.batch_size;
  Shards shards1(1);
  TrainerOptions o;
  o.spec = one;
  o.data_root = TestModelsRoot();
  o.device = device;
  o.shards = shards1.ptrs;
  o.write_weights = false;
  auto single = RunTrainer(o, data);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_EQ(single->parameters.size(), results[0]->parameters.size());
  for (size_t i = 0; i < single->parameters.size(); ++i) {
    const auto& [name, a] = single->parameters[i];
    const at::Tensor& b = results[0]->parameters[i].second;
    const at::Tensor& c = results[1]->parameters[i].second;
    // allclose, but for at most `stray` elements (each within 1e-3).
    const at::Tensor diff = a.sub(b).abs();
    const int64_t off = diff.gt(b.abs().mul(rtol).add(atol)).sum().item<int64_t>();
    const double worst = diff.max().item<double>();
    EXPECT_TRUE(off == 0 || (off <= stray && worst < 1e-3))
        << name << " differs by " << worst << " in " << off << " of " << a.numel() << " elements";
    EXPECT_TRUE(at::allclose(b, c, 0, 0)) << name << ": the two workers disagree";
  }
  if (one_out != nullptr) *one_out = *single;
  if (two.model != "lenet") return;
  auto init = CreateModel("lenet", {1, 28, 28}, 10, two.seed);
  ASSERT_TRUE(init.ok());
  EXPECT_FALSE(at::allclose(single->parameters[0].second, (*init)->NamedParameters()[0].second.detach(), 1e-3, 1e-4));
}

// One all-reduce rank (`backend`, on `device`) resuming at step 5: its local
// store already holds the job's table when the exchange starts -- as
// restore_local leaves it, here the LeNet's seeded values plus 0.25 -- and
// the parameters it trains from must be the table's, bit for bit, not the
// model's initial ones. Stopped at the restored step: nothing trained, the
// result's parameters are what the worker started from. (The values once
// stopped in a host buffer: every resume began from the initial weights.)
inline void ExpectAllReduceResumeStartsFromTheTablesValues(c10::Device device, Collective::Backend backend) {
  JobSpec spec = SyntheticSpec("resume-values", "lenet");
  spec.mode = TrainMode::kAllReduce;
  spec.consistency = SYNC;
  spec.workers = 1;
  spec.shards = 0;
  spec.max_steps = 5;
  spec.chunk_bytes = 16 << 10;  // several chunks per large parameter
  auto data = LoadData(spec.data, spec.seed);
  ASSERT_TRUE(data.ok()) << data.status();
  auto model = CreateModel("lenet", {1, 28, 28}, 10, spec.seed);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::pair<std::string, at::Tensor>> restored;
  std::vector<ParameterSpec> specs;
  for (const auto& [name, t] : (*model)->NamedParameters()) {
    restored.emplace_back(name, t.detach().add(0.25));
    specs.push_back({name, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), DT_FLOAT32});
  }
  auto plan = MakePartitionPlan(specs, 1, static_cast<size_t>(spec.chunk_bytes));
  ASSERT_TRUE(plan.ok()) << plan.status();
  CollectiveOptions co;
  co.store = NewInMemoryStore();
  co.hostname = "127.0.0.1";
  co.device = device.is_cuda() ? device.index() : 0;
  auto collective = CreateCollective(backend, co);
  ASSERT_TRUE(collective.ok()) << collective.status();
  Shards local(1);
  TrainerOptions o;
  o.spec = spec;
  o.data_root = TestModelsRoot();
  o.device = device;
  o.local_store = local.stores[0].get();
  o.collective = collective->get();
  o.write_weights = false;
  o.start_step = 5;
  o.restore_local = [&](const std::vector<std::string>& keys) -> absl::Status {
    InitTableRequest req;
    req.set_job(spec.name);
    *req.mutable_config() = MakeTableConfig(spec);
    std::vector<TensorBuffer> values;
    for (const ChunkSpec& c : plan->chunks) {
      req.add_keys(c.key);
      auto b = TensorToBuffer(restored[c.param].second.reshape({-1}).narrow(0, c.offset, c.numel).contiguous());
      if (!b.ok()) return b.status();
      values.push_back(std::move(*b));
    }
    EXPECT_EQ(keys.size(), plan->chunks.size());
    InitTableResponse resp;
    return WaitFor([&](StatusCallback done) { local.stores[0]->InitTableAsync(req, values, &resp, {}, done); });
  };
  auto result = RunTrainer(o, *data);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 5);
  ASSERT_EQ(result->parameters.size(), restored.size());
  for (size_t i = 0; i < restored.size(); ++i) {
    EXPECT_TRUE(at::equal(result->parameters[i].second, restored[i].second))
        << restored[i].first << " is not the restored value: differs by "
        << result->parameters[i].second.sub(restored[i].second).abs().max().item<double>();
  }
}

// bf16 or fp16 autocast: forward and backward in the narrow dtype, the
// parameters and the optimizer in fp32 (fp16 with dynamic loss scaling). On
// Fashion-MNIST (10,000 test images: one point is 100 of them), LeNet, two
// epochs: autocast must really change the arithmetic (the parameters differ
// from fp32's) and reach fp32's accuracy within a point.
inline void ExpectAutocastWithinOnePointOfFp32(const c10::Device& device, Precision narrow) {
  const std::string dir = FashionMnistDir();
  if (dir.empty()) GTEST_SKIP() << "no Fashion-MNIST (make setup installs dataset-fashion-mnist)";
  JobSpec spec = SyntheticSpec("bf16", "lenet");
  const DataRoot root = UseIdxDir(dir, &spec);
  spec.batch_size = 64;
  spec.epochs = 2;
  spec.lr_schedule.kind = "cosine";  // 0.05, then 0.025: the second epoch settles
  auto data = LoadData(spec.data, spec.seed, root);
  ASSERT_TRUE(data.ok()) << data.status();
  std::map<std::string, TrainResult> results;
  for (const Precision p : {Precision::kFp32, narrow}) {
    const std::string precision = Name(p);
    Shards shards(1);
    TrainerOptions o;
    o.spec = spec;
    o.data_root = TestModelsRoot();
    o.spec.precision = p;
    o.device = device;
    o.shards = shards.ptrs;
    o.write_weights = false;
    std::string losses, scales;
    o.emit = [&](const WorkerEvent& e) {
      if (e.has_progress() && e.progress().has_loss_scale() && e.progress().step() % 500 == 0) {
        scales += " " + std::to_string(e.progress().step()) + ":" + std::to_string(e.progress().loss_scale()) + "/" +
                  std::to_string(e.progress().skipped_steps());
      }
    };
    o.on_step = [&](int64_t step, double loss, int64_t, double, double) {
      if (step % 500 == 0 || step == 1) losses += " " + std::to_string(step) + ":" + std::to_string(loss);
    };
    auto r = RunTrainer(o, *data);
    ASSERT_TRUE(r.ok()) << precision << ": " << r.status();
    std::printf("%s %s: accuracy %.4f, %lld steps skipped, loss at steps%s\n", device.str().c_str(),
                precision.c_str(), r->final_accuracy, static_cast<long long>(r->skipped_steps), losses.c_str());
    if (!scales.empty()) std::printf("  loss scale/skipped at steps%s\n", scales.c_str());
    if (p == Precision::kFp16) {
      EXPECT_FALSE(scales.empty()) << "fp16 progress reports no loss scale";
      EXPECT_LT(r->skipped_steps, r->steps / 100) << "more than 1% of the steps skipped";
    }
    results[precision] = *r;
  }
  const TrainResult& fp32 = results["fp32"];
  const TrainResult& low = results[Name(narrow)];
  EXPECT_GT(fp32.final_accuracy, 0.7);
  EXPECT_GE(low.final_accuracy, fp32.final_accuracy - 0.01);
  for (const auto& [name, t] : low.parameters) EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  EXPECT_FALSE(at::allclose(fp32.parameters[0].second, low.parameters[0].second, 1e-5, 1e-6))
      << Name(narrow) << " changed nothing: autocast did not run";
}

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_TRAINER_TESTING_H_
