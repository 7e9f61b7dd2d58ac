// EmbeddingStore's checkpoints: Save and Load (embedding_store.h).
#include "embedding/embedding_files.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_store_internal.h"
#include "embedding/row_math.h"

namespace pstrain {

absl::StatusOr<EmbeddingFileInfo> EmbeddingStore::Save(const std::string& job, uint64_t attempt,
                                                       const std::string& path) {
  auto found = FindJob(job, attempt);
  if (!found.ok()) return found.status();
  const Job& j = **found;
  EmbeddingFileHeader header;
  header.set_job(j.name);
  header.set_shard_index(j.init.shard_index());
  header.set_num_shards(j.init.num_shards());
  *header.mutable_tables() = j.init.tables();
  {
    absl::MutexLock lock(&(*found)->mu);
    header.set_steps((*found)->steps);
  }
  std::vector<const EmbeddingTable*> tables;
  for (const auto& t : j.tables) tables.push_back(t.get());
  return WriteEmbeddingFile(path, header, tables);
}

absl::Status EmbeddingStore::Load(const InitEmbeddingsRequest& request, const std::vector<std::string>& paths,
                                  int64_t start_step) {
  if (start_step < 0 || start_step >= embedding_internal::kMaxStep) {
    return embedding_internal::Invalid(request.job(), "start_step out of range");
  }
  auto job = MakeJob(request, start_step);
  if (!job.ok()) return job.status();
  std::vector<EmbeddingTable*> tables;
  for (const auto& t : (*job)->tables) tables.push_back(t.get());
  const InitEmbeddingsRequest& init = (*job)->init;
  auto mine = [&init](size_t table, int64_t id) {
    return ShardOfId(id, init.tables(static_cast<int>(table)).virtual_shards(), init.num_shards()) ==
           init.shard_index();
  };
  for (const std::string& path : paths) {
    absl::Status s = ReadEmbeddingFile(path, tables, mine, nullptr);
    if (!s.ok()) return s;  // the new tables go with `job`; the running job is untouched
  }
  bool created = false;
  return Install(std::move(*job), /*keep_identical=*/false, &created);
}

}  // namespace pstrain
