// Pipelined jobs through the training loop (issue 35): ranks as threads,
// the stages talking over real Gloo sockets. A job with `pipeline` trains
// the parameters the same job without it trains (same seed, same global
// batch, fp32): the stages' gradients are the uncut model's, and a stage's
// replicas average them as all-reduce workers do. Also: the test set runs
// through the stages to rank 0, and rank 0 writes the whole model.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/weights_file.h"
#include "tests/trainer_testing.h"

namespace pstrain {
namespace {

// `spec`'s ranks at once (threads), pipelined when spec.pipeline says so:
// each rank gets the whole group (point-to-point) and, all-reduce, its
// stage's group; parameter server, the job's shards (in process).
std::vector<absl::StatusOr<TrainResult>> RunPipelined(const JobSpec& spec, const TrainTest& data,
                                                      bool write_weights = false,
                                                      std::vector<WorkerEvent>* rank0_events = nullptr) {
  static int run = 0;
  const std::string prefix = absl::StrCat("pipeline-run-", run++, "/");
  auto store = NewInMemoryStore();
  const int world = spec.workers, stages = std::max(1, spec.pipeline.stages);
  std::vector<std::unique_ptr<Collective>> whole(world), stage(world);
  std::vector<std::unique_ptr<Shards>> locals(world);
  Shards shards(spec.allreduce() ? 0 : spec.shards);
  if (!spec.allreduce()) {
    return TrainRanks(spec, data, world, [&](int r, TrainerOptions& o) -> absl::Status {
      o.shards = shards.ptrs;
      if (!spec.pipeline.enabled()) return absl::OkStatus();
      auto all = LoopbackGlooRank(store, r, world);
      if (!all.ok()) return all.status();
      whole[r] = std::move(*all);
      o.pipeline = whole[r].get();
      return absl::OkStatus();
    });
  }
  return TrainRanks(spec, data, world, [&](int r, TrainerOptions& o) -> absl::Status {
    CollectiveOptions co;
    co.store = store;
    co.hostname = "127.0.0.1";
    co.timeout = absl::Seconds(60);
    co.rank = r;
    co.size = world;
    co.prefix = prefix + "all/";
    auto all = CreateCollective(Collective::Backend::kGloo, co);
    if (!all.ok()) return all.status();
    whole[r] = std::move(*all);
    co.rank = r / stages;
    co.size = world / stages;
    co.prefix = absl::StrCat(prefix, "stage-", r % stages, "/");
    auto mine = CreateCollective(Collective::Backend::kGloo, co);
    if (!mine.ok()) return mine.status();
    stage[r] = std::move(*mine);
    locals[r] = std::make_unique<Shards>(1);
    o.local_store = locals[r]->stores[0].get();
    o.collective = stage[r].get();
    if (spec.pipeline.enabled()) o.pipeline = whole[r].get();
    o.write_weights = write_weights && r == 0;  // as pstrain-worker sets it
    if (r == 0 && rank0_events != nullptr) o.emit = [rank0_events](const WorkerEvent& e) { rank0_events->push_back(e); };
    return absl::OkStatus();
  });
}

// Every rank's final parameters by name (a stage's replicas agree: the
// first one's are kept).
std::map<std::string, at::Tensor> ByName(const std::vector<absl::StatusOr<TrainResult>>& results) {
  std::map<std::string, at::Tensor> out;
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) continue;
    for (const auto& [name, t] : r->parameters) out.emplace(name, t);
  }
  return out;
}

void ExpectSameParameters(const std::map<std::string, at::Tensor>& got, const std::map<std::string, at::Tensor>& want,
                          double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(at::allclose(it->second, w, tol, tol)) << name << ": largest difference "
                                                       << (it->second - w).abs().max().item<double>();
  }
}

struct Case {
  std::string model;
  int stages, replicas, micro;
  std::string schedule;
  int64_t batch, train_examples;
  std::string balance = "time";  // where the cut falls changes nothing but the speed
  double clip_grad_norm = 0;
  int accumulate_steps = 1;
  // Parameter server: the stages' keys on 2 shards, several chunks each.
  std::optional<Consistency> ps;
};

