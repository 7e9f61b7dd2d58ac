// The job spec's sparse part (docs/job-spec.md, docs/embeddings.md): the
// embedding tables the shards hold for the job, and which table each sparse
// feature field of the data reads, pooled how.
#ifndef PSTRAIN_COMMON_EMBEDDING_SPEC_H_
#define PSTRAIN_COMMON_EMBEDDING_SPEC_H_

#include <vector>

#include "proto/embedding.pb.h"

namespace pstrain {

// How a field's ids (several per example in a multi-hot field) become one
// vector: torch's EmbeddingBag modes. An example with no id gets zeros.
enum class PoolingSpec { kSum, kMean };  // sum | mean

struct EmbeddingFieldSpec {
  int table = 0;  // index into EmbeddingsSpec::tables
  PoolingSpec pooling = PoolingSpec::kSum;
};

struct EmbeddingsSpec {
  // Normalized (NormalizeEmbeddingConfig: defaults filled, ranges checked);
  // a table's seed defaults to the job's.
  std::vector<EmbeddingTableConfig> tables;
  // One per sparse feature field of the data, in its order (Criteo: 26).
  std::vector<EmbeddingFieldSpec> fields;
  bool empty() const { return tables.empty(); }
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_EMBEDDING_SPEC_H_
