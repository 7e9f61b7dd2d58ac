// Replicated tables (issue 34, docs/replication.md): each chunk has a
// primary and R backups on other shards. The primary applies an update
// (under SYNC the step's mean, under ASYNC and SSP each push) and forwards
// the chunk's resulting state -- value, the optimizer state sets the update
// changed, version, each rank's last step -- to its backups before any
// caller sees the update: a caller of a replicated chunk waits until every
// live backup holds what it returns (Chunk::acked_*). Forwards are ordered
// and idempotent by the chunk's mutation count (seq); a backup that missed
// one asks for, and gets, a full copy.
//
// One thread (ReplicationLoop) sends the forwards: at most one in flight
// per backup, carrying every chunk that backup lacks, so updates that come
// faster than a round trip are forwarded together. When the coordinator
// declares a shard lost (a Routing of a higher generation), the first live
// copy of each chunk it led takes over and copies the chunk in full to the
// remaining backups. A backup refuses (ABORTED) a forward from a shard
// that does not lead the chunk under its routing, so a replaced primary
// that comes back never writes again: the refusal stops it leading.
#include <algorithm>
#include <cstring>
#include <new>

#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::ActiveClock;
using shard_internal::EnsureStateSet;
using shard_internal::LeaderOf;
using shard_internal::ResetStateSet;
using shard_internal::TakeSpare;

namespace {

constexpr int kMaxTargets = 4096;
constexpr size_t kMaxTargetBytes = 256;
// Copies of a chunk: its primary and at most this many backups less one.
constexpr int kMaxCopies = 16;

bool Contains(const google::protobuf::RepeatedField<uint32_t>& set, uint32_t x) {
  return std::find(set.begin(), set.end(), x) != set.end();
}

std::vector<uint32_t> BackupsOf(const std::vector<uint32_t>& copies, const Routing& r, int64_t leader) {
  std::vector<uint32_t> out;
  for (uint32_t s : copies) {
    if (static_cast<int64_t>(s) != leader && !Contains(r.lost_shards(), s)) out.push_back(s);
  }
  return out;
}

absl::Status CheckRouting(const Routing& r) {
  if (r.targets_size() > kMaxTargets) {
    return absl::InvalidArgumentError(absl::StrCat("routing names ", r.targets_size(), " shards; at most ",
                                                   kMaxTargets));
  }
  for (const std::string& t : r.targets()) {
    if (t.empty() || t.size() > kMaxTargetBytes) {
      return absl::InvalidArgumentError(absl::StrCat("routing target '", Quote(t), "' must be 1..",
                                                     kMaxTargetBytes, " bytes (host:port)"));
    }
  }
  for (const auto* set : {&r.lost_shards(), &r.catching_up()}) {
    if (set->size() > r.targets_size()) return absl::InvalidArgumentError("routing lists more shards than it has");
    for (uint32_t s : *set) {
      if (s >= static_cast<uint32_t>(r.targets_size())) {
        return absl::InvalidArgumentError(absl::StrCat("routing names shard ", s, " of ", r.targets_size()));
      }
    }
  }
  return absl::OkStatus();
}


// Appends `chunk`'s state after an update to a forward, for a backup that
// holds its seq `base` (-1: a full copy): the value, shared (never written
// in place), and copies of the optimizer state sets changed since (updated
// in place: copied under the chunk's lock, which the caller holds). False
// when out of memory.
bool AppendForward(const ShardStore::Chunk& chunk, int64_t base, ReplicateRequest* request,
                   std::vector<TensorBuffer>* tensors, uint64_t* bytes) {
  ReplicatedChunk* out = request->add_chunks();
  out->set_key(chunk.key);
  out->set_seq(chunk.seq);
  out->set_base_seq(base);
  out->set_version(chunk.version.load(std::memory_order_relaxed));
  *out->mutable_last_step() = {chunk.last_step.begin(), chunk.last_step.end()};
  *out->mutable_vacant_at_version() = {chunk.vacant_at_version.begin(), chunk.vacant_at_version.end()};
  tensors->push_back(chunk.value);
  *bytes += chunk.value.nbytes;
  for (size_t k = 0; k < chunk.state.size(); ++k) {
    const bool changed = k < chunk.set_seq.size() && chunk.set_seq[k] > base;
    if (chunk.state[k].empty() || (base >= 0 && !changed)) continue;
    ReplicatedChunk::StateSet* set = out->add_sets();
    set->set_index(static_cast<uint32_t>(k));
    set->set_optimizer_step(chunk.optimizer_step[k]);
    for (const TensorBuffer& slot : chunk.state[k]) {
      absl::StatusOr<TensorBuffer> copy = shard_internal::CopyBuffer(slot);
      if (!copy.ok()) return false;
      tensors->push_back(std::move(*copy));
      *bytes += slot.nbytes;
    }
  }
  return true;
}

}  // namespace

