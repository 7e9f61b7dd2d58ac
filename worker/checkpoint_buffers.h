// A model's buffers (QAT's quantizers) in a checkpoint: worker 0 writes them
// at the pause (StepBoundary::save_buffers), the manifest lists the file
// under `buffers`, and every resumed worker loads them before its first
// step (TrainerOptions::restore_buffers), in either mode.
#ifndef PSTRAIN_WORKER_CHECKPOINT_BUFFERS_H_
#define PSTRAIN_WORKER_CHECKPOINT_BUFFERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/weights_file.h"
#include "proto/parameter.pb.h"

namespace pstrain {

// Writes `buffers` to `path` (common/weights_file.h's format, atomically);
// its size and crc32.
absl::StatusOr<SaveTableResponse> SaveBuffersFile(const NamedTensors& buffers, const std::string& path);

// The buffers the checkpoint in `dir` holds: none (an empty list) when its
// manifest lists no buffers file; DATA_LOSS when the file is not the one
// the manifest describes.
absl::StatusOr<NamedTensors> ReadCheckpointBuffers(const std::string& dir);

// Copies `saved` into the model's `buffers`, which must have the same
// names, shapes and dtypes (FAILED_PRECONDITION naming the first that
// differs: a checkpoint of another model or quantization settings).
absl::Status LoadBuffersInto(const NamedTensors& saved, const NamedTensors& buffers);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CHECKPOINT_BUFFERS_H_
