// Replicated embedding tables (issue 34, docs/replication.md): the rows of
// slot h -- the virtual shards of shard h -- live on shards h, h+1, ...,
// h+R (mod the shard count). The first copy the coordinator's routing does
// not mark lost leads the slot: it applies the updates (under SYNC the
// step's mean, under ASYNC and SSP each push) and forwards the rows they
// changed, whole (value, optimizer slots, last step, count), to the slot's
// live backups, one after the other in copy order, before any caller sees
// them: an update's answer waits for it, and under SYNC so do the next
// step's lookups. Replication after aggregation, as for dense chunks.
//
// Forwards are numbered per slot (seq): a backup applies forward seq only
// on top of seq - 1 and ignores one it holds, so a retried round is
// harmless. One caller's thread at a time sends a round of everything
// queued (AwaitForwarded), for every caller waiting, and the next round
// starts only after every backup acknowledged the last: a backup is at most
// one forward behind any other copy, and the last forward, which every copy
// keeps, is all a promoted leader needs to bring one up to date (one
// further behind, which should not happen, gets the whole slot as a spare
// does: embedding_store_copy.cc).
//
// Rows a lookup creates are not forwarded: a row's first value is a
// function of its id, so a promoted backup creates the same row on its
// first lookup. What a backup does not see: admission counts of ids not yet
// admitted, and lookups' LRU order (docs/replication.md says what that
// changes).
#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_store_internal.h"
#include "embedding/row_math.h"

namespace pstrain {

using embedding_internal::CheckRows;
using embedding_internal::In;
using embedding_internal::Invalid;
using embedding_internal::Leads;
using embedding_internal::kMaxStep;
using embedding_internal::LeaderOf;
using embedding_internal::Lost;
using embedding_internal::Packed;
using embedding_internal::SlotReplica;

namespace {

// Forwards one request carries at most.
constexpr int kMaxForwards = 4096;
// How long a round waits before it tries an unreachable backup again (the
// coordinator declares it lost, or it answers).
constexpr absl::Duration kForwardRetry = absl::Milliseconds(100);

// A failure of a forward or a copy that trying again may mend.
bool Transient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled;
}

}  // namespace