namespace shard_internal {

int64_t LeaderOf(const std::vector<uint32_t>& copies, const Routing& r) {
  for (uint32_t s : copies) {
    if (!Contains(r.lost_shards(), s) && !Contains(r.catching_up(), s)) return s;
  }
  return -1;
}

absl::Status ValidateRouting(const Routing& routing, int targets) {
  if (routing.targets_size() != targets) {
    return absl::InvalidArgumentError(absl::StrCat("the routing names ", routing.targets_size(),
                                                   " shards; the table was made with ", targets));
  }
  return CheckRouting(routing);
}

void MarkChanged(ShardStore::Chunk& c, int set) {
  ++c.seq;
  if (set < 0) return;
  if (c.set_seq.size() < c.state.size()) c.set_seq.resize(c.state.size(), 0);
  c.set_seq[set] = c.seq;
}

}  // namespace shard_internal

template <typename Request>
absl::Status ShardStore::SetUpReplica(Table& table, const Request& request) {
  if (request.copies_size() == 0) {
    if (request.has_routing()) return absl::InvalidArgumentError("a routing without copies");
    return absl::OkStatus();
  }
  if (!options_.forward) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " cannot forward to other shards: replicated tables "
                     "need a server that can (pstrain-ps)"));
  }
  if (request.copies_size() != request.keys_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.copies_size(), " copy lists for ", request.keys_size(), " keys: give one per key"));
  }
  const Routing& r = request.routing();
  if (absl::Status s = CheckRouting(r); !s.ok()) return s;
  const uint32_t shards = static_cast<uint32_t>(r.targets_size());
  if (request.shard() >= shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", request.shard(), " is not among the routing's ",
                                                   shards, " targets"));
  }
  auto replica = std::make_unique<Table::Replica>();
  replica->self = request.shard();
  for (int i = 0; i < request.copies_size(); ++i) {
    const auto& shards_of = request.copies(i).shards();
    std::vector<uint32_t> copies(shards_of.begin(), shards_of.end());
    std::vector<uint32_t> sorted = copies;
    std::sort(sorted.begin(), sorted.end());
    const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    if (copies.empty() || copies.size() > kMaxCopies || !distinct || sorted.back() >= shards ||
        !std::binary_search(sorted.begin(), sorted.end(), request.shard())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "copies of key '", Quote(request.keys(i)), "' must be 1..", kMaxCopies,
          " distinct shards of the routing's ", shards, ", this shard (", request.shard(), ") among them"));
    }
    replica->copies.push_back(std::move(copies));
  }
  table.replica = std::move(replica);
  return absl::OkStatus();
}

template absl::Status ShardStore::SetUpReplica<InitTableRequest>(Table&, const InitTableRequest&);
template absl::Status ShardStore::SetUpReplica<LoadTableRequest>(Table&, const LoadTableRequest&);