// The pipelined job against the same job unpipelined, with `replicas`
// workers (the pipeline's data-parallel width): all-reduce, or on shards.
void CheckLikeUncut(const Case& c) {
  SCOPED_TRACE(::testing::Message() << c.model << " P " << c.stages << " x " << c.replicas << " M " << c.micro
                                    << " " << c.schedule << (c.ps ? " ps " + Consistency_Name(*c.ps) : ""));
  JobSpec plain = AllReduceSpec("pipe-ref", c.model, c.replicas, c.batch, /*max_steps=*/0);
  if (c.ps) {
    plain.mode = TrainMode::kParameterServer;
    plain.consistency = *c.ps;
    plain.shards = 2;
    plain.chunk_bytes = 16 << 10;
  }
  plain.data.synthetic_train = c.train_examples;
  plain.data.synthetic_test = 200;
  plain.clip_grad_norm = c.clip_grad_norm;
  plain.accumulate_steps = c.accumulate_steps;
  const TrainTest data{MakeSynthetic(c.train_examples, 10, 3), MakeSynthetic(200, 10, 4)};
  JobSpec piped = plain;
  piped.name = "pipe";
  piped.workers = c.stages * c.replicas;
  piped.min_workers = piped.workers;
  piped.pipeline.stages = c.stages;
  piped.pipeline.micro_batches = c.micro;
  piped.pipeline.schedule = c.schedule;
  piped.pipeline.balance = c.balance;
  auto want = RunPipelined(plain, data);
  auto got = RunPipelined(piped, data);
  ASSERT_TRUE(want[0].ok()) << want[0].status();
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ExpectSameParameters(ByName(got), ByName(want), 1e-5);
  // Rank 0 learns the test set's figures from the last stage.
  EXPECT_NEAR(got[0]->final_test_loss, want[0]->final_test_loss, 1e-4);
  EXPECT_NEAR(got[0]->final_accuracy, want[0]->final_accuracy, 0.011);
  EXPECT_EQ(got[0]->steps, want[0]->steps);
  for (size_t r = 1; r < got.size(); ++r) EXPECT_LT(got[r]->final_accuracy, 0) << "rank " << r << " evaluated";
}

// 100 examples in batches of 16: 7 steps an epoch, the last of 4 examples
// (fewer than some micro-batch counts: then one example each).
TEST(PipelineTrainer, TwoStagesOneF1BTrainLikeTheUncutMlp) { CheckLikeUncut({"mlp", 2, 1, 3, "1f1b", 16, 100}); }

TEST(PipelineTrainer, ThreeStagesGPipeTrainLikeTheUncutLeNet) { CheckLikeUncut({"lenet", 3, 1, 5, "gpipe", 16, 100}); }

TEST(PipelineTrainer, OneMicroBatchAndMoreThanTheStages) {
  CheckLikeUncut({"mlp", 3, 1, 1, "1f1b", 16, 64});
  CheckLikeUncut({"lenet", 2, 1, 8, "1f1b", 16, 64, "parameters"});
}

TEST(PipelineTrainer, FourStagesOfTheDeepMlp) { CheckLikeUncut({"mlp_deep", 4, 1, 8, "gpipe", 16, 64}); }

// clip_grad_norm bounds the whole model's gradient norm: the stages add
// their squared norms over the whole group (a stage's replicas counted
// once). 0.05 clips every step here.
TEST(PipelineTrainer, ClipGradNormBoundsTheWholeModelsNorm) {
  CheckLikeUncut({"mlp", 2, 1, 3, "1f1b", 16, 100, "time", 0.05});
  CheckLikeUncut({"lenet", 2, 2, 4, "gpipe", 8, 100, "parameters", 0.05});
}

// accumulate_steps batches, each pipelined, make one step: their
// gradients summed, each scaled by 1/accumulate_steps, as without the
// pipeline (100 examples in batches of 16 make 7 batches an epoch: the
// epoch's last step has one batch, of 4 examples).
TEST(PipelineTrainer, AccumulatedBatchesMakeOneStep) {
  Case c{"mlp", 2, 1, 3, "1f1b", 16, 100};
  c.accumulate_steps = 2;
  CheckLikeUncut(c);
  c = {"lenet", 2, 2, 2, "gpipe", 8, 100, "parameters", 0.05};
  c.accumulate_steps = 3;
  CheckLikeUncut(c);
}

// A TorchScript nn.Sequential, cut between its top-level children (blocks
// of a layer and its activation): both schedules, by time and by
// parameters, and two replicas.
constexpr char kSequentialNet[] = "torchscript:worker/testdata/sequential_net.pt";

TEST(PipelineTrainer, ATorchScriptSequentialIsCutBetweenItsChildren) {
  CheckLikeUncut({kSequentialNet, 2, 1, 4, "1f1b", 16, 100});
  CheckLikeUncut({kSequentialNet, 3, 1, 5, "gpipe", 16, 100, "parameters"});
  CheckLikeUncut({kSequentialNet, 2, 2, 3, "1f1b", 8, 64});
}

