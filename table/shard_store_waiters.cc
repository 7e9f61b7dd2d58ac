// Parked calls: a Pull with min_version, or a PushPull under SYNC or SSP,
// waits as a Waiter (never a blocked thread) until the pushes it needs
// arrive, its deadline passes (the reaper thread), its table is dropped or
// replaced, or the store shuts down; then Snapshot hands out the values
// (shared, copied into destinations, or narrowed for the wire).
#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::Unavailable;

void ShardStore::Shutdown() {
  {
    absl::MutexLock lock(&repl_mu_);
    repl_stop_ = true;
  }
  std::list<std::shared_ptr<Waiter>> waiters;
  {
    absl::MutexLock lock(&waiters_mu_);
    if (shutdown_) return;
    shutdown_ = true;
    waiters.swap(waiters_);
    waiters_cv_.SignalAll();
  }
  for (auto& w : waiters) w->ready(Unavailable());
}

void ShardStore::AbortWaiters(const std::shared_ptr<Table>& table, const std::string& why) {
  std::vector<std::shared_ptr<Waiter>> orphans;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->table == table) {
        orphans.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : orphans) w->ready(absl::AbortedError(why));
}

void ShardStore::WhenReadyAsync(std::shared_ptr<Table> table, std::vector<size_t> chunks, bool by_clock,
                                int64_t threshold, absl::Time deadline, StatusCallback ready,
                                std::vector<int64_t> ack_seqs) {
  auto w = std::make_shared<Waiter>();
  w->ack_seqs = std::move(ack_seqs);
  w->table = std::move(table);
  w->chunks = std::move(chunks);
  w->by_clock = by_clock;
  w->threshold = threshold;
  w->deadline = std::min(deadline, absl::Now() + options_.max_wait);
  w->ready = std::move(ready);
  absl::Status now;
  {
    absl::MutexLock lock(&waiters_mu_);
    // Read under waiters_mu_: a routing that takes a chunk away stores
    // `led` first and then aborts the waiters it finds (AbortWaiters).
    std::string moved = w->Moved();
    if (shutdown_) {
      now = Unavailable();
    } else if (!moved.empty()) {
      now = absl::AbortedError(moved);
    } else if (!w->Satisfied()) {
      if (waiters_.size() >= options_.max_waiters) {
        now = absl::ResourceExhaustedError(absl::StrCat("shard ", options_.shard_index, " already has ",
                                                        waiters_.size(), " waiting calls, its limit"));
      } else {
        waiters_.push_back(w);
        waiters_cv_.SignalAll();  // the reaper may need an earlier wake-up
        return;
      }
    }
  }
  w->ready(now);
}

void ShardStore::NotifyWaiters() {
  std::vector<std::shared_ptr<Waiter>> fired;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->Satisfied()) {
        fired.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : fired) w->ready(absl::OkStatus());
}

void ShardStore::ReaperLoop() {
  absl::MutexLock lock(&waiters_mu_);
  while (!shutdown_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& w : waiters_) next = std::min(next, w->deadline);
    if (next == absl::InfiniteFuture()) {
      waiters_cv_.Wait(&waiters_mu_);
    } else {
      waiters_cv_.WaitWithDeadline(&waiters_mu_, next);
    }
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Waiter>> expired;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->deadline <= now) {
        expired.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (expired.empty()) continue;
    waiters_mu_.Unlock();
    for (auto& w : expired) {
      w->ready(absl::DeadlineExceededError(absl::StrCat("deadline passed while waiting on job '",
                                                        Quote(w->table->job), "': ", w->Lagging(),
                                                        "; a worker may have died or fallen behind")));
    }
    waiters_mu_.Lock();
  }
}

void ShardStore::Snapshot(Table& table, const std::vector<size_t>& chunks, DataType value_dtype,
                          google::protobuf::RepeatedField<int64_t>* versions, std::vector<TensorBuffer>* values,
                          google::protobuf::RepeatedField<uint32_t>* vacant) {
  // Without destinations, readers share the chunk's current buffer: updates
  // always write new buffers (ApplyPush), so it never changes under them.
  // With caller-provided destinations that fit, the values are copied in.
  // Narrowed for the wire (value_dtype), each reader gets its own copy,
  // made outside the chunk's lock from the shared buffer; a destination
  // (an in-process reader) gets the values as the wire would deliver them:
  // narrowed into a destination of the wire dtype, rounded through it into
  // a float32 one.
  const bool narrow = IsNarrowFloat(value_dtype);
  bool use_destinations = !values->empty() && values->size() == chunks.size();
  for (size_t i = 0; use_destinations && i < chunks.size(); ++i) {
    const Chunk& c = *table.chunks[chunks[i]];
    const TensorBuffer& d = (*values)[i];
    use_destinations = (d.dtype == c.dtype && d.nbytes == c.value.nbytes) ||
                       (narrow && c.dtype == DT_FLOAT32 && d.dtype == value_dtype && d.nbytes * 2 == c.value.nbytes);
  }
  if (!use_destinations) values->assign(chunks.size(), TensorBuffer());
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *table.chunks[chunks[i]];
    TensorBuffer& out = (*values)[i];
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (use_destinations && narrow && c.dtype == DT_FLOAT32 && out.dtype == value_dtype) {
        NarrowElements(value_dtype, reinterpret_cast<const float*>(c.value.data), nullptr, out.nbytes / 2,
                       out.MutableData());
      } else if (use_destinations && narrow && c.dtype == DT_FLOAT32) {
        RoundThrough(value_dtype, reinterpret_cast<const float*>(c.value.data), out.nbytes / 4,
                     reinterpret_cast<float*>(out.MutableData()));
      } else if (use_destinations) {
        if (out.nbytes > 0) std::memcpy(out.MutableData(), c.value.data, out.nbytes);
      } else {
        out = c.value;
      }
      versions->Add(c.version.load(std::memory_order_relaxed));
      if (i == 0) vacant->Add(c.vacant_at_version.begin(), c.vacant_at_version.end());
    }
    if (narrow && !use_destinations && out.dtype == DT_FLOAT32) {
      absl::StatusOr<TensorBuffer> narrowed = NarrowFloat32(out, value_dtype);
      if (narrowed.ok()) out = std::move(*narrowed);  // else (no memory): sent as stored
    }
    bytes += out.nbytes;
  }
  ++table.pulls;
  table.bytes_pulled += bytes;
}

}  // namespace pstrain
