// The job spec's sparse part (docs/job-spec.md, docs/embeddings.md): the
// embedding tables the shards hold for the job, and which table each sparse
// feature field of the data reads, pooled how.
#ifndef PSTRAIN_COMMON_EMBEDDING_SPEC_H_
#define PSTRAIN_COMMON_EMBEDDING_SPEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
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
  // As the spec gives them, with its defaults filled and every range checked
  // as NormalizeEmbeddingConfig (embedding/row_math.h) checks it, so that a
  // bad value is refused at submission naming its field; zeros that mean
  // "the kind's default" (optimizer eps, betas, ftrl_beta; initializer
  // scale) are left for NormalizeEmbeddingConfig, which the shard and the
  // worker call (common/ may not depend on embedding/). A table's seed
  // defaults to the job's, virtual_shards to 1024.
  std::vector<EmbeddingTableConfig> tables;
  // One per sparse feature field of the data, in its order (Criteo: 26).
  std::vector<EmbeddingFieldSpec> fields;
  bool empty() const { return tables.empty(); }
};

// For the job spec's parser (job_spec.cc), whose reader is internal to it.
class MappingReader;
struct JobSpec;

// Reads the top-level `embeddings` mapping, if there is one, into *out:
// `tables` (1..64, names unique) and `fields` (one per sparse field of the
// data: Criteo's 26; when omitted, every field reads the one table, or field
// f table f when there are 26). `job_seed` is a table's default seed.
absl::Status ReadEmbeddingsSpec(MappingReader& r, uint64_t job_seed, EmbeddingsSpec* out);

// The rules that tie `embeddings`, `model: dlrm` and `data.format: criteo`
// together, and what embedding jobs cannot do yet (all-reduce, consistency
// other than async, shrinking below `workers`). INVALID_ARGUMENT names the
// field.
absl::Status CheckEmbeddingJob(const JobSpec& spec, const MappingReader& r);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_EMBEDDING_SPEC_H_
