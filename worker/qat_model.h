// Quantization-aware training (spec `quantization: {mode: qat, ...}`): a
// built-in model whose forward runs through quantize/qat_network, with
// fake-quantized weights and activations. The parameters stay the model's
// own fp32 tensors (the shards or the local optimizer update them as
// always); the quantizers' state is the model's NamedBuffers, saved with the
// final weights as "qat.<quantizer>.<min_val|max_val|scale|zero_point>",
// which `pstrain export --quantize static` converts with.
//
// Schedule: before start_step the model trains in fp32 (quantizers off);
// from start_step on, observers and fake quantization; from
// freeze_observers_step (when > 0) on, the scales stay as they are.
// Evaluation fake-quantizes without observing.
//
// Several workers (all-reduce mode): each activation observer takes the
// range of every rank's batch (AllRanksBatchRange: one all-reduce of a
// (-min, max) pair per quantizer and step), so every rank's observers --
// and scales -- are those one worker would have on the concatenated batch,
// as SyncBatchNorm does for BatchNorm's statistics.
#ifndef PSTRAIN_WORKER_QAT_MODEL_H_
#define PSTRAIN_WORKER_QAT_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "collective/collective.h"
#include "common/job_spec.h"
#include "quantize/fake_quant.h"
#include "worker/model.h"

namespace pstrain {

// `name`: the spec's model (mlp, mlp_wide, lenet); INVALID_ARGUMENT for
// another.
// `activation_ranges` (optional): see AllRanksBatchRange.
absl::StatusOr<std::unique_ptr<Model>> WrapForQat(std::unique_ptr<Model> model, const std::string& name,
                                                  const QuantizationSpec& spec,
                                                  const BatchRangeReducer& activation_ranges = nullptr);

// The range of every rank's batch in `group`: (min, max) of each rank in,
// the min of the minimums and the max of the maximums out.
BatchRangeReducer AllRanksBatchRange(Collective* group);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_QAT_MODEL_H_