void ShardStore::ApplyRouting(const std::shared_ptr<Table>& table, const Routing& routing) {
  Table::Replica& rep = *table->replica;
  std::string fenced;
  {
    absl::MutexLock lock(&rep.mu);
    const bool initial = rep.backups.empty();
    if (!initial && routing.generation() <= rep.routing.generation()) return;
    if (!initial && routing.targets_size() != rep.routing.targets_size()) return;  // another job's layout
    const Routing old = rep.routing;
    rep.routing = routing;
    if (Contains(routing.lost_shards(), rep.self) && rep.fenced.empty()) {
      rep.fenced = absl::StrCat("shard ", rep.self, " of job '", Quote(table->job),
                                "' was declared lost (routing generation ", routing.generation(),
                                "): its chunks are led by other shards now");
      fenced = rep.fenced;
    }
    const size_t n = table->chunks.size();
    rep.backups.assign(n, {});
    std::map<uint32_t, Table::Peer> peers;
    for (size_t c = 0; c < n; ++c) {
      Chunk& chunk = *table->chunks[c];
      const int64_t leader = LeaderOf(rep.copies[c], routing);
      const bool led = leader == static_cast<int64_t>(rep.self) && rep.fenced.empty();
      const bool was_led = !initial && LeaderOf(rep.copies[c], old) == static_cast<int64_t>(rep.self);
      const std::vector<uint32_t> old_backups = initial ? std::vector<uint32_t>()
                                                        : BackupsOf(rep.copies[c], old, static_cast<int64_t>(rep.self));
      if (led) rep.backups[c] = BackupsOf(rep.copies[c], routing, leader);
      for (uint32_t b : rep.backups[c]) {
        Table::Peer& peer = peers[b];
        if (peer.acked_seq.empty()) {
          auto it = rep.peers.find(b);
          if (it != rep.peers.end()) {
            peer = it->second;
          } else {
            peer.acked_seq.assign(n, 0);  // chunks it does not back up are never read
            peer.acked_version.assign(n, 0);
          }
        }
        const bool kept = was_led && std::count(old_backups.begin(), old_backups.end(), b) > 0;
        if (initial && !Contains(routing.catching_up(), b)) {
          // Every copy was made by InitTable from the same values, or by
          // LoadTable from the same files (a spare catching up was not: it
          // gets a full copy, below).
          peer.acked_seq[c] = chunk.seq;
          peer.acked_version[c] = chunk.version.load(std::memory_order_acquire);
        } else if (initial) {
          peer.acked_seq[c] = -1;
        } else if (!kept || (Contains(routing.catching_up(), b) && !Contains(old.catching_up(), b))) {
          peer.acked_seq[c] = -1;  // a new backup of this chunk, or one that came back empty
        }
      }
      if (!led && chunk.led.load(std::memory_order_relaxed) && fenced.empty()) {
        fenced = absl::StrCat("key '", Quote(chunk.key), "' is led by shard ", leader, " from routing generation ",
                              routing.generation(), ", not by this one (", rep.self, ")");
      }
      chunk.led.store(led, std::memory_order_release);
      if (led) rep.fenced_chunks.erase(c);
      chunk.awaits_ack.store(led && !rep.backups[c].empty(), std::memory_order_release);
    }
    rep.peers = std::move(peers);
    // Each led chunk's acked seq: what its slowest live backup holds.
    for (size_t c = 0; c < n; ++c) {
      int64_t seq = INT64_MAX, version = INT64_MAX;
      for (uint32_t b : rep.backups[c]) {
        seq = std::min(seq, rep.peers[b].acked_seq[c]);
        version = std::min(version, rep.peers[b].acked_version[c]);
      }
      table->chunks[c]->acked_seq.store(seq == INT64_MAX ? 0 : seq, std::memory_order_release);
      table->chunks[c]->acked_version.store(version == INT64_MAX ? 0 : version, std::memory_order_release);
    }
  }
  if (!fenced.empty()) AbortWaiters(table, fenced);
  NotifyWaiters();
  KickReplication();
}