// A module whose forward does more than run its children in order cannot
// be cut: every rank refuses it, naming why, before training.
TEST(PipelineTrainer, ATorchScriptModuleThatIsNotSequentialIsRefused) {
  JobSpec spec = AllReduceSpec("pipe-not-seq", "torchscript:worker/testdata/not_sequential_net.pt", 2, 16, 4);
  spec.pipeline.stages = 2;
  const TrainTest data{MakeSynthetic(64, 10, 3), MakeSynthetic(100, 10, 4)};
  for (const auto& r : RunPipelined(spec, data)) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("must be sequential at its top level"), absl::string_view::npos)
        << r.status();
  }
  // More stages than children: refused on every rank too.
  spec.model = kSequentialNet;
  spec.workers = spec.min_workers = spec.pipeline.stages = 5;
  for (const auto& r : RunPipelined(spec, data)) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("must be at most 4"), absl::string_view::npos) << r.status();
  }
}

// A module that is not sequential (a skip connection inside a stage, a
// flatten between layers) but names its stages, stage_0..stage_2: cut
// between those methods, each stage training the parameters its method
// reads (enc.a in one, enc.b in another), like the uncut module. One that
// reads a parameter in two stages is refused, naming it.
constexpr char kNamedStagesNet[] = "torchscript:worker/testdata/named_stages_net.pt";

TEST(PipelineTrainer, ATorchScriptModuleIsCutBetweenTheStagesItNames) {
  CheckLikeUncut({kNamedStagesNet, 2, 1, 4, "1f1b", 16, 100, "parameters"});
  CheckLikeUncut({kNamedStagesNet, 3, 1, 5, "gpipe", 16, 100});
  JobSpec spec = AllReduceSpec("pipe-shared", "torchscript:worker/testdata/shared_stages_net.pt", 2, 16, 4);
  spec.pipeline.stages = 2;
  const TrainTest data{MakeSynthetic(64, 10, 3), MakeSynthetic(100, 10, 4)};
  for (const auto& r : RunPipelined(spec, data)) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("parameter 'enc.a.bias' is used by stage_1 and stage_2"),
              absl::string_view::npos)
        << r.status();
  }
}

