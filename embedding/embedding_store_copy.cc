// Re-replication of embedding slots (issue 34, docs/replication.md): a
// spare that takes a lost shard's place gets each slot it holds a copy of
// whole from the slot's leader, before the leader's next round of forwards
// reaches it. FullCopy is the leader's half, ReceiveCopy the spare's.
//
// The copy starts at forward `base`: the slot's state (steps, each rank's
// steps) as of that forward, then every row as it is when read, stripe by
// stripe under each stripe's lock. A row an update changes after it was
// read comes again in a forward after `base`, which the spare applies
// after the copy: every row ends as the leader holds it. The spare does
// not lead (the routing lists it catching up) until every leader has
// copied it its slots.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_store_internal.h"

namespace pstrain {

using embedding_internal::CheckRows;
using embedding_internal::Invalid;
using embedding_internal::kMaxStep;
using embedding_internal::Packed;
using embedding_internal::SlotReplica;

namespace {

// Rows of a copy are sent in requests of about this many bytes.
constexpr size_t kCopyBytes = size_t{4} << 20;

}  // namespace

absl::Status EmbeddingStore::FullCopy(Job& job, uint32_t backup, const std::string& target, int64_t base) {
  ReplicateEmbeddingsRequest request;
  request.set_job(job.name);
  request.set_attempt(job.init.attempt());
  request.set_slot(job.init.shard_index());
  request.set_sender(job.self);
  {
    absl::MutexLock lock(&job.mu);
    SlotReplica& rep = *job.replica;
    request.set_generation(rep.routing.generation());
    request.set_copy(++rep.copies_made);
    InitEmbeddingsRequest* init = request.mutable_copy_init();
    *init = job.init;
    init->set_shard_index(backup);
    *init->mutable_routing() = rep.routing;
    EmbeddingSlotState* state = request.mutable_copy_state();
    state->set_seq(base);
    state->set_copy(request.copy());
    state->set_steps(job.released);
    *state->mutable_claimed() = {job.claimed.begin(), job.claimed.end()};
    *state->mutable_applied() = {job.applied.begin(), job.applied.end()};
  }
  ReplicateEmbeddingsResponse response;
  if (absl::Status s = options_.forward(target, request, &response); !s.ok()) return s;
  // The rows, each as it is when read: a forward after `base` that changed
  // one comes after the copy and leaves the row as the leader holds it.
  request.clear_copy_init();
  request.clear_copy_state();
  size_t bytes = 0;
  auto send = [&]() -> absl::Status {
    if (request.copy_rows_size() == 0) return absl::OkStatus();
    absl::Status s = options_.forward(target, request, &response);
    request.clear_copy_rows();
    bytes = 0;
    return s;
  };
  for (const auto& table : job.tables) {
    EmbeddingRowsProto* rows = nullptr;
    const int dim = table->dim(), slots = table->slot_floats();
    absl::Status s = table->ForEachRow([&](const EmbeddingRowView& r) -> absl::Status {
      if (rows == nullptr) {
        rows = request.add_copy_rows();
        rows->set_table(table->config().name());
      }
      rows->mutable_ids()->append(reinterpret_cast<const char*>(&r.id), sizeof(r.id));
      rows->mutable_values()->append(reinterpret_cast<const char*>(r.value), sizeof(float) * dim);
      rows->mutable_slots()->append(reinterpret_cast<const char*>(r.slots), sizeof(float) * slots);
      rows->mutable_last_steps()->append(reinterpret_cast<const char*>(&r.last_step), sizeof(r.last_step));
      rows->mutable_counts()->append(reinterpret_cast<const char*>(&r.count), sizeof(r.count));
      bytes += sizeof(r.id) + sizeof(float) * (dim + slots) + sizeof(r.last_step) + sizeof(r.count);
      if (bytes < kCopyBytes) return absl::OkStatus();
      rows = nullptr;
      return send();
    });
    if (!s.ok()) return s;
  }
  return send();
}

absl::Status EmbeddingStore::ReceiveCopyRows(const ReplicateEmbeddingsRequest& request,
                                             ReplicateEmbeddingsResponse* response) {
  const uint32_t slot = request.slot();
  auto found = FindJob(request.job(), request.attempt(), &slot);
  if (!found.ok()) return found.status();
  Job& job = **found;
  if (job.replica == nullptr) return Invalid(job.name, "rows of a copy for a slot that is not replicated");
  absl::MutexLock lock(&job.mu);
  if (static_cast<int64_t>(request.sender()) != job.replica->leader || request.sender() == job.self) {
    return absl::AbortedError(absl::StrCat("shard ", request.sender(), " does not lead slot ", slot, " of job '",
                                           Quote(job.name), "': its copy is refused"));
  }
  if (request.copy() != job.replica->made_from_copy) {
    return absl::AbortedError(absl::StrCat("rows of copy ", request.copy(), " of slot ", slot, " of job '",
                                           Quote(job.name), "', which holds copy ", job.replica->made_from_copy,
                                           ": refused (the sender began another copy)"));
  }
  std::vector<int> tables;
  for (const EmbeddingRowsProto& rows : request.copy_rows()) {
    auto t = job.table_index.find(rows.table());
    if (t == job.table_index.end()) return Invalid(job.name, absl::StrCat("no embedding table '", Quote(rows.table()), "'"));
    if (absl::Status s = CheckRows(job.init, *job.tables[t->second], rows); !s.ok()) return s;
    tables.push_back(t->second);
  }
  for (int k = 0; k < request.copy_rows_size(); ++k) {
    const EmbeddingRowsProto& rows = request.copy_rows(k);
    EmbeddingTable& table = *job.tables[tables[k]];
    for (size_t i = 0; i < rows.ids().size() / sizeof(int64_t); ++i) {
      absl::Status s = table.InsertRow({Packed<int64_t>(rows.ids())[i], Packed<float>(rows.values()) + i * table.dim(),
                                        Packed<float>(rows.slots()) + i * table.slot_floats(),
                                        Packed<int64_t>(rows.last_steps())[i], Packed<uint32_t>(rows.counts())[i]});
      if (!s.ok()) return s;
    }
  }
  response->set_seq(job.replica->seq);
  return absl::OkStatus();
}

absl::Status EmbeddingStore::ReceiveCopy(const ReplicateEmbeddingsRequest& request,
                                         ReplicateEmbeddingsResponse* response) {
  if (!request.has_copy_init()) return ReceiveCopyRows(request, response);  // rows of a copy begun earlier
  const uint32_t slot = request.slot();
  // The first request: the slot made afresh, as its leader holds it up to
  // copy_state.seq (its rows follow).
  const InitEmbeddingsRequest& init = request.copy_init();
  const EmbeddingSlotState& state = request.copy_state();
  if (init.job() != request.job() || init.attempt() != request.attempt() || init.replicas() == 0 ||
      slot >= init.num_shards()) {
    return Invalid(request.job(), "a copy's tables are not of its job, attempt and slot");
  }
  if (state.seq() < 0 || state.steps() < 0 || state.steps() >= kMaxStep ||
      state.claimed_size() != static_cast<int>(init.num_workers()) ||
      state.applied_size() != static_cast<int>(init.num_workers())) {
    return Invalid(request.job(), "a copy's slot state does not match its job");
  }
  auto jobs = MakeJobs(init, state.steps());
  if (!jobs.ok()) return jobs.status();
  std::shared_ptr<Job> job;
  for (auto& j : *jobs) {
    if (j->init.shard_index() == slot) job = j;
  }
  if (job == nullptr) {
    return Invalid(request.job(), absl::StrCat("shard ", init.shard_index(), " holds no copy of slot ", slot));
  }
  {
    absl::MutexLock lock(&job->mu);
    SlotReplica& rep = *job->replica;
    if (static_cast<int64_t>(request.sender()) != rep.leader || request.sender() == job->self) {
      return absl::AbortedError(absl::StrCat("shard ", request.sender(), " does not lead slot ", slot,
                                             " under the copy's routing: its copy is refused"));
    }
    rep.seq = state.seq();
    rep.made_from_copy = state.copy();
    rep.made_from_generation = request.generation();
    rep.made_from_sender = request.sender();
    for (int r = 0; r < state.claimed_size(); ++r) {
      job->claimed[r] = std::max<int64_t>(0, std::min(state.claimed(r), kMaxStep));
      job->applied[r] = std::max<int64_t>(0, std::min(state.applied(r), kMaxStep));
    }
  }
  std::shared_ptr<Job> replaced;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the shard is shutting down");
    std::shared_ptr<Job>& at = jobs_[Key(request.job(), slot)];
    if (at != nullptr) {
      absl::MutexLock held(&at->mu);
      const SlotReplica* had = at->replica.get();
      // A later attempt or routing here, another leader under the same
      // routing, or a later copy of the same leader: the copy is not the
      // one the slot's leader sends now (a late request of an earlier one).
      const bool same = had != nullptr && had->routing.generation() == request.generation();
      const bool newer = at->init.attempt() > request.attempt() ||
                         (had != nullptr && had->routing.generation() > request.generation()) ||
                         (same && had->leader != static_cast<int64_t>(request.sender())) ||
                         (same && had->made_from_generation == request.generation() &&
                          had->made_from_sender == static_cast<int64_t>(request.sender()) &&
                          had->made_from_copy >= state.copy());
      if (newer) {
        return absl::AbortedError(absl::StrCat("slot ", slot, " of job '", Quote(request.job()),
                                               "' is held under a later attempt or routing: the copy is refused"));
      }
    } else if (jobs_.size() > options_.max_jobs) {
      jobs_.erase(Key(request.job(), slot));
      return absl::ResourceExhaustedError(absl::StrCat("this shard holds ", jobs_.size(), " embedding slots, its most"));
    }
    replaced = std::move(at);
    at = job;
    // The routing and seats SetWorkers brought, which the slot made here
    // would otherwise miss (it took the slots it tells before this one was
    // in; the copy's state carries neither).
    auto told = routings_.find(request.job());
    if (told != routings_.end() && told->second.attempt == request.attempt()) {
      absl::MutexLock held(&job->mu);
      if (told->second.routing.generation() > request.generation()) ApplyRouting(*job, told->second.routing);
      if (told->second.active.size() == job->active.size()) job->active = told->second.active;
    }
  }
  if (replaced != nullptr) {
    absl::MutexLock lock(&replaced->mu);
    replaced->gone = true;
    replaced->changed.SignalAll();
  }
  response->set_seq(state.seq());
  return absl::OkStatus();
}

}  // namespace pstrain
