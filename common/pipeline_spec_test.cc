// The job spec's `pipeline:` block: read, defaulted, and refused where the
// stages cannot run the job (yet), naming the field.
#include "common/pipeline_spec.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace pstrain {
namespace {

const char kBase[] = "model: lenet\nmode: allreduce\nshards: 0\nworkers: 4\nbatch_size: 32\n";

std::string Refusal(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  return spec.ok() ? "(accepted)" : std::string(spec.status().message());
}

TEST(PipelineSpec, ReadsStagesMicroBatchesAndScheduleAndRunsOnTheCpu) {
  auto spec = ParseJobSpec(std::string(kBase) + "pipeline: {stages: 2, micro_batches: 8, schedule: gpipe}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->pipeline.enabled());
  EXPECT_EQ(spec->pipeline.stages, 2);
  EXPECT_EQ(spec->pipeline.micro_batches, 8);
  EXPECT_EQ(spec->pipeline.schedule, "gpipe");
  EXPECT_EQ(spec->device, DeviceChoice::kCpu);  // auto, for a pipelined job
  auto plain = ParseJobSpec(kBase);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->pipeline.enabled());
  EXPECT_EQ(plain->device, DeviceChoice::kAuto);
  auto defaults = ParseJobSpec(std::string(kBase) + "pipeline: {stages: 4}\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->pipeline.micro_batches, 1);
  EXPECT_EQ(defaults->pipeline.schedule, "1f1b");
  EXPECT_EQ(defaults->pipeline.balance, "time");
  // A TorchScript module's children are counted by the workers.
  EXPECT_TRUE(ParseJobSpec("model: torchscript:m.pt\nmode: allreduce\nshards: 0\nworkers: 8\n"
                           "pipeline: {stages: 8}\n").ok());
  // The stages are checkpointed (each its own file, docs/pipeline.md).
  EXPECT_TRUE(ParseJobSpec(std::string(kBase) + "checkpoint_every_steps: 10\npipeline: {stages: 2}\n").ok());
  // Parameter-server mode: the stages' keys on the shards, any consistency.
  for (const char* consistency : {"sync", "async", "ssp"}) {
    auto ps = ParseJobSpec(absl::StrCat("model: lenet\nworkers: 4\nshards: 2\nconsistency: ", consistency,
                                        "\npipeline: {stages: 2}\n"));
    EXPECT_TRUE(ps.ok()) << consistency << ": " << ps.status();
    if (ps.ok()) EXPECT_EQ(MakeTableConfig(*ps).pipeline_stages(), 2u);
  }
  auto one = ParseJobSpec("model: lenet\nworkers: 2\nshards: 1\npipeline: {stages: 1}\n");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(MakeTableConfig(*one).pipeline_stages(), 0u);  // one stage: an ordinary table
}

TEST(PipelineSpec, RefusesWhatTheStagesCannotRunNamingTheField) {
  struct Case {
    std::string yaml, want;
  };
  const std::string base = kBase;
  const Case cases[] = {
      {base + "pipeline: {micro_batches: 4}\n", "pipeline.stages must be set"},
      {base + "pipeline: {stages: 0}\n", "pipeline.stages must be set"},
      {base + "pipeline: {stages: 2, micro_batches: 33}\n", "pipeline.micro_batches must be in 1..32"},
      {base + "pipeline: {stages: 2, schedule: interleaved}\n", "pipeline.schedule must be gpipe or 1f1b"},
      {base + "pipeline: {stages: 2, chunks: 4}\n", "pipeline.chunks"},
      {base + "pipeline: {stages: 2, balance: flops}\n", "pipeline.balance must be time or parameters"},
      {base + "pipeline: {stages: 3}\n", "workers must be a multiple of pipeline.stages (3)"},
      {"model: mlp\nmode: allreduce\nshards: 0\nworkers: 4\npipeline: {stages: 4}\n",
       "pipeline.stages must be at most 3: model mlp has 3 layers"},
      {"model: dlrm\nmode: allreduce\nshards: 1\nworkers: 2\ndata: {format: criteo, train_file: t.tsv}\n"
       "embeddings: {tables: [{name: t, dim: 4}]}\npipeline: {stages: 2}\n",
       "model 'dlrm' cannot be cut into stages"},
      {"model: lenet\nworkers: 4\nmin_workers: 2\npipeline: {stages: 2}\n", "min_workers must equal workers"},
      {"model: lenet\nworkers: 2\nshards: 2\nreplicas: 1\npipeline: {stages: 2}\n", "replicas must be 0"},
      {base + "precision: fp16\npipeline: {stages: 2}\n", "precision must be fp32 or bf16"},
      {base + "device: cuda\npipeline: {stages: 2}\n", "device must be cpu or auto"},
      {base + "backend: nccl\npipeline: {stages: 2}\n", "backend must be gloo or auto"},
      {base + "quantization: {mode: qat}\npipeline: {stages: 2}\n", "quantization must be absent"},
  };
  for (const Case& c : cases) {
    EXPECT_NE(Refusal(c.yaml).find(c.want), std::string::npos)
        << "want '" << c.want << "' in: " << Refusal(c.yaml) << "\n" << c.yaml;
  }
}

TEST(PipelineSpec, KnowsTheBuiltInModelsLayers) {
  EXPECT_EQ(PipelineLayers("mlp"), 3);
  EXPECT_EQ(PipelineLayers("mlp_wide"), 3);
  EXPECT_EQ(PipelineLayers("lenet"), 5);
  EXPECT_EQ(PipelineLayers("mlp_deep"), 8);
  EXPECT_EQ(PipelineLayers("dlrm"), 0);
  EXPECT_EQ(PipelineLayers("torchscript:m.pt"), 0);
}

}  // namespace
}  // namespace pstrain
