// `pstrain export JOB --embeddings FILE`: a dlrm job's embedding tables, from
// the embedding files of its newest checkpoint, as one file torch.load reads
// (per table "<table>.ids" and "<table>.weights": worker/embedding_export.h).
// The conversion runs in //worker:embedding_export_tool, a child process,
// so that the CLI does not link LibTorch.
#ifndef PSTRAIN_CLIENT_EMBEDDING_EXPORT_COMMAND_H_
#define PSTRAIN_CLIENT_EMBEDDING_EXPORT_COMMAND_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pstrain {

// Exports the embedding files listed in `checkpoint_dir`'s manifest (and,
// an incremental checkpoint, those of the checkpoints it is incremental on)
// to `out` with `tool` (embedding_export_tool's path), waiting at most
// `timeout`. Returns the checkpoint's step. FAILED_PRECONDITION when the
// checkpoint holds no embedding tables; the tool's own error (its last
// output) otherwise.
absl::StatusOr<int64_t> ExportCheckpointEmbeddings(const std::string& checkpoint_dir, const std::string& out,
                                                   const std::string& tool, absl::Duration timeout);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_EMBEDDING_EXPORT_COMMAND_H_
