// EmbeddingStore's SYNC steps (embedding_store.h): each rank's arrival is
// summed into the step's pending sums; once every active rank has arrived
// the sums are applied, their mean over the batches the arrivals carried
// (a worker covering vacant ranks' batches says how many it sums: exactly
// the mean over every batch of the step), and the step is released.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_store_internal.h"
#include "embedding/embedding_table.h"

namespace pstrain {

using embedding_internal::Finite;
using embedding_internal::Pending;

absl::Status EmbeddingStore::AddSync(Job& job, const EmbeddingUpdateRequest& request, const std::vector<int>& tables,
                                     const std::vector<std::vector<int64_t>>& ids, int64_t* forwarded) {
  absl::MutexLock lock(&job.mu);
  if (job.gone) return absl::AbortedError(absl::StrCat("job '", Quote(job.name), "''s embeddings were dropped"));
  // Handed to another shard since OpenCall looked: the arrival goes there.
  if (!embedding_internal::Leads(job.self, job.replica.get())) return NotLeading(job);
  if (request.step() < job.steps || job.pending_ranks[request.rank()]) {  // a retry
    // Of a step this shard completed: answered, as the first try would
    // have been, once its forward is held by the backups (the first try's
    // round may have failed: the retry sends it again).
    if (job.replica != nullptr && request.step() < job.steps) *forwarded = job.replica->seq;
    return absl::OkStatus();
  }
  if (request.step() > job.steps) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", request.rank(), " sent step ", request.step(),
                                                      " of job '", Quote(job.name), "' while this shard is at step ",
                                                      job.steps, ": SYNC ranks train the same step"));
  }
  // The worst case first (every id new), charged before anything grows.
  uint64_t worst = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    worst += ids[t].size() * (job.tables[tables[t]]->dim() * sizeof(float) + sizeof(int64_t) + 40);
  }
  if (options_.budget != nullptr && !options_.budget->TryReserve(worst)) {
    return absl::ResourceExhaustedError(absl::StrCat("step ", request.step(), " of job '", Quote(job.name), "' needs ",
                                                     worst,
                                                     " bytes to sum its embedding gradients; "
                                                     "the shard has no more (pstrain-ps --max_memory_mb)"));
  }
  job.pending_bytes += worst;
  for (size_t t = 0; t < tables.size() && !request.empty(); ++t) {
    const EmbeddingTable& table = *job.tables[tables[t]];
    const int dim = table.dim();
    Pending& p = job.pending[tables[t]];
    const float* g = reinterpret_cast<const float*>(request.grads(t).data());
    for (size_t i = 0; i < ids[t].size(); ++i, g += dim) {
      if (!Finite(g, dim)) {  // NONFINITE_SKIP: this rank's gradient of this row only
        ++job.nonfinite_dropped;
        continue;
      }
      auto [it, fresh] = p.index.emplace(ids[t][i], static_cast<uint32_t>(p.ids.size()));
      if (fresh) {
        p.ids.push_back(ids[t][i]);
        p.sums.insert(p.sums.end(), g, g + dim);
      } else {
        float* acc = p.sums.data() + static_cast<size_t>(it->second) * dim;
        for (int j = 0; j < dim; ++j) acc[j] += g[j];
      }
    }
  }
  job.pending_ranks[request.rank()] = 1;
  job.pending_batches += request.empty() ? 0 : 1 + request.extra_batches();
  return CompleteSync(job, forwarded);
}

absl::Status EmbeddingStore::CompleteSync(Job& job, int64_t* forwarded) {
  // Every active rank's arrival is in (and one at least): apply the sums
  // over the arrivals' batches, once.
  bool any = false;
  for (size_t r = 0; r < job.pending_ranks.size(); ++r) {
    if (job.active[r] && !job.pending_ranks[r]) return absl::OkStatus();
    any = any || job.pending_ranks[r];
  }
  if (!any) return absl::OkStatus();
  absl::Status s;
  const double scale = job.pending_batches == 0 ? 0 : 1.0 / job.pending_batches;
  std::vector<int> all;
  std::vector<std::vector<int64_t>> changed;
  for (size_t t = 0; t < job.tables.size(); ++t) {
    Pending& p = job.pending[t];
    if (!p.ids.empty() && job.pending_batches > 0) {
      absl::Status u = job.tables[t]->Update(p.ids, p.sums.data(), job.steps + 1, scale, job.replica != nullptr);
      if (s.ok()) s = u;
    }
    all.push_back(static_cast<int>(t));
    changed.push_back(std::move(p.ids));
    p = Pending();
  }
  if (options_.budget != nullptr) options_.budget->Release(job.pending_bytes);
  job.pending_bytes = 0;
  job.pending_batches = 0;
  std::fill(job.pending_ranks.begin(), job.pending_ranks.end(), 0);
  job.max_step = job.steps;
  ++job.steps;
  for (auto& table : job.tables) table->EvictExpired(job.max_step);
  if (job.replica == nullptr) {
    job.released = job.steps;
  } else {  // released once every live backup holds the step (AwaitForwarded)
    EmbeddingForward f;
    f.set_steps(job.steps);
    *forwarded = QueueForward(job, all, changed, std::move(f));
  }
  job.changed.SignalAll();
  return s;
}

}  // namespace pstrain
