// Server-side optimizers, applied by a shard to one chunk (a flat span of a
// parameter) at a time. The arithmetic follows PyTorch 1.13's torch.optim
// (SGD with momentum/dampening/Nesterov/weight decay, Adam, AdamW, Adagrad),
// which optimizer_test.cc checks against LibTorch on the same inputs. Plain
// loops over float or double: the shard server needs no LibTorch.
#ifndef PSTRAIN_TABLE_OPTIMIZER_H_
#define PSTRAIN_TABLE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "proto/parameter.pb.h"

namespace pstrain {

// Fills PyTorch's defaults into unset fields (betas, eps) and checks ranges.
// INVALID_ARGUMENT names the offending field.
absl::Status NormalizeOptimizerConfig(OptimizerConfig* config);

// Number of state buffers (each the size of the chunk) `kind` keeps.
int OptimizerStateSlots(OptimizerConfig::Kind kind);

// Whether an update reads or writes its state buffers: not so for SGD
// without momentum, whose momentum buffer stays zeros (and need not travel
// to a backup).
bool OptimizerUsesState(const OptimizerConfig& config);

// Applies one update: out[i] = update(param[i], grad[i]) for i in [0, n).
// `out` may be `param` (in place) or another buffer (copy-on-write: the shard
// hands out the old values to readers without copying them). `step` counts
// updates of this chunk, starting at 1. `grad_scale` multiplies the gradient first (1/N when a sync
// shard applies the sum of N workers' gradients). `state` holds
// OptimizerStateSlots() buffers of n elements, zero-initialised (Adagrad's
// accumulator to initial_accumulator_value) before step 1.
// Returns whether every value written (out, and the state's magnitudes: the
// momentum buffer, Adam's second moment, Adagrad's sum) is finite, checked
// in the same pass; when false the caller must not use `out`, and `state`
// may hold non-finite values (reset it).
// `grad` holds n elements of T at any address (a gradient read where it
// arrived, in a received slice, need not be aligned).
template <typename T>
bool ApplyOptimizer(const OptimizerConfig& config, int64_t step, const T* param, T* out,
                    const void* grad, T* const* state, size_t n, double grad_scale);

namespace optimizer_internal {
// ApplyOptimizer<float>'s two builds (for tests: they must agree bit for
// bit); ApplyOptimizer picks the AVX2 one where HasAvx2().
bool ApplyFloatPortable(const OptimizerConfig& config, int64_t step, const float* param, float* out,
                        const void* grad, float* const* state, size_t n, double grad_scale);
bool ApplyFloatAvx2(const OptimizerConfig& config, int64_t step, const float* param, float* out, const void* grad,
                    float* const* state, size_t n, double grad_scale);
bool HasAvx2();
}  // namespace optimizer_internal

}  // namespace pstrain

#endif  // PSTRAIN_TABLE_OPTIMIZER_H_
