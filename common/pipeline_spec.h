// The job spec's `pipeline:` block (docs/pipeline.md, docs/job-spec.md): a
// model cut into stages, one per worker, each step's batch cut into
// micro-batches that flow through them (issue 35).
#ifndef PSTRAIN_COMMON_PIPELINE_SPEC_H_
#define PSTRAIN_COMMON_PIPELINE_SPEC_H_

#include <string>

#include "absl/status/status.h"

namespace pstrain {

struct PipelineSpec {
  // 0: not pipelined. P: the model is cut into P stages; `workers` W runs
  // W/P data-parallel replicas of the P-stage pipeline (rank = replica * P
  // + stage: a replica's stages are neighbouring ranks).
  int stages = 0;
  // Each replica's batch (batch_size examples) is cut into this many
  // micro-batches (as torch.split: the last may be smaller).
  int micro_batches = 1;
  std::string schedule = "1f1b";  // gpipe | 1f1b (pipeline/schedule.h)
  // What the cut balances across stages: each layer's measured forward and
  // backward time on a micro-batch (rank 0 measures, every rank cuts
  // alike), or its parameter count.
  std::string balance = "time";  // time | parameters
  bool enabled() const { return stages > 0; }
};

// The built-in models' layers as pipeline stages cut them (worker/model.cc
// builds the same list): a stage holds a contiguous run of them.
// 0 for a model with no cut list.
int PipelineLayers(const std::string& model);

// "mlp_deep": in -> 1024 -> ... -> 1024 -> classes, this many Linear layers
// (7.1M parameters for 28x28 inputs): a model with layers enough for 8
// stages (bench/run.sh pipeline).
inline constexpr int kMlpDeepLayers = 8;

class MappingReader;
struct JobSpec;

// Reads the optional `pipeline:` mapping of the spec's top level.
absl::Status ReadPipelineSpec(MappingReader& r, PipelineSpec* out);

// The pipeline's rules against the rest of the spec (ParseJobSpec calls it
// once every field is read): INVALID_ARGUMENT naming the field.
absl::Status CheckPipelineJob(const JobSpec& spec, const MappingReader& r);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_PIPELINE_SPEC_H_
