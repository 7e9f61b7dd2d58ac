#include "common/pipeline_spec.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/mapping_reader.h"

namespace pstrain {

namespace {
constexpr int kMaxStages = 64;
constexpr int kMaxMicroBatches = 4096;
}  // namespace

int PipelineLayers(const std::string& model) {
  if (model == "mlp" || model == "mlp_wide") return 3;  // fc1, fc2, fc3
  if (model == "lenet") return 5;                       // conv1, conv2, fc1, fc2, fc3
  if (model == "mlp_deep") return kMlpDeepLayers;       // fc1 .. fc8
  return 0;
}

absl::Status ReadPipelineSpec(MappingReader& r, PipelineSpec* out) {
  return r.Nested("pipeline", [out](MappingReader& p) {
    absl::Status s = p.Read("stages", &out->stages);
    if (s.ok()) s = p.Read("micro_batches", &out->micro_batches);
    if (s.ok()) s = p.Read("schedule", &out->schedule);
    if (s.ok()) s = p.Read("balance", &out->balance);
    if (s.ok() && out->stages < 1) s = p.Error("pipeline.stages", "must be set, in 1..64");
    return s;
  });
}

absl::Status CheckPipelineJob(const JobSpec& spec, const MappingReader& r) {
  const PipelineSpec& p = spec.pipeline;
  if (!p.enabled()) return absl::OkStatus();
  if (p.stages < 1 || p.stages > kMaxStages) return r.Error("pipeline.stages", "must be in 1..64");
  if (p.micro_batches < 1 || p.micro_batches > kMaxMicroBatches || p.micro_batches > spec.batch_size) {
    return r.Error("pipeline.micro_batches",
                   absl::StrCat("must be in 1..", std::min<int64_t>(kMaxMicroBatches, spec.batch_size),
                                " (each micro-batch holds at least one of batch_size's examples)"));
  }
  if (p.schedule != "gpipe" && p.schedule != "1f1b") return r.Error("pipeline.schedule", "must be gpipe or 1f1b");
  if (p.balance != "time" && p.balance != "parameters") {
    return r.Error("pipeline.balance", "must be time or parameters");
  }
  // A TorchScript module's children are counted by the workers, which
  // read it.
  const bool scripted = absl::StartsWith(spec.model, "torchscript:") && spec.embeddings.empty();
  const int layers = PipelineLayers(spec.model);
  if (layers == 0 && !scripted) {
    return r.Error("pipeline", absl::StrCat("cuts the built-in models mlp, mlp_wide, mlp_deep and lenet and "
                                            "sequential TorchScript modules; model '",
                                            spec.model.substr(0, 64), "' cannot be cut into stages"));
  }
  if (!scripted && p.stages > layers) {
    return r.Error("pipeline.stages", absl::StrCat("must be at most ", layers, ": model ", spec.model, " has ",
                                                   layers, " layers, and a stage holds at least one"));
  }
  if (spec.workers % p.stages != 0) {
    return r.Error("workers", absl::StrCat("must be a multiple of pipeline.stages (", p.stages,
                                           "): the workers run workers / stages replicas of the pipeline"));
  }
  // What the stages do not do yet.
  auto refuse = [&r](const std::string& field, const std::string& why) {
    return r.Error(field, absl::StrCat(why, " with pipeline (not built yet)"));
  };
  if (!spec.allreduce()) {
    // Parameter server: each stage's keys on the shards, pushed by its replicas.
    if (spec.min_workers != spec.workers) {
      return r.Error("min_workers", "must equal workers with pipeline (a lost stage restarts the job from its "
                                    "checkpoint: its neighbours cannot go on without it)");
    }
    if (spec.replicas > 0) return refuse("replicas", "must be 0");
  }
  if (spec.precision == Precision::kFp16) return refuse("precision", "must be fp32 or bf16 (fp16's loss scaling)");
  if (spec.device == DeviceChoice::kCuda) return refuse("device", "must be cpu or auto (the stages run on the CPU)");
  if (spec.backend == CollectiveBackend::kNccl) return refuse("backend", "must be gloo or auto");
  if (!spec.quantization.mode.empty() || !spec.quantization.export_mode.empty()) {
    return refuse("quantization", "must be absent");
  }
  return absl::OkStatus();
}

}  // namespace pstrain
