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

// The chunk's leader under `r`: its first copy that is neither lost nor
// catching up (a shard that came back empty); -1 if none is left.
int64_t LeaderOf(const std::vector<uint32_t>& copies, const Routing& r) {
  for (uint32_t s : copies) {
    if (!Contains(r.lost_shards(), s) && !Contains(r.catching_up(), s)) return s;
  }
  return -1;
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

// dst (a chunk's buffer of src's size) = src, which may be in pieces.
void CopyInto(const TensorBuffer& src, TensorBuffer& dst) {
  uint8_t* d = dst.MutableData();
  ForEachRun(src, 1, [d](size_t first, const uint8_t* p, size_t n) { std::memcpy(d + first, p, n); });
}

}  // namespace

namespace shard_internal {

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

absl::Status ShardStore::SetUpReplica(Table& table, const InitTableRequest& request) {
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
        if (initial) {
          // Every copy was made by InitTable from the same values.
          peer.acked_seq[c] = 0;
          peer.acked_version[c] = 0;
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
      ReplicatedChunk* out = call->request.add_chunks();
      out->set_key(chunk.key);
      out->set_seq(chunk.seq);
      out->set_base_seq(base);
      out->set_version(chunk.version.load(std::memory_order_relaxed));
      *out->mutable_last_step() = {chunk.last_step.begin(), chunk.last_step.end()};
      *out->mutable_vacant_at_version() = {chunk.vacant_at_version.begin(), chunk.vacant_at_version.end()};
      call->tensors.push_back(chunk.value);  // never written in place: shared
      bytes += chunk.value.nbytes;
      for (size_t k = 0; k < chunk.state.size(); ++k) {
        const bool changed = k < chunk.set_seq.size() && chunk.set_seq[k] > base;
        if (chunk.state[k].empty() || (base >= 0 && !changed)) continue;
        ReplicatedChunk::StateSet* set = out->add_sets();
        set->set_index(static_cast<uint32_t>(k));
        set->set_optimizer_step(chunk.optimizer_step[k]);
        for (const TensorBuffer& slot : chunk.state[k]) {
          // Updated in place: copied under the chunk's lock.
          absl::StatusOr<TensorBuffer> copy = shard_internal::CopyBuffer(slot);
          if (!copy.ok()) return false;  // out of memory: tried again on the next kick
          call->tensors.push_back(std::move(*copy));
          bytes += slot.nbytes;
        }
      }
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

absl::Status ShardStore::ApplyForward(const ReplicateRequest& request, const std::vector<TensorBuffer>& tensors,
                                      ReplicateResponse* response) {
  absl::StatusOr<std::shared_ptr<Table>> found = FindTable(request.job(), request.attempt());
  if (!found.ok()) return (found.status());
  Table& table = **found;
  if (table.replica == nullptr) {
    return (absl::FailedPreconditionError(
        absl::StrCat("job '", Quote(table.job), "' has no replicated table on this shard")));
  }
  Table::Replica& rep = *table.replica;
  const uint32_t workers = table.config.num_workers();
  const int slots = OptimizerStateSlots(table.config.optimizer().kind());
  absl::MutexLock lock(&rep.mu);  // held while applying: the routing cannot change under it
  if (request.generation() > rep.routing.generation()) {
    return (absl::UnavailableError(absl::StrCat("this shard is at routing generation ",
                                                    rep.routing.generation(), ", not yet ", request.generation(),
                                                    ": the coordinator's word is on its way")));
  }
  // Everything is checked before any chunk changes.
  std::vector<size_t> chunks;
  size_t cursor = 0;
  for (const ReplicatedChunk& in : request.chunks()) {
    auto it = table.index.find(in.key());
    if (it == table.index.end()) {
      return (absl::NotFoundError(absl::StrCat("key '", Quote(in.key()), "' is not in job '",
                                                   Quote(table.job), "' on this shard")));
    }
    const size_t c = it->second;
    if (std::count(chunks.begin(), chunks.end(), c) > 0) {
      return (absl::InvalidArgumentError(absl::StrCat("key '", Quote(in.key()), "' appears twice")));
    }
    chunks.push_back(c);
    const Chunk& chunk = *table.chunks[c];
    const int64_t leader = LeaderOf(rep.copies[c], rep.routing);
    if (leader != static_cast<int64_t>(request.from_shard())) {
      return (absl::AbortedError(absl::StrCat("key '", Quote(in.key()), "' is led by shard ", leader,
                                                  " at routing generation ", rep.routing.generation(),
                                                  ", not by shard ", request.from_shard())));
    }
    if (request.generation() < chunk.term) {
      // Its leader again, but it has not heard of the routing in between.
      return (absl::UnavailableError(absl::StrCat("shard ", request.from_shard(), "'s forward is of routing "
                                                      "generation ", request.generation(), "; key '",
                                                      Quote(in.key()), "' is at ", chunk.term)));
    }
    if (in.seq() < 0 || in.seq() >= kMaxStep * 64 || in.base_seq() < -1 || in.base_seq() >= in.seq() ||
        in.version() < 0 || in.version() >= kMaxStep || in.last_step_size() != static_cast<int>(workers) ||
        in.vacant_at_version_size() > static_cast<int>(workers)) {
      return (absl::InvalidArgumentError(absl::StrCat("chunk '", Quote(in.key()),
                                                          "': seq, version, last steps or vacant ranks out of range")));
    }
    for (uint32_t r : in.vacant_at_version()) {
      if (r >= workers) return (absl::InvalidArgumentError(absl::StrCat("vacant rank ", r, " of ", workers)));
    }
    const size_t needed = 1 + static_cast<size_t>(in.sets_size()) * slots;
    if (cursor + needed > tensors.size()) {
      return (absl::InvalidArgumentError(absl::StrCat("chunk '", Quote(in.key()), "' lacks its tensors")));
    }
    for (const auto& set : in.sets()) {
      if (set.index() >= chunk.state.size() || set.optimizer_step() < 0) {
        return (absl::InvalidArgumentError(absl::StrCat("chunk '", Quote(in.key()), "': state set ",
                                                            set.index(), " of ", chunk.state.size())));
      }
    }
    for (size_t j = cursor; j < cursor + needed; ++j) {
      const TensorBuffer& t = tensors[j];
      if (absl::Status s = ValidateTensorBuffer(t, absl::StrCat("tensor ", j)); !s.ok()) return (s);
      if (t.dtype != chunk.dtype || t.shape != chunk.shape) {
        return (absl::InvalidArgumentError(absl::StrCat("chunk '", Quote(in.key()), "': a tensor of ",
                                                            DataTypeName(t.dtype), t.ShapeString(), ", not ",
                                                            DataTypeName(chunk.dtype), chunk.value.ShapeString())));
      }
    }
    cursor += needed;
  }
  if (cursor != tensors.size()) return (absl::InvalidArgumentError("more tensors than the chunks need"));

  const std::vector<bool> active = table.Active();
  cursor = 0;
  absl::Status status;
  for (int i = 0; i < request.chunks_size(); ++i) {
    const ReplicatedChunk& in = request.chunks(i);
    Chunk& c = *table.chunks[chunks[i]];
    const size_t first = cursor;
    cursor += 1 + static_cast<size_t>(in.sets_size()) * slots;
    std::lock_guard<std::mutex> chunk_lock(c.mu);
    // Idempotent (an older or equal seq is already here) and in order (a
    // forward built on a state this backup lacks is not applied: the
    // primary sends a full copy next).
    const bool full = in.base_seq() < 0;
    const bool newer = full ? request.generation() > c.term || in.seq() > c.seq
                            : in.seq() > c.seq && in.base_seq() == c.seq;
    if (!status.ok() || !newer) {
      response->add_seqs(c.seq);
      continue;
    }
    try {
      absl::StatusOr<TensorBuffer> value = TakeSpare(c);
      absl::Status s = value.status();
      for (const auto& set : in.sets()) {
        if (s.ok()) s = EnsureStateSet(c, set.index(), table.config.optimizer());
      }
      if (!s.ok()) {
        status = s;
        response->add_seqs(c.seq);
        continue;
      }
      CopyInto(tensors[first], *value);
      TensorBuffer old = std::move(c.value);
      c.value = std::move(*value);
      if (old.owner.use_count() == 1) c.spare = std::move(old);
      if (full) {
        // A full copy: a set it does not carry is fresh on the primary.
        for (size_t k = 0; k < c.state.size(); ++k) {
          if (!c.state[k].empty()) ResetStateSet(table.config.optimizer(), c.state[k]);
          c.optimizer_step[k] = 0;
        }
      }
      size_t t = first + 1;
      if (c.set_seq.size() < c.state.size()) c.set_seq.resize(c.state.size(), 0);
      for (const auto& set : in.sets()) {
        for (TensorBuffer& slot : c.state[set.index()]) CopyInto(tensors[t++], slot);
        c.optimizer_step[set.index()] = set.optimizer_step();
        c.set_seq[set.index()] = in.seq();
      }
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError("out of memory while applying a forward");
      response->add_seqs(c.seq);
      continue;
    }
    c.last_step.assign(in.last_step().begin(), in.last_step().end());
    c.vacant_at_version.assign(in.vacant_at_version().begin(), in.vacant_at_version().end());
    c.seq = in.seq();
    c.term = request.generation();
    c.version.store(in.version(), std::memory_order_release);
    if (table.config.consistency() != SYNC) c.clock.store(ActiveClock(c, active), std::memory_order_release);
    ++rep.chunks_applied;
    response->add_seqs(c.seq);
  }
  return status;
}

void ShardStore::ReplicateAsync(const ReplicateRequest& request, std::vector<TensorBuffer> tensors,
                                ReplicateResponse* response, const CallOptions& /*options*/, StatusCallback done) {
  // `done` runs with no lock held: in process it is the primary's callback.
  done(ApplyForward(request, tensors, response));
}

}  // namespace pstrain
