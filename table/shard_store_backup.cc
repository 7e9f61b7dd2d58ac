// Replicated tables, the backup's side (issue 34, docs/replication.md):
// applying a primary's forward. A forward is checked whole before any chunk
// changes, applied in order and at most once per chunk (its seq), and only
// from the chunk's leader under this shard's routing -- a replaced primary
// is refused (ABORTED), which fences it (shard_store_replication.cc).
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

// dst (a chunk's buffer of src's size) = src, which may be in pieces.
void CopyInto(const TensorBuffer& src, TensorBuffer& dst) {
  uint8_t* d = dst.MutableData();
  ForEachRun(src, 1, [d](size_t first, const uint8_t* p, size_t n) { std::memcpy(d + first, p, n); });
}

}  // namespace

absl::StatusOr<std::vector<size_t>> ShardStore::CheckForward(const Table& table, const ReplicateRequest& request,
                                                             const std::vector<TensorBuffer>& tensors) const {
  const Table::Replica& rep = *table.replica;
  const uint32_t workers = table.config.num_workers();
  const int slots = OptimizerStateSlots(table.config.optimizer().kind());
  std::vector<size_t> chunks;
  size_t cursor = 0;
  for (const ReplicatedChunk& in : request.chunks()) {
    auto it = table.index.find(in.key());
    if (it == table.index.end()) {
      return absl::NotFoundError(
          absl::StrCat("key '", Quote(in.key()), "' is not in job '", Quote(table.job), "' on this shard"));
    }
    const size_t c = it->second;
    if (std::count(chunks.begin(), chunks.end(), c) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("key '", Quote(in.key()), "' appears twice"));
    }
    chunks.push_back(c);
    const Chunk& chunk = *table.chunks[c];
    const int64_t leader = LeaderOf(rep.copies[c], rep.routing);
    if (leader != static_cast<int64_t>(request.from_shard())) {
      return absl::AbortedError(absl::StrCat("key '", Quote(in.key()), "' is led by shard ", leader,
                                             " at routing generation ", rep.routing.generation(), ", not by shard ",
                                             request.from_shard()));
    }
    if (request.generation() < chunk.term) {
      // Its leader again, but it has not heard of the routing in between.
      return absl::UnavailableError(absl::StrCat("shard ", request.from_shard(),
                                                 "'s forward is of routing "
                                                 "generation ",
                                                 request.generation(), "; key '", Quote(in.key()), "' is at ",
                                                 chunk.term));
    }
    if (in.seq() < 0 || in.seq() >= kMaxStep * 64 || in.base_seq() < -1 || in.base_seq() >= in.seq() ||
        in.version() < 0 || in.version() >= kMaxStep || in.last_step_size() != static_cast<int>(workers) ||
        in.vacant_at_version_size() > static_cast<int>(workers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk '", Quote(in.key()), "': seq, version, last steps or vacant ranks out of range"));
    }
    for (uint32_t r : in.vacant_at_version()) {
      if (r >= workers) return absl::InvalidArgumentError(absl::StrCat("vacant rank ", r, " of ", workers));
    }
    const size_t needed = 1 + static_cast<size_t>(in.sets_size()) * slots;
    if (cursor + needed > tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk '", Quote(in.key()), "' lacks its tensors"));
    }
    for (const auto& set : in.sets()) {
      if (set.index() >= chunk.state.size() || set.optimizer_step() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk '", Quote(in.key()), "': state set ", set.index(), " of ", chunk.state.size()));
      }
    }
    for (size_t j = cursor; j < cursor + needed; ++j) {
      const TensorBuffer& t = tensors[j];
      if (absl::Status s = ValidateTensorBuffer(t, absl::StrCat("tensor ", j)); !s.ok()) return s;
      if (t.dtype != chunk.dtype || t.shape != chunk.shape) {
        return absl::InvalidArgumentError(absl::StrCat("chunk '", Quote(in.key()), "': a tensor of ",
                                                       DataTypeName(t.dtype), t.ShapeString(), ", not ",
                                                       DataTypeName(chunk.dtype), chunk.value.ShapeString()));
      }
    }
    cursor += needed;
  }
  if (cursor != tensors.size()) return absl::InvalidArgumentError("more tensors than the chunks need");
  return chunks;
}

absl::Status ShardStore::ApplyForward(const ReplicateRequest& request, const std::vector<TensorBuffer>& tensors,
                                      ReplicateResponse* response) {
  absl::StatusOr<std::shared_ptr<Table>> found = FindTable(request.job(), request.attempt());
  if (!found.ok()) return found.status();
  Table& table = **found;
  if (table.replica == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", Quote(table.job), "' has no replicated table on this shard"));
  }
  Table::Replica& rep = *table.replica;
  const int slots = OptimizerStateSlots(table.config.optimizer().kind());
  absl::MutexLock lock(&rep.mu);  // held while applying: the routing cannot change under it
  if (request.generation() > rep.routing.generation()) {
    return absl::UnavailableError(absl::StrCat("this shard is at routing generation ", rep.routing.generation(),
                                               ", not yet ", request.generation(),
                                               ": the coordinator's word is on its way"));
  }
  // Everything is checked before any chunk changes.
  absl::StatusOr<std::vector<size_t>> checked = CheckForward(table, request, tensors);
  if (!checked.ok()) return checked.status();
  const std::vector<size_t>& chunks = *checked;
  size_t cursor = 0;
  const std::vector<bool> active = table.Active();
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
    const bool newer =
        full ? request.generation() > c.term || in.seq() > c.seq : in.seq() > c.seq && in.base_seq() == c.seq;
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
    if (c.arrivals > 0) {
      // A SYNC step half pushed while this shard led the chunk (a primary
      // that was replaced, now a backup): the step is its leader's now;
      // its callers were failed and push it there.
      if (c.accum.nbytes > 0) std::memset(c.accum.MutableData(), 0, c.accum.nbytes);
      std::fill(c.arrived.begin(), c.arrived.end(), false);
      c.arrivals = 0;
      c.batches = 0;
      c.pending_lr = 0;
    }
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