absl::Status ShardStore::CheckLeads(const Table& table, const std::vector<size_t>& chunks) const {
  if (table.replica == nullptr) return absl::OkStatus();
  for (size_t c : chunks) {
    const Chunk& chunk = *table.chunks[c];
    if (chunk.led.load(std::memory_order_acquire)) continue;
    Table::Replica& rep = *table.replica;
    absl::MutexLock lock(&rep.mu);
    if (!rep.fenced.empty()) return absl::AbortedError(rep.fenced);
    if (auto it = rep.fenced_chunks.find(c); it != rep.fenced_chunks.end()) return absl::AbortedError(it->second);
    const int64_t leader = LeaderOf(rep.copies[c], rep.routing);
    return absl::FailedPreconditionError(absl::StrCat(
        "key '", Quote(chunk.key), "' of job '", Quote(table.job), "' is led by shard ", leader,
        " at routing generation ", rep.routing.generation(), ", not by this one (", rep.self,
        "): the caller's routing is out of date"));
  }
  return absl::OkStatus();
}

void ShardStore::FillReplicationStats(const Table& t, ReplicationStats* r) const {
  {
    absl::MutexLock lock(&t.replica->mu);
    r->set_generation(t.replica->routing.generation());
    r->set_fenced(!t.replica->fenced.empty() || !t.replica->fenced_chunks.empty());
    for (const auto& [b, peer] : t.replica->peers) {
      for (size_t c = 0; c < t.chunks.size(); ++c) {
        const auto& backups = t.replica->backups[c];
        if (peer.acked_seq[c] < 0 && std::find(backups.begin(), backups.end(), b) != backups.end()) {
          r->add_copying_to(b);
          break;
        }
      }
    }
    for (const auto& c : t.chunks) {
      if (!c->led.load()) continue;
      r->set_chunks_led(r->chunks_led() + 1);
      if (!c->awaits_ack.load()) continue;
      std::lock_guard<std::mutex> chunk_lock(c->mu);
      r->set_unacked_seqs(r->unacked_seqs() + std::max<int64_t>(0, c->seq - c->acked_seq.load()));
    }
  }
  r->set_forwards(t.replica->forwards.load());
  r->set_forward_bytes(t.replica->forward_bytes.load());
  r->set_forward_failures(t.replica->forward_failures.load());
  r->set_chunks_applied(t.replica->chunks_applied.load());
}

void ShardStore::KickReplication() {
  absl::MutexLock lock(&repl_mu_);
  repl_kicked_ = true;
}

void ShardStore::ReplicationLoop() {
  while (true) {
    {
      absl::MutexLock lock(&repl_mu_);
      // Woken by a kick, or every 20 ms to retry a backup that failed.
      repl_mu_.AwaitWithTimeout(absl::Condition(
                                    +[](ShardStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->repl_mu_) {
                                      return s->repl_kicked_ || s->repl_stop_;
                                    },
                                    this),
                                absl::Milliseconds(20));
      if (repl_stop_) return;
      repl_kicked_ = false;
    }
    std::vector<std::shared_ptr<Table>> tables;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [job, t] : tables_) {
        if (t->replica != nullptr) tables.push_back(t);
      }
    }
    for (const auto& t : tables) {
      std::vector<uint32_t> peers;
      {
        absl::MutexLock lock(&t->replica->mu);
        for (const auto& [b, peer] : t->replica->peers) peers.push_back(b);
      }
      for (uint32_t b : peers) StartForward(t, b);
    }
  }
}

