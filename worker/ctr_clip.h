// clip_grad_norm in the CTR loop (ps mode: each worker clips its own
// gradient, as the dense trainer clips each rank's) over the whole model:
// the dense parameters' gradients and the rows' (one per unique row,
// summed over its occurrences), scaled alike by clip / (norm + 1e-6) when
// that is below 1, as torch.nn.utils.clip_grad_norm_ over DLRM's
// parameters with the EmbeddingBags' sparse gradients coalesced.
#ifndef PSTRAIN_WORKER_CTR_CLIP_H_
#define PSTRAIN_WORKER_CTR_CLIP_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"
#include "worker/sparse_embeddings.h"

namespace pstrain {

// The step's whole gradient: `params`' gradients scaled in place; returns
// the norm before; *rows_scale: what SparseEmbeddings::Backward scales the
// rows' gradients by.
double ClipStepGradients(double clip, std::vector<at::Tensor>& params, const SparseEmbeddings& rows,
                         double* rows_scale);

// One batch of a step that sums several (a SYNC worker covering vacant
// ranks' batches): clipped on its own, as the worker whose batch it is
// would have clipped it. `params`' gradients (this batch's alone) are
// scaled into `sums` (one per parameter, undefined until the first) and
// reset; the last Forward's rows' are stashed scaled. Returns the batch's
// norm. Without accumulation only (one Forward a batch).
absl::StatusOr<double> ClipBatchApart(double clip, std::vector<at::Tensor>& params, std::vector<at::Tensor>* sums,
                                      SparseEmbeddings* rows);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CTR_CLIP_H_