namespace embedding_internal {

absl::Status CheckRows(const InitEmbeddingsRequest& init, const EmbeddingTable& table, const EmbeddingRowsProto& rows) {
  const std::string& name = table.config().name();
  const size_t n = rows.ids().size() / sizeof(int64_t);
  if (rows.ids().size() % sizeof(int64_t) != 0 || n > kMaxEmbeddingIdsPerRequest ||
      rows.values().size() != n * table.dim() * sizeof(float) ||
      rows.slots().size() != n * table.slot_floats() * sizeof(float) ||
      rows.last_steps().size() != n * sizeof(int64_t) || rows.counts().size() != n * sizeof(uint32_t)) {
    return Invalid(init.job(), absl::StrCat("a forward's rows of table '", Quote(name),
                                            "' do not match its dim and optimizer"));
  }
  const int64_t* ids = Packed<int64_t>(rows.ids());
  const int64_t* last = Packed<int64_t>(rows.last_steps());
  const uint32_t vshards = table.config().virtual_shards();
  for (size_t i = 0; i < n; ++i) {
    if (ShardOfId(ids[i], vshards, init.num_shards()) != init.shard_index() || last[i] < 0 || last[i] >= kMaxStep) {
      return Invalid(init.job(), absl::StrCat("a forward's row ", ids[i], " of table '", Quote(name),
                                              "' is not of slot ", init.shard_index(), " or its step is out of range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace embedding_internal

absl::StatusOr<std::vector<std::shared_ptr<EmbeddingStore::Job>>> EmbeddingStore::MakeJobs(
    const InitEmbeddingsRequest& request, int64_t start_step) {
  for (uint32_t lost : request.routing().lost_shards()) {
    if (lost >= request.num_shards()) return Invalid(request.job(), "the routing names a shard the job lacks");
  }
  std::vector<std::shared_ptr<Job>> jobs;
  const uint32_t shards = std::max<uint32_t>(request.num_shards(), 1), self = request.shard_index();
  // MakeJob checks the request first: the slot arithmetic below is then in range.
  for (uint32_t r = 0; r <= request.replicas(); ++r) {
    const uint32_t slot = (self % shards + shards - r % shards) % shards;
    auto job = MakeJob(request, slot, start_step);
    if (!job.ok()) return job.status();
    if (request.replicas() > 0) {
      auto rep = std::make_unique<SlotReplica>();
      for (uint32_t c = 0; c <= request.replicas(); ++c) rep->copies.push_back((slot + c) % shards);
      rep->routing = request.routing();
      rep->leader = LeaderOf(rep->copies, rep->routing);
      (*job)->replica = std::move(rep);
    }
    jobs.push_back(std::move(*job));
  }
  if (request.replicas() > 0 && !options_.forward) {  // once the request is known to be well-formed
    return absl::FailedPreconditionError(
        "this shard cannot forward to other shards: replicated embedding tables need a server that can (pstrain-ps)");
  }
  return jobs;
}

absl::Status EmbeddingStore::CheckLeads(Job& job) {
  if (job.replica == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&job.mu);
  if (Leads(job.self, job.replica.get())) return absl::OkStatus();
  return NotLeading(job);
}

absl::Status EmbeddingStore::NotLeading(const Job& job) {
  const SlotReplica& rep = *job.replica;
  return absl::FailedPreconditionError(absl::StrCat(
      "slot ", job.init.shard_index(), " of job '", Quote(job.name), "' is led by shard ", rep.leader,
      " under routing generation ", rep.routing.generation(), ", not by this one (", job.self, ")",
      rep.fenced.empty() ? "" : absl::StrCat(": ", rep.fenced)));
}

int64_t EmbeddingStore::QueueForward(Job& job, const std::vector<int>& tables,
                                     const std::vector<std::vector<int64_t>>& ids, EmbeddingForward forward) {
  SlotReplica& rep = *job.replica;
  for (size_t t = 0; t < tables.size(); ++t) {
    if (ids[t].empty()) continue;
    const EmbeddingTable& table = *job.tables[tables[t]];
    EmbeddingRowsProto* rows = forward.add_tables();
    rows->set_table(table.config().name());
    table.CopyRows(ids[t], rows);
  }
  forward.set_seq(++rep.seq);
  rep.queue.push_back(std::move(forward));
  return rep.seq;
}

absl::Status EmbeddingStore::AwaitForwarded(Job& job, int64_t seq) {
  absl::MutexLock lock(&job.mu);
  SlotReplica& rep = *job.replica;
  const absl::Time until = absl::Now() + options_.max_wait;
  while (rep.acked < seq) {
    if (job.gone) return absl::AbortedError(absl::StrCat("job '", Quote(job.name), "''s embeddings were dropped"));
    if (!rep.fenced.empty()) return absl::AbortedError(rep.fenced);
    // Handed to another shard before its forward went out (the queue went
    // with it): the caller sends it again to the new leader.
    if (rep.leader != static_cast<int64_t>(job.self)) return NotLeading(job);
    if (rep.sending || rep.queue.empty()) {  // another caller sends the round that holds `seq`
      if (job.changed.WaitWithDeadline(&job.mu, until)) {
        return absl::DeadlineExceededError(absl::StrCat("the backups of slot ", job.init.shard_index(), " of job '",
                                                        Quote(job.name), "' did not take its updates in time"));
      }
      continue;
    }
    std::vector<EmbeddingForward> batch;
    batch.swap(rep.queue);
    rep.sending = true;
    job.mu.Unlock();
    absl::Status s = SendRound(job, batch);
    job.mu.Lock();
    rep.sending = false;
    if (s.ok()) {
      rep.acked = batch.back().seq();
      if (job.init.consistency() == SYNC) job.released = std::max(job.released, batch.back().steps());
      rep.last = std::make_shared<const EmbeddingForward>(std::move(batch.back()));
    } else if (!job.gone && rep.fenced.empty()) {
      // Sent again by the next caller (a worker's retry comes back for it).
      for (EmbeddingForward& f : rep.queue) batch.push_back(std::move(f));
      rep.queue = std::move(batch);
    }
    job.changed.SignalAll();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStore::SendRound(Job& job, const std::vector<EmbeddingForward>& batch) {
  const uint32_t slot = job.init.shard_index();
  ReplicateEmbeddingsRequest request;
  request.set_job(job.name);
  request.set_attempt(job.init.attempt());
  request.set_slot(slot);
  request.set_sender(job.self);
  std::vector<uint32_t> done;
  const absl::Time until = absl::Now() + options_.max_wait;
  for (;;) {
    uint32_t backup = 0;
    std::string target;
    std::shared_ptr<const EmbeddingForward> last;
    bool copy = false;
    {
      absl::MutexLock lock(&job.mu);
      const SlotReplica& rep = *job.replica;
      if (job.gone) return absl::AbortedError(absl::StrCat("job '", Quote(job.name), "''s embeddings were dropped"));
      if (!rep.fenced.empty()) return absl::AbortedError(rep.fenced);
      auto next = std::find_if(rep.copies.begin(), rep.copies.end(), [&](uint32_t s) {
        return s != job.self && !Lost(rep.routing, s) && std::count(done.begin(), done.end(), s) == 0;
      });
      if (next == rep.copies.end()) return absl::OkStatus();  // every live backup holds the round
      backup = *next;
      target = rep.routing.targets(static_cast<int>(backup));
      last = rep.last;
      request.set_generation(rep.routing.generation());
      copy = std::count(rep.needs_copy.begin(), rep.needs_copy.end(), backup) > 0;
    }
    if (copy) {  // a spare: the slot up to the round's start, then the round
      absl::Status c = FullCopy(job, backup, target, batch.front().seq() - 1);
      if (c.ok()) {
        absl::MutexLock lock(&job.mu);
        auto& n = job.replica->needs_copy;
        n.erase(std::remove(n.begin(), n.end(), backup), n.end());
        continue;
      }
      if (!Transient(c) || absl::Now() > until) return c;
      absl::SleepFor(kForwardRetry);
      continue;
    }
    request.clear_forwards();
    for (const EmbeddingForward& f : batch) *request.add_forwards() = f;
    ReplicateEmbeddingsResponse response;
    absl::Status s = options_.forward(target, request, &response);
    if (s.ok() && response.seq() < batch.back().seq() && last != nullptr && response.seq() + 1 == last->seq()) {
      // One behind (a promoted leader's first round): the last forward first.
      ReplicateEmbeddingsRequest mended = request;
      mended.clear_forwards();
      *mended.add_forwards() = *last;
      for (const EmbeddingForward& f : batch) *mended.add_forwards() = f;
      s = options_.forward(target, mended, &response);
    }
    if (s.ok() && response.seq() >= batch.back().seq()) {
      done.push_back(backup);
      continue;
    }
    if (s.ok()) {  // further behind than the last forward mends: the whole slot, as to a spare
      absl::MutexLock lock(&job.mu);
      job.replica->needs_copy.push_back(backup);
      continue;
    }
    if (s.code() == absl::StatusCode::kAborted) {  // refused: another shard leads the slot now
      absl::MutexLock lock(&job.mu);
      SlotReplica& rep = *job.replica;
      if (rep.leader != static_cast<int64_t>(job.self)) {  // handed back meanwhile (a spare caught up)
        return absl::AbortedError(absl::StrCat("slot ", slot, " is led by shard ", rep.leader, " now"));
      }
      if (rep.fenced.empty()) {
        rep.fenced = absl::StrCat("backup shard ", backup, " refused this shard's forward: ", s.message());
        rep.fenced_by_refusal = true;
        rep.unforwarded = true;
      }
      job.changed.SignalAll();
      return absl::AbortedError(rep.fenced);
    }
    if (!Transient(s)) return s;
    if (absl::Now() > until) {
      return absl::DeadlineExceededError(absl::StrCat("backup shard ", backup, " of slot ", slot, " of job '",
                                                      Quote(job.name), "' did not answer: ", s.message()));
    }
    // Until it answers or the coordinator declares it lost (a new routing).
    absl::SleepFor(kForwardRetry);
  }
}

void EmbeddingStore::ApplyRouting(Job& job, const Routing& routing) {
  SlotReplica& rep = *job.replica;
  if (routing.generation() <= rep.routing.generation()) return;
  if (routing.targets_size() != rep.routing.targets_size()) return;  // another layout: not this job's
  // As InitEmbeddings checks them: a hybrid job's SetWorkers reaches here
  // with no dense table to check its routing first.
  for (const std::string& t : routing.targets()) {
    if (t.empty() || t.size() > embedding_internal::kMaxTargetBytes) return;
  }
  for (const auto* set : {&routing.lost_shards(), &routing.catching_up()}) {
    for (uint32_t s : *set) {
      if (s >= static_cast<uint32_t>(routing.targets_size())) return;
    }
  }
  const int64_t self = job.self;
  const bool led = rep.leader == self && rep.fenced.empty();
  const Routing old = rep.routing;
  rep.routing = routing;
  rep.leader = LeaderOf(rep.copies, routing);
  if (!rep.fenced.empty()) {
    if (rep.fenced_by_refusal && !Lost(routing, job.self) && rep.leader >= 0) {
      // Fenced by a backup that had heard of a newer routing first (a slot
      // handed back to a spare that caught up). This routing makes it a
      // backup, from what every copy holds, as a hand-back does below: a
      // step it applied and could not forward is applied again by the
      // leader from the same updates (the workers send them there), whose
      // forward replaces those rows here. Or the leader again (the spare
      // lost meanwhile): promoted below, every live backup copied whole.
      rep.fenced.clear();
      rep.fenced_by_refusal = false;
      rep.seq = rep.acked;
      rep.queue.clear();
      rep.needs_copy.clear();
    }
  } else if (Lost(routing, job.self)) {
    rep.fenced = absl::StrCat("shard ", job.self, " of job '", Quote(job.name),
                              "' was declared lost (routing generation ", routing.generation(),
                              "): its slots are led by other shards now");
  } else if (led && rep.leader != self) {
    if (rep.leader >= 0 && In(old.catching_up(), static_cast<uint32_t>(rep.leader))) {
      // Handed back to a spare that caught up: this copy backs it up from
      // now on, from what every copy holds.
      if (rep.seq > rep.acked) rep.unforwarded = true;
      rep.seq = rep.acked;
      rep.queue.clear();
      rep.needs_copy.clear();
    } else {
      rep.fenced = absl::StrCat("slot ", job.init.shard_index(), " is led by shard ", rep.leader,
                                " from routing generation ", routing.generation());
    }
  }
  bool copy_all = false;
  if (!led && rep.leader == self && rep.fenced.empty()) {
    // Promoted: what it holds, every live copy holds (or is one forward
    // short of, which the first round mends), unless it once led and
    // stopped holding changes it never forwarded: then each live backup
    // gets the whole slot first.
    rep.acked = rep.seq;
    rep.queue.clear();
    job.released = job.steps;
    copy_all = rep.unforwarded;
    rep.unforwarded = false;
  }
  // A spare in a lost copy's place gets the whole slot from its leader.
  if (rep.leader == self && rep.fenced.empty()) {
    std::vector<uint32_t> copy;
    for (uint32_t c : rep.copies) {
      if (c == job.self || Lost(routing, c)) continue;
      if (copy_all) {
        copy.push_back(c);
        continue;
      }
      if (!In(routing.catching_up(), c)) continue;
      const bool pending = std::count(rep.needs_copy.begin(), rep.needs_copy.end(), c) > 0;
      const bool fresh = !In(old.catching_up(), c) || old.targets(static_cast<int>(c)) != routing.targets(static_cast<int>(c));
      if (pending || fresh || !led) copy.push_back(c);
    }
    rep.needs_copy = std::move(copy);
  }
  job.changed.SignalAll();
}

absl::Status EmbeddingStore::SetWorkers(const SetWorkersRequest& request) {
  std::vector<std::shared_ptr<Job>> slots;
  {
    absl::MutexLock lock(&mu_);
    bool replicated = false;
    for (auto it = jobs_.lower_bound(Key(request.job(), 0)); it != jobs_.end() && it->first.first == request.job();
         ++it) {
      slots.push_back(it->second);
      replicated = replicated || (it->second->replica != nullptr && it->second->init.attempt() == request.attempt());
    }
    if (replicated) {  // recorded with the slots taken, under one lock (ReceiveCopy)
      Told& told = routings_[request.job()];
      if (request.attempt() > told.attempt) told = Told{request.attempt(), Routing(), {}};
      if (request.attempt() == told.attempt) {
        if (request.has_routing() && request.routing().generation() > told.routing.generation()) {
          told.routing = request.routing();
        }
        if (request.seats_size() > 0) {
          told.active.clear();
          for (const auto& seat : request.seats()) told.active.push_back(seat.active() ? 1 : 0);
        }
      }
    }
  }
  bool held = false;
  absl::Status completed;  // a step SetWorkers completed: its update's error
  for (const auto& job : slots) {
    absl::MutexLock lock(&job->mu);
    if (request.attempt() != job->init.attempt()) continue;
    held = true;
    if (job->replica != nullptr && request.has_routing()) ApplyRouting(*job, request.routing());
    if (request.seats_size() != static_cast<int>(job->active.size())) continue;
    for (int r = 0; r < request.seats_size(); ++r) job->active[r] = request.seats(r).active() ? 1 : 0;
    // SYNC: a step that waited only for ranks now vacant completes, on the
    // slot's leader (a backup's sums, if any, are its old leader's). A
    // replicated slot's forward is then sent by the next step's lookups,
    // which wait for it (Lookup).
    if (job->init.consistency() == SYNC && Leads(job->self, job->replica.get())) {
      int64_t unused = 0;
      absl::Status s = CompleteSync(*job, &unused);
      if (completed.ok()) completed = s;
    }
    job->changed.SignalAll();
  }
  if (held) return completed;
  return absl::FailedPreconditionError(absl::StrCat("job '", Quote(request.job()), "' attempt ", request.attempt(),
                                                    " has no embedding tables on this shard"));
}


absl::Status EmbeddingStore::Replicate(const ReplicateEmbeddingsRequest& request,
                                       ReplicateEmbeddingsResponse* response) {
  if (request.has_copy_init() || request.copy_rows_size() > 0) return ReceiveCopy(request, response);
  const uint32_t slot = request.slot();
  auto found = FindJob(request.job(), request.attempt(), &slot);
  if (!found.ok()) return found.status();
  Job& job = **found;
  if (job.replica == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("slot ", slot, " of job '", Quote(job.name),
                                                      "' is not replicated on this shard"));
  }
  if (request.forwards_size() > kMaxForwards) {
    return Invalid(job.name, absl::StrCat(request.forwards_size(), " forwards in one request; at most ", kMaxForwards));
  }
  absl::MutexLock lock(&job.mu);
  SlotReplica& rep = *job.replica;
  if (request.generation() > rep.routing.generation()) {
    return absl::UnavailableError(absl::StrCat("shard ", job.self, " has not seen routing generation ",
                                               request.generation(), " of job '", Quote(job.name), "' yet"));
  }
  if (request.sender() == job.self || static_cast<int64_t>(request.sender()) != rep.leader) {
    return absl::AbortedError(absl::StrCat("shard ", request.sender(), " does not lead slot ", slot, " of job '",
                                           Quote(job.name), "' under routing generation ", rep.routing.generation(),
                                           " (shard ", rep.leader, " does): its forwards are refused"));
  }
  response->set_seq(rep.seq);
  // The forwards this shard lacks: consecutive, the first on top of its seq
  // (else none is applied and the answer's seq says what it holds).
  int first = 0;
  while (first < request.forwards_size() && request.forwards(first).seq() <= rep.seq) ++first;
  if (first == request.forwards_size() || request.forwards(first).seq() != rep.seq + 1) return absl::OkStatus();
  for (int k = first; k < request.forwards_size(); ++k) {
    const EmbeddingForward& f = request.forwards(k);
    if (k > first && f.seq() != request.forwards(k - 1).seq() + 1) return Invalid(job.name, "forwards out of order");
    if (f.rank() >= job.init.num_workers() || f.step() < 0 || f.step() >= kMaxStep || f.steps() < 0 ||
        f.steps() >= kMaxStep) {
      return Invalid(job.name, "a forward's rank or step is out of range");
    }
    for (const EmbeddingRowsProto& rows : f.tables()) {
      auto t = job.table_index.find(rows.table());
      if (t == job.table_index.end()) return Invalid(job.name, absl::StrCat("no embedding table '", Quote(rows.table()), "'"));
      if (absl::Status s = CheckRows(job.init, *job.tables[t->second], rows); !s.ok()) return s;
    }
  }
  for (int k = first; k < request.forwards_size(); ++k) {
    const EmbeddingForward& f = request.forwards(k);
    for (const EmbeddingRowsProto& rows : f.tables()) {
      EmbeddingTable& table = *job.tables[job.table_index.at(rows.table())];
      const size_t n = rows.ids().size() / sizeof(int64_t);
      for (size_t i = 0; i < n; ++i) {
        // A row replaced whole: applying a forward twice (a round retried
        // after a failure) leaves what applying it once does.
        absl::Status s = table.InsertRow({Packed<int64_t>(rows.ids())[i],
                                          Packed<float>(rows.values()) + i * table.dim(),
                                          Packed<float>(rows.slots()) + i * table.slot_floats(),
                                          Packed<int64_t>(rows.last_steps())[i], Packed<uint32_t>(rows.counts())[i]});
        if (!s.ok()) return s;
      }
    }
    if (job.init.consistency() == SYNC) {
      if (f.steps() > job.steps) {
        job.steps = job.released = f.steps();
        job.max_step = f.steps() - 1;
        for (auto& table : job.tables) table->EvictExpired(job.max_step);
        // Sums this copy gathered while it led (a hand-back mid-step) are
        // the new leader's now.
        for (auto& p : job.pending) p = embedding_internal::Pending();
        std::fill(job.pending_ranks.begin(), job.pending_ranks.end(), 0);
        if (options_.budget != nullptr) options_.budget->Release(job.pending_bytes);
        job.pending_bytes = 0;
      }
    } else {
      job.claimed[f.rank()] = std::max(job.claimed[f.rank()], f.step() + 1);
      job.applied[f.rank()] = std::max(job.applied[f.rank()], f.step() + 1);
      if (f.step() > job.max_step) {
        job.max_step = f.step();
        for (auto& table : job.tables) table->EvictExpired(f.step());
      }
    }
    rep.seq = f.seq();
  }
  rep.last = std::make_shared<const EmbeddingForward>(request.forwards(request.forwards_size() - 1));
  response->set_seq(rep.seq);
  job.changed.SignalAll();
  return absl::OkStatus();
}

}  // namespace pstrain
