// EmbeddingStore's calls from the coordinator: checkpoints (Save, Load),
// Drop and Stats (embedding_store.h).
#include <algorithm>

#include "embedding/embedding_files.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_store_internal.h"
#include "embedding/row_math.h"
#include "common/quote.h"

namespace pstrain {

absl::StatusOr<EmbeddingFileInfo> EmbeddingStore::Save(const std::string& job, uint64_t attempt,
                                                       const std::string& path, uint64_t checkpoint_id,
                                                       uint64_t base_id) {
  auto own = FindJob(job, attempt, nullptr);
  if (!own.ok()) return own.status();
  // The slots this shard leads (replicated: its own unless it was declared
  // lost, and those it took over; a backup's copy is saved by its leader).
  std::vector<std::shared_ptr<Job>> led;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = jobs_.lower_bound(Key(job, 0)); it != jobs_.end() && it->first.first == job; ++it) {
      if (it->second->init.attempt() == attempt) led.push_back(it->second);
    }
  }
  int64_t steps = 0;
  {
    absl::MutexLock lock(&(*own)->mu);
    steps = (*own)->steps;
  }
  std::vector<const EmbeddingTable*> tables;  // every led slot's tables, in the header's order each
  // Per part: rows unchanged since this epoch are written by id alone (0:
  // all whole, a slot this shard has no record of the base for).
  std::vector<uint32_t> changed_since;
  for (const auto& slot : led) {
    absl::MutexLock lock(&slot->mu);
    if (slot->replica != nullptr) {
      if (slot->replica->leader != static_cast<int64_t>(slot->self) || !slot->replica->fenced.empty()) continue;
      steps = slot->steps;
    }
    const Job::Saved* base = slot->FindSaved(base_id);
    for (size_t t = 0; t < slot->tables.size(); ++t) {
      tables.push_back(slot->tables[t].get());
      changed_since.push_back(base == nullptr ? 0 : base->epochs[t]);
    }
    // Before any row is copied: a change from here on is in a later file.
    slot->RecordSaved(checkpoint_id);
  }
  const Job& j = **own;
  EmbeddingFileHeader header;
  header.set_job(j.name);
  header.set_shard_index(j.self);
  header.set_num_shards(j.init.num_shards());
  *header.mutable_tables() = j.init.tables();
  header.set_steps(steps);
  header.set_checkpoint_id(checkpoint_id);
  if (std::any_of(changed_since.begin(), changed_since.end(), [](uint32_t e) { return e != 0; })) {
    header.set_base_id(base_id);
  } else {
    changed_since.clear();
  }
  return WriteEmbeddingFile(path, header, tables, changed_since);
}

absl::Status EmbeddingStore::Load(const InitEmbeddingsRequest& request,
                                  const std::vector<std::vector<std::string>>& chain, int64_t start_step) {
  if (start_step < 0 || start_step >= embedding_internal::kMaxStep) {
    return embedding_internal::Invalid(request.job(), "start_step out of range");
  }
  auto jobs = MakeJobs(request, start_step);
  if (!jobs.ok()) return jobs.status();
  for (const auto& job : *jobs) {  // each slot's rows, from whichever files hold them
    std::vector<EmbeddingTable*> tables;
    for (const auto& t : job->tables) tables.push_back(t.get());
    const InitEmbeddingsRequest& init = job->init;
    auto mine = [&init](size_t table, int64_t id) {
      return ShardOfId(id, init.tables(static_cast<int>(table)).virtual_shards(), init.num_shards()) ==
             init.shard_index();
    };
    auto loaded = ReadEmbeddingChain(chain, tables, mine);
    if (!loaded.ok()) return loaded.status();  // the new tables go with `jobs`; the running job is untouched
    // The rows are the checkpoint's: a save incremental on it writes only
    // what changes from here on.
    absl::MutexLock lock(&job->mu);
    job->RecordSaved(*loaded);
  }
  bool created = false;
  return Install(std::move(*jobs), /*keep_identical=*/false, &created);
}

