// A pipelined rank's part of the training loop (issue 35; docs/pipeline.md):
// where the rank sits (stage and replica), its stage's step over the
// micro-batches (worker/pipeline_stage.h), the evaluation that runs the test
// set through the stages, and the final weights gathered onto rank 0. The
// trainer (worker/trainer.cc) keeps the rest: data, the exchange among a
// stage's replicas, progress, the events.
//
// Rank layout: rank = replica * P + stage, so a replica's stages are
// neighbouring ranks; stage s's W/P replicas average its gradients in a
// group of their own (AllReduceSetup::stage_group), as the job's other
// ranks do in all-reduce mode.
#ifndef PSTRAIN_WORKER_PIPELINE_RUN_H_
#define PSTRAIN_WORKER_PIPELINE_RUN_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "collective/collective.h"
#include "common/job_spec.h"
#include "common/partition_plan.h"
#include "common/weights_file.h"
#include "worker/activity.h"
#include "worker/batch_loader.h"
#include "worker/dataset.h"
#include "worker/evaluation.h"
#include "worker/model.h"
#include "worker/pipeline_stage.h"
#include "worker/trainer_options.h"

namespace pstrain {

struct PipelinePlace {
  int stages = 1, stage = 0;
  int replicas = 1, replica = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  // The rank of this replica's stage s.
  int RankOf(int s) const { return replica * stages + s; }
};

PipelinePlace PipelinePlaceOf(const PipelineSpec& pipeline, int rank, int world_size);


// The first layer of each stage, then the layer count: layers of `costs`
// cut into spec.pipeline.stages contiguous runs, the costliest run as
// cheap as it can be (pipeline/stage_cut.h).
absl::StatusOr<std::vector<int>> PipelineCut(const JobSpec& spec, const std::vector<double>& costs);

// This rank's stage of spec.model: a built-in model's layers
// (CreateModelStage over the cut), or a TorchScript module's top-level
// children (Model::Layers), once every rank has checked on the first
// micro-batch of `train` that the children chained give the module's
// output. With pipeline.balance time, rank 0 measures the layers on that
// micro-batch and sends every rank their costs over options.pipeline, so
// that every rank cuts alike. A cut leaving a stage without trainable
// parameters is refused.
absl::StatusOr<std::unique_ptr<Model>> CreatePipelineStageModel(const TrainerOptions& options, const Dataset& train);

// The whole model's parameters, in its order (those of every stage):
// what rank 0 reports as the job's plan, so that the stages' checkpoint
// files are a checkpoint of the whole model.
absl::StatusOr<std::vector<ParameterSpec>> PipelineModelSpecs(const TrainerOptions& options, const Dataset& train);

// Not thread-safe: the training loop's thread. `group` (the job's whole
// collective) and `model` (this stage's) must outlive it.
class PipelineRun {
 public:
  // options.pipeline is the job's whole group; `activity` (not owned) is
  // told when the stage computes and when it waits for a neighbour.
  PipelineRun(const TrainerOptions& options, Model* model, Activity* activity);
  ~PipelineRun();

  const PipelinePlace& place() const { return place_; }

  // One step of this replica's batch: cut into spec.pipeline.micro_batches
  // micro-batches (sizes differing by at most one; fewer when the batch has
  // fewer examples) that run through the stages in the schedule's order.
  // The stage's parameters' .grad() then hold the batch's mean loss's
  // gradients. Stage 0 reads the batch's inputs (normalised as `data`
  // says), the last stage its labels; every stage needs the batch's size.
  // The batch's mean loss times `scale` (a float64 scalar) is added to
  // *loss on the last stage (0 elsewhere), and its gradients, scaled alike,
  // to the stage's: accumulate_steps batches of scale 1/accumulate_steps
  // make one step. A neighbour's or the model's error names `step`.
  absl::Status Step(const Dataset& data, const BatchLoader::Batch& batch, int64_t step, double scale,
                    at::Tensor* loss);

  // Parameter server (each replica clips its own gradient, as a worker
  // does): scales `params`' gradients (this stage's) so that the norm of
  // the replica's whole-model gradient -- its stages' squared norms added
  // over the job's group, each replica in its own slot -- is at most
  // `max_norm`, as torch::nn::utils::clip_grad_norm_ would. Returns that
  // norm; a neighbour's failure is the group's error.
  absl::StatusOr<double> ClipReplicaGradients(const std::vector<at::Tensor>& params, double max_norm);

  // The stage, the fraction of the steps' time since the last report that
  // this rank waited for its neighbours (the bubble, the transfers), and
  // the most micro-batches whose activations it held at once.
  void Report(WorkerEvent::Progress* progress);
  // The last step's most micro-batches whose activations were held at once.
  int peak_activations() const { return stage_.peak_activations(); }

  // Replica 0's stages together (each must call it): `test` through the
  // stages in batches of 1000; rank 0 gets the loss and accuracy (the last
  // stage sends them), the others nullopt.
  absl::StatusOr<std::optional<EvalResult>> Evaluate(const Dataset& test);

  // Every rank, at the job's end. With `gather` (replica 0's stages
  // together) rank 0 gets every stage's parameters in the whole model's
  // order (its own first); the others send theirs and get an empty list.
  // Then it waits until every rank got here: no rank leaves (closing its
  // connections) while a neighbour still talks to it.
  absl::StatusOr<NamedTensors> Conclude(const NamedTensors& own, bool gather);

 private:
  class TimedLink;
  absl::StatusOr<NamedTensors> GatherParameters(const NamedTensors& own);

  const JobSpec& spec_;
  const PipelinePlace place_;
  Model* model_;
  Collective* group_;  // the job's whole group
  Activity* activity_;
  int64_t step_ = 0;  // the step running
  double wait_seconds_ = 0, step_seconds_ = 0;  // since the last Report
  int held_ = 0;                                 // likewise: the most micro-batches held
  std::unique_ptr<CollectiveStageLink> link_;
  std::unique_ptr<TimedLink> timed_;
  PipelineStage stage_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PIPELINE_RUN_H_
