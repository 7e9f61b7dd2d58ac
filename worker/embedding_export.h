// Embedding tables out of a job's checkpoint files, for PyTorch: one file
// torch.load reads, a dict with, per table, "<table>.ids" (int64 [rows],
// ascending) and "<table>.weights" (float32 [rows, dim], row i the value of
// ids[i]). torch.nn.EmbeddingBag.from_pretrained(weights) then serves them
// once a model maps its ids to rows (torch.searchsorted(ids, x)).
#ifndef PSTRAIN_WORKER_EMBEDDING_EXPORT_H_
#define PSTRAIN_WORKER_EMBEDDING_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pstrain {

// Reads `chain` (every shard's SaveEmbeddings file of one checkpoint, after
// those of the checkpoints it is incremental on, oldest first: embedding/
// embedding_files.h's ReadEmbeddingChain; they must hold the same tables)
// and writes `out` atomically. The rows are held in memory while they are
// written (a table PyTorch loads must fit anyway).
absl::Status ExportEmbeddings(const std::vector<std::vector<std::string>>& chain, const std::string& out);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_EMBEDDING_EXPORT_H_