absl::Status EmbeddingStore::Drop(const DropEmbeddingsRequest& request) {
  std::vector<std::shared_ptr<Job>> dropped;
  {
    absl::MutexLock lock(&mu_);
    auto first = jobs_.lower_bound(Key(request.job(), 0)), it = first;
    for (; it != jobs_.end() && it->first.first == request.job(); ++it) {
      if (request.attempt() < it->second->init.attempt()) {
        return absl::AbortedError(absl::StrCat("job '", Quote(request.job()), "' attempt ", request.attempt(),
                                               " may not drop attempt ", it->second->init.attempt(), "'s tables"));
      }
      dropped.push_back(it->second);
    }
    jobs_.erase(first, it);  // none: already gone, a retry
    routings_.erase(request.job());
  }
  for (const auto& job : dropped) {
    absl::MutexLock lock(&job->mu);
    job->gone = true;
    if (options_.budget != nullptr) options_.budget->Release(job->pending_bytes);
    job->pending_bytes = 0;
    job->changed.SignalAll();
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStore::Stats(const EmbeddingStatsRequest& request, EmbeddingStatsResponse* response) {
  std::vector<std::shared_ptr<Job>> slots;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = jobs_.lower_bound(Key(request.job(), 0)); it != jobs_.end() && it->first.first == request.job();
         ++it) {
      slots.push_back(it->second);
    }
  }
  if (slots.empty()) {
    return absl::NotFoundError(absl::StrCat("job '", Quote(request.job()), "' has no embeddings on this shard"));
  }
  // Every slot's rows count (the shard holds them all); the steps are the
  // shard's own slot's.
  for (size_t t = 0; t < slots[0]->tables.size(); ++t) {
    EmbeddingTableStats sum;
    for (const auto& job : slots) {
      const EmbeddingTableStats st = job->tables[t]->Stats();
      sum.rows += st.rows;
      sum.bytes += st.bytes;
      sum.lookups += st.lookups;
      sum.created += st.created;
      sum.not_admitted += st.not_admitted;
      sum.refused += st.refused;
      sum.updates += st.updates;
      sum.dropped_updates += st.dropped_updates;
      sum.nonfinite += st.nonfinite + (t == 0 ? job->nonfinite_dropped.load() : 0);
      sum.evicted_ttl += st.evicted_ttl;
      sum.evicted_lru += st.evicted_lru;
    }
    EmbeddingTableStatsProto* p = response->add_tables();
    p->set_table(slots[0]->tables[t]->config().name());
    p->set_rows(sum.rows);
    p->set_bytes(sum.bytes);
    p->set_lookups(sum.lookups);
    p->set_created(sum.created);
    p->set_not_admitted(sum.not_admitted);
    p->set_refused(sum.refused);
    p->set_updates(sum.updates);
    p->set_dropped_updates(sum.dropped_updates);
    p->set_nonfinite(sum.nonfinite);
    p->set_evicted_ttl(sum.evicted_ttl);
    p->set_evicted_lru(sum.evicted_lru);
  }
  for (const auto& job : slots) {
    absl::MutexLock lock(&job->mu);
    const uint32_t slot = job->init.shard_index();
    if (slot == job->self) response->set_applied_steps(job->steps);
    if (job->replica == nullptr) continue;
    const auto& rep = *job->replica;
    const bool leads = rep.leader == static_cast<int64_t>(job->self) && rep.fenced.empty();
    if (leads) {
      response->add_led_slots(slot);
      for (uint32_t c : rep.needs_copy) {
        if (std::count(response->copying_to().begin(), response->copying_to().end(), c) == 0) response->add_copying_to(c);
      }
    } else {
      response->add_backed_up_slots(slot);
    }
    if (response->generation() == 0 || rep.routing.generation() < response->generation()) {
      response->set_generation(rep.routing.generation());
    }
  }
  return absl::OkStatus();
}

}  // namespace pstrain