// A stage of a module that names its stages shares the module object; once
// cut, it lets go of the other stages' parameters (the rank then holds its
// stage's alone) and still computes what it did.
TEST(PipelineTrainer, AStageOfANamedStagesModuleHoldsOnlyItsParameters) {
  auto whole = CreateModel(kNamedStagesNet, {1, 28, 28}, 10, 1, TestModelsRoot());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ((*whole)->LayerCount(), 3);
  auto stage = (*whole)->Layers(1, 2);
  ASSERT_TRUE(stage.ok()) << stage.status();
  int64_t all = 0, own = 0;
  for (const auto& [name, t] : (*whole)->NamedParameters()) all += t.numel();
  std::set<std::string> names;
  for (const auto& [name, t] : (*stage)->NamedParameters()) {
    names.insert(name);
    own += t.numel();
  }
  ASSERT_LT(own, all);
  auto first = (*whole)->Layers(0, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  const at::Tensor h = (*first)->Forward(at::randn({4, 1, 28, 28})).detach();
  const at::Tensor before = (*stage)->Forward(h).detach();
  (*stage)->ReleaseUnused();
  int64_t held = 0;
  std::set<std::string> left;
  for (const auto& [name, t] : (*whole)->NamedParameters()) {  // the shared module's trainable ones
    left.insert(name);
    held += t.numel();
  }
  EXPECT_EQ(left, names);
  EXPECT_EQ(held, own);
  EXPECT_TRUE(at::equal((*stage)->Forward(h), before));
  std::printf("stage 1 of %s: %lld of %lld parameters held\n", kNamedStagesNet, static_cast<long long>(held),
              static_cast<long long>(all));
}

// Hybrid: 2 replicas of a 2-stage pipeline, each stage's replicas
// averaging its gradients, against 2 all-reduce workers.
TEST(PipelineTrainer, TwoReplicasOfTwoStagesTrainLikeTwoAllReduceWorkers) {
  CheckLikeUncut({"lenet", 2, 2, 4, "1f1b", 8, 100});
}

// Parameter server: each stage's replicas push its keys, and the shards
// average them (SYNC) or apply each push with lr / replicas (ASYNC, SSP:
// one replica trains as one worker does, push after push).
TEST(PipelineTrainer, StagesOnTheShardsTrainLikeUnpipelinedPsWorkers) {
  Case sync{"lenet", 2, 2, 4, "1f1b", 8, 100};
  sync.ps = SYNC;
  CheckLikeUncut(sync);
  Case async{"mlp", 3, 1, 4, "gpipe", 16, 100};
  async.ps = ASYNC;
  CheckLikeUncut(async);
  Case ssp{"mlp", 2, 1, 2, "1f1b", 16, 64};
  ssp.ps = SSP;
  CheckLikeUncut(ssp);
  // clip_grad_norm: each replica clips its own gradient, as a ps worker
  // does, by the norm its stages add up (0.05 clips every step here).
  Case clipped{"lenet", 2, 2, 4, "gpipe", 8, 100, "parameters", 0.05};
  clipped.ps = SYNC;
  CheckLikeUncut(clipped);
  Case one_stage{"mlp", 1, 2, 2, "gpipe", 16, 64};  // an unpipelined table
  one_stage.ps = SYNC;
  CheckLikeUncut(one_stage);
}

// bf16 autocast through the stages: the pipelined job stays with the
// unpipelined bf16 job, much nearer to it than to the fp32 one.
TEST(PipelineTrainer, Bf16AutocastRunsThroughTheStages) {
  const TrainTest data{MakeSynthetic(64, 10, 3), MakeSynthetic(100, 10, 4)};
  JobSpec fp32 = AllReduceSpec("pipe-fp32", "mlp", 1, 16, /*max_steps=*/4);
  JobSpec bf16 = fp32;
  bf16.precision = Precision::kBf16;
  JobSpec piped = bf16;
  piped.workers = piped.min_workers = 2;
  piped.pipeline.stages = 2;
  piped.pipeline.micro_batches = 4;
  const auto got = ByName(RunPipelined(piped, data));
  const auto want = ByName(RunPipelined(bf16, data));
  const auto other = ByName(RunPipelined(fp32, data));
  ASSERT_EQ(got.size(), want.size());
  double to_bf16 = 0, to_fp32 = 0;
  for (const auto& [name, t] : want) {
    to_bf16 = std::max(to_bf16, (got.at(name) - t).abs().max().item<double>());
    to_fp32 = std::max(to_fp32, (got.at(name) - other.at(name)).abs().max().item<double>());
  }
  std::printf("bf16 pipelined: largest difference %.3g to bf16, %.3g to fp32\n", to_bf16, to_fp32);
  EXPECT_LT(to_bf16, 0.5 * to_fp32);  // without autocast in the stages: 2e-3 against 1.5e-8
}

TEST(PipelineTrainer, RankZeroWritesTheWholeModel) {
  const std::string dir = ::testing::TempDir() + "/pipeline_weights";
  JobSpec spec = AllReduceSpec("pipe-weights", "lenet", 3, 16, /*max_steps=*/3);
  spec.output_dir = dir;
  spec.pipeline.stages = 3;
  spec.pipeline.micro_batches = 2;
  const TrainTest data{MakeSynthetic(96, 10, 3), MakeSynthetic(100, 10, 4)};
  std::vector<WorkerEvent> events;
  auto results = RunPipelined(spec, data, /*write_weights=*/true, &events);
  const std::map<std::string, at::Tensor> trained = ByName(results);
  auto file = ReadWeightsFile(dir + "/model.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, at::Tensor> written(file->begin(), file->end());
  EXPECT_EQ(written.size(), 10u);  // LeNet's 5 layers' weights and biases
  ExpectSameParameters(written, trained, 0);
  // Its plan (what checkpoints are cut by) is the whole model's too, in
  // the whole model's order.
  const WorkerEvent* plan = nullptr;
  for (const auto& e : events) plan = e.has_plan() ? &e : plan;
  ASSERT_NE(plan, nullptr) << "rank 0 reported no plan";
  auto uncut = CreateModel("lenet", {1, 28, 28}, 10, spec.seed);
  ASSERT_TRUE(uncut.ok());
  const auto named = (*uncut)->NamedParameters();
  ASSERT_EQ(plan->plan().params_size(), static_cast<int>(named.size()));
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(plan->plan().params(i).name(), named[i].first);
    EXPECT_EQ(std::vector<int64_t>(plan->plan().params(i).shape().begin(), plan->plan().params(i).shape().end()),
              named[i].second.sizes().vec())
        << named[i].first;
  }
}

}  // namespace
}  // namespace pstrain