bool ShardStore::StartForward(const std::shared_ptr<Table>& table, uint32_t peer_index) {
  Table::Replica& rep = *table->replica;
  struct Sent {
    size_t chunk;
    int64_t seq, version;
  };
  struct Call {
    ReplicateRequest request;
    ReplicateResponse response;
    std::vector<TensorBuffer> tensors;
    std::vector<Sent> sent;
  };
  auto call = std::make_shared<Call>();
  std::string target;
  uint64_t bytes = 0;
  {
    absl::MutexLock lock(&rep.mu);
    auto it = rep.peers.find(peer_index);
    if (it == rep.peers.end() || !rep.fenced.empty()) return false;
    Table::Peer& peer = it->second;
    if (peer.in_flight || peer.next_try > absl::Now()) return false;
    call->request.set_job(table->job);
    call->request.set_attempt(table->attempt);
    call->request.set_generation(rep.routing.generation());
    call->request.set_from_shard(rep.self);
    for (size_t c = 0; c < table->chunks.size() && bytes < options_.max_forward_bytes; ++c) {
      const auto& backups = rep.backups[c];
      if (std::find(backups.begin(), backups.end(), peer_index) == backups.end()) continue;
      Chunk& chunk = *table->chunks[c];
      std::lock_guard<std::mutex> chunk_lock(chunk.mu);
      const int64_t base = peer.acked_seq[c];
      if (chunk.seq <= base) continue;
      if (!AppendForward(chunk, base, &call->request, &call->tensors, &bytes)) return false;  // out of memory: next kick
      call->sent.push_back({c, chunk.seq, chunk.version.load(std::memory_order_relaxed)});
    }
    if (call->sent.empty()) return false;
    peer.in_flight = true;
    target = rep.routing.targets(static_cast<int>(peer_index));
  }
  ++rep.forwards;
  rep.forward_bytes += bytes;
  options_.forward(target, call->request, call->tensors, &call->response, [this, table, peer_index,
                                                                           call](absl::Status s) {
    Table::Replica& rep = *table->replica;
    std::string fenced;
    {
      absl::MutexLock lock(&rep.mu);
      auto it = rep.peers.find(peer_index);
      if (it == rep.peers.end()) return;  // no longer a backup (routing changed): nothing to record
      Table::Peer& peer = it->second;
      peer.in_flight = false;
      if (s.ok() && call->response.seqs_size() != static_cast<int>(call->sent.size())) {
        s = absl::InternalError("the backup answered for another number of chunks");
      }
      if (s.ok()) {
        peer.failures = 0;
        peer.next_try = absl::InfinitePast();
        for (size_t i = 0; i < call->sent.size(); ++i) {
          const Sent& sent = call->sent[i];
          if (call->response.seqs(static_cast<int>(i)) >= sent.seq) {
            peer.acked_seq[sent.chunk] = std::max(peer.acked_seq[sent.chunk], sent.seq);
            peer.acked_version[sent.chunk] = std::max(peer.acked_version[sent.chunk], sent.version);
          } else {
            peer.acked_seq[sent.chunk] = -1;  // it lacked an earlier update: a full copy next
          }
        }
      } else if (s.code() == absl::StatusCode::kAborted && call->request.generation() < rep.routing.generation()) {
        // Refused under a routing this shard has left behind since it sent
        // the forward (a chunk handed back to a spare that caught up): the
        // new routing already says which chunks it leads, and the next
        // forward is built by it. Fencing here would stop it leading chunks
        // that are its own under that routing, for good.
      } else if (s.code() == absl::StatusCode::kAborted) {
        // The backup holds a newer routing in which this shard no longer
        // leads these chunks: stop serving them before anyone sees an
        // unreplicated update (the callers retry at the new primary).
        fenced = absl::StrCat("shard ", rep.self, " of job '", Quote(table->job),
                              "' was replaced as a primary: ", s.message());
        for (const Sent& sent : call->sent) {
          table->chunks[sent.chunk]->led.store(false, std::memory_order_release);
          rep.fenced_chunks[sent.chunk] = fenced;
        }
      } else {
        ++rep.forward_failures;
        peer.failures = std::min(peer.failures + 1, 6);
        peer.next_try = absl::Now() + absl::Milliseconds(25) * (1 << peer.failures);
      }
      for (const Sent& sent : call->sent) {
        int64_t seq = INT64_MAX, version = INT64_MAX;
        for (uint32_t b : rep.backups[sent.chunk]) {
          seq = std::min(seq, rep.peers[b].acked_seq[sent.chunk]);
          version = std::min(version, rep.peers[b].acked_version[sent.chunk]);
        }
        if (seq == INT64_MAX) continue;
        Chunk& chunk = *table->chunks[sent.chunk];
        chunk.acked_seq.store(seq, std::memory_order_release);
        chunk.acked_version.store(version, std::memory_order_release);
      }
    }
    if (!fenced.empty()) AbortWaiters(table, fenced);
    NotifyWaiters();
    KickReplication();
  });
  return true;
}

}  // namespace pstrain
