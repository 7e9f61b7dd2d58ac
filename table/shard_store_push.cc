// Applying a push: validated in full, then every touched chunk locked and
// its update computed beside the current value, then committed (nothing in
// the commit can fail), so a push changes all its chunks or none.
#include <cmath>
#include <new>

#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::ActiveClock;
using shard_internal::CompleteSyncStep;
using shard_internal::ComputeUpdate;
using shard_internal::EnsureStateSet;
using shard_internal::IsFinite;
using shard_internal::NewStateSet;
using shard_internal::ResetStateSet;
using shard_internal::StepComplete;
using shard_internal::TakeSpare;

namespace {

// A push is accepted from the rank's current holder only. Checked once
// before the push's validation (an early, cheap refusal) and again under its
// chunk locks: SetWorkersAsync changes a seat before it locks any chunk, so a
// seat change that came before the push took its locks is seen there, and
// a replaced holder's push never lands.
absl::Status CheckSeat(const ShardStore::Table& table, uint32_t worker, uint32_t generation) {
  absl::MutexLock lock(&table.seats_mu);
  const ShardStore::Table::Seat& seat = table.seats[worker];
  if (generation < seat.generation) {
    return absl::AbortedError(absl::StrCat("rank ", worker, " of job '", Quote(table.job),
                                           "' was taken over by another worker (generation ", seat.generation,
                                           "; this push is of generation ", generation, "): this worker was replaced"));
  }
  if (generation > seat.generation) {
    return absl::UnavailableError(absl::StrCat("rank ", worker, " of job '", Quote(table.job), "' is at generation ",
                                               seat.generation, " on this shard, not yet ", generation,
                                               ": the coordinator has not admitted this worker here yet"));
  }
  if (!seat.active) {
    return absl::AbortedError(absl::StrCat("rank ", worker, " of job '", Quote(table.job),
                                           "' was removed from the job (its worker was lost or scaled away)"));
  }
  return absl::OkStatus();
}

}  // namespace

// One push in flight, between its checks and its commit.
class ShardStore::PushTransaction {
 public:
  PushTransaction(Table& table, const PushInput& in, std::vector<size_t>& chunks)
      : table_(table),
        in_(in),
        chunks_(chunks),
        config_(table.config),
        sync_(config_.consistency() == SYNC),
        // Per-worker optimizer state under ASYNC/SSP unless shared.
        set_(shard_internal::StateSetOf(config_, in.worker)),
        skip_(chunks.size(), false),
        action_(chunks.size()),
        new_value_(chunks.size()) {
    optimizer_ = config_.optimizer();
    if (in.lr > 0) optimizer_.set_lr(in.lr);
    if (!sync_ && !config_.shared_async_state()) {
      // With per-worker state, one round of pushes from all N workers moves
      // the parameters as far as one SYNC step of the averaged gradient:
      // the job's lr means the same in every mode (and as in DDP). One set
      // per pusher: a pipelined table's key is pushed by its stage's
      // replicas only.
      optimizer_.set_lr(optimizer_.lr() / shard_internal::StateSets(config_));
    }
  }

  // Every gradient against its chunk: dtype, shape, step, finiteness.
  absl::Status Validate();
  // Under the chunks' locks: what the push does to each, with the buffers
  // and state sets it needs allocated.
  absl::Status Prepare();
  // ASYNC/SSP: the updates into the new buffers; under REJECT a
  // non-finite one undoes them all.
  absl::Status ComputeUpdates();
  void Commit(PushResponse* response, std::vector<int64_t>* seqs);

 private:
  // What the push does to a chunk: nothing (a duplicate), count an arrival
  // (SYNC), skip a non-finite gradient, install a new value, or (ASYNC/SSP)
  // count an empty push as the worker's step and change nothing.
  enum class Action { kDuplicate, kArrive, kSkip, kUpdate, kEmpty };

  Chunk& chunk(size_t i) { return *table_.chunks[chunks_[i]]; }
  absl::Status PrepareSync(size_t i);
  absl::Status PrepareAsync(size_t i);
  // The optimizer state of the chunk restarts and its new value is dropped.
  void Discard(Chunk& c, size_t k, TensorBuffer& value);
  static void Install(Chunk& c, TensorBuffer value);

  Table& table_;
  const PushInput& in_;
  std::vector<size_t>& chunks_;
  const TableConfig& config_;
  const bool sync_;
  const size_t set_;
  OptimizerConfig optimizer_;
  std::vector<bool> skip_;
  std::vector<bool> active_;  // the ranks taking part, read under the chunk locks
  std::vector<Action> action_;
  std::vector<TensorBuffer> new_value_;
};

absl::Status ShardStore::PushTransaction::Validate() {
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunk(i);
    const TensorBuffer& g = (*in_.grads)[i];
    const std::string what = absl::StrCat("gradient for key '", Quote(c.key), "'");
    absl::Status s = shard_internal::CheckStagePusher(c, in_.worker);
    if (s.ok()) s = ValidateTensorBuffer(g, what);
    if (!s.ok()) return s;
    if (g.dtype != c.dtype || g.shape != c.shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is ", DataTypeName(g.dtype), g.ShapeString(),
                                                     " but the parameter is ", DataTypeName(c.dtype),
                                                     c.value.ShapeString()));
    }
    const int64_t version = c.version.load(std::memory_order_acquire);
    if (sync_ && in_.step > version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", Quote(c.key), "' is at step ", version, " but worker ", in_.worker, " pushed step ", in_.step,
          "; under SYNC a worker pulls step t's result before pushing step t+1"));
    }
    if (in_.step > version + kMaxStepAhead) {
      return absl::InvalidArgumentError(absl::StrCat("step ", in_.step, " of worker ", in_.worker, " is more than ",
                                                     kMaxStepAhead, " steps ahead of key '", Quote(c.key),
                                                     "' (version ", version, ")"));
    }
    // An empty push's gradients are not looked at (an fp16 step skipped for
    // an overflow sends them as they are).
    if (!in_.empty && !IsFinite(g)) {
      if (config_.nonfinite() == NONFINITE_REJECT) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " from worker ", in_.worker, " at step ", in_.step,
            " has NaN or Inf; nothing in this push was applied (lower the learning rate, clip "
            "gradients, or set the table's nonfinite policy to SKIP)"));
      }
      skip_[i] = true;
    }
  }
  return absl::OkStatus();
}

absl::Status ShardStore::PushTransaction::PrepareSync(size_t i) {
  Chunk& c = chunk(i);
  // Versions only grow, so Validate's check still holds: step <= version.
  if (in_.step != c.version.load(std::memory_order_relaxed) || c.arrived[in_.worker]) {
    action_[i] = Action::kDuplicate;
    return absl::OkStatus();
  }
  action_[i] = Action::kArrive;
  if (!StepComplete(c, active_, static_cast<int>(in_.worker))) return absl::OkStatus();
  // This push completes the step: the update of the mean is computed at
  // commit (it cannot be refused: the step is over either way).
  absl::Status s = EnsureStateSet(c, 0, optimizer_);
  if (!s.ok()) return s;
  absl::StatusOr<TensorBuffer> out = TakeSpare(c);
  if (!out.ok()) return out.status();
  new_value_[i] = std::move(*out);
  return absl::OkStatus();
}

absl::Status ShardStore::PushTransaction::PrepareAsync(size_t i) {
  Chunk& c = chunk(i);
  if (in_.step <= c.last_step[in_.worker]) {
    action_[i] = Action::kDuplicate;
    return absl::OkStatus();
  }
  if (in_.empty) {
    action_[i] = Action::kEmpty;
    return absl::OkStatus();
  }
  if (skip_[i]) {
    action_[i] = Action::kSkip;
    return absl::OkStatus();
  }
  absl::Status s = EnsureStateSet(c, set_, optimizer_);
  if (!s.ok()) return s;
  absl::StatusOr<TensorBuffer> out = TakeSpare(c);
  if (!out.ok()) return out.status();
  new_value_[i] = std::move(*out);
  action_[i] = Action::kUpdate;
  return absl::OkStatus();
}

absl::Status ShardStore::PushTransaction::Prepare() {
  active_ = table_.Active();
  try {
    for (size_t i = 0; i < chunks_.size(); ++i) {
      absl::Status s = sync_ ? PrepareSync(i) : PrepareAsync(i);
      if (!s.ok()) return s;
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while applying a push; nothing was applied");
  }
  return absl::OkStatus();
}

void ShardStore::PushTransaction::Discard(Chunk& c, size_t k, TensorBuffer& value) {
  ResetStateSet(optimizer_, c.state[k]);
  c.optimizer_step[k] = 0;
  shard_internal::MarkChanged(c, static_cast<int>(k));
  c.spare = std::move(value);
}

absl::Status ShardStore::PushTransaction::ComputeUpdates() {
  // One that is not finite is never installed and its optimizer state
  // restarts (it may hold Inf); under REJECT no value of the push changes
  // and the state of every chunk it touched restarts.
  for (size_t i = 0; i < chunks_.size() && !sync_; ++i) {
    if (action_[i] != Action::kUpdate) continue;
    Chunk& c = chunk(i);
    if (ComputeUpdate(optimizer_, c.optimizer_step[set_] + 1, c.value, (*in_.grads)[i], c.state[set_], 1.0,
                      &new_value_[i])) {
      continue;
    }
    ++table_.updates_nonfinite;
    Discard(c, set_, new_value_[i]);
    action_[i] = Action::kSkip;
    if (config_.nonfinite() != NONFINITE_REJECT) continue;
    for (size_t j = 0; j < i; ++j) {
      if (action_[j] == Action::kUpdate) Discard(chunk(j), set_, new_value_[j]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the update of key '", Quote(c.key), "' by worker ", in_.worker, " at step ", in_.step,
        " is not finite (gradient too large for the learning rate); no value of this push was applied"));
  }
  return absl::OkStatus();
}

void ShardStore::PushTransaction::Install(Chunk& c, TensorBuffer value) {
  TensorBuffer old = std::move(c.value);
  c.value = std::move(value);
  if (old.owner.use_count() == 1) c.spare = std::move(old);  // else a reader still has it
}

void ShardStore::PushTransaction::Commit(PushResponse* response, std::vector<int64_t>* seqs) {
  uint32_t applied = 0, duplicates = 0, skipped = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = chunk(i);
    const TensorBuffer& g = (*in_.grads)[i];
    switch (action_[i]) {
      case Action::kDuplicate:
        ++duplicates;
        break;
      case Action::kArrive:
        c.arrived[in_.worker] = true;
        ++c.arrivals;
        c.last_step[in_.worker] = in_.step;
        c.pending_lr = in_.lr;
        if (in_.empty) {
          // An arrival without a batch: nothing added, nothing counted.
        } else if (skip_[i]) {
          c.batches += 1 + in_.extra_batches;
          ++skipped;  // counts as this worker's (empty) contribution
        } else {
          if (c.dtype == DT_FLOAT32) {
            shard_internal::AddInto<float>(c.accum.MutableData(), g);
          } else {
            shard_internal::AddInto<double>(c.accum.MutableData(), g);
          }
          c.batches += 1 + in_.extra_batches;
          ++applied;
          bytes += g.nbytes;
        }
        if (StepComplete(c, active_)) CompleteSyncStep(table_, c, new_value_[i], active_);
        break;
      case Action::kSkip:
        ++skipped;
        c.last_step[in_.worker] = in_.step;
        break;
      case Action::kEmpty:
        c.last_step[in_.worker] = in_.step;
        break;
      case Action::kUpdate:
        Install(c, std::move(new_value_[i]));
        ++c.optimizer_step[set_];
        c.last_step[in_.worker] = in_.step;
        c.version.fetch_add(1, std::memory_order_release);
        ++applied;
        bytes += g.nbytes;
        break;
    }
    // For the backups: an update, and a rank's step counted without one.
    // A SYNC arrival is not (the step's arrivals are pushed again after a
    // failover); the step it completes marked its state set itself.
    if (action_[i] == Action::kUpdate) {
      shard_internal::MarkChanged(c, OptimizerUsesState(optimizer_) ? static_cast<int>(set_) : -1);
    } else if (action_[i] == Action::kSkip || action_[i] == Action::kEmpty) {
      shard_internal::MarkChanged(c);
    }
    if (!sync_ && action_[i] != Action::kDuplicate) c.clock.store(ActiveClock(c, active_), std::memory_order_release);
    response->add_versions(c.version.load(std::memory_order_relaxed));
    if (seqs != nullptr) seqs->push_back(c.seq);
  }
  response->set_applied(applied);
  response->set_duplicates(duplicates);
  response->set_skipped_nonfinite(skipped);
  table_.pushes_applied += applied;
  table_.pushes_duplicate += duplicates;
  table_.grads_skipped += skipped;
  table_.bytes_pushed += bytes;
}

absl::Status ShardStore::ApplyPush(Table& table, const PushInput& in, std::vector<size_t>* chunks,
                                   PushResponse* response, std::vector<int64_t>* seqs) {
  const TableConfig& config = table.config;
  response->Clear();
  if (static_cast<size_t>(in.keys->size()) != in.grads->size()) {
    return absl::InvalidArgumentError(absl::StrCat(in.keys->size(), " keys but ", in.grads->size(), " gradients"));
  }
  if (in.worker >= config.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", in.worker, " is out of range: job '", Quote(table.job),
                                                   "' has ", config.num_workers(), " workers (0..",
                                                   config.num_workers() - 1, ")"));
  }
  if (absl::Status seat = CheckSeat(table, in.worker, in.generation); !seat.ok()) return seat;
  if (in.extra_batches >= config.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("extra_batches ", in.extra_batches, " of worker ", in.worker,
                                                   ": a push covers at most the job's other ",
                                                   config.num_workers() - 1, " ranks"));
  }
  if (in.extra_batches > 0 && config.consistency() != SYNC) {
    return absl::InvalidArgumentError("extra_batches is for SYNC tables (covering vacant ranks)");
  }
  if (in.step < 0 || in.step >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", in.step, " is out of range [0, 2^40)"));
  }
  if (!(in.lr >= 0) || !std::isfinite(in.lr) || in.lr > 100) {
    return absl::InvalidArgumentError("lr must be a number in [0, 100] (0: the table's)");
  }
  absl::StatusOr<std::vector<size_t>> resolved = ResolveKeys(table, *in.keys);
  if (!resolved.ok()) return resolved.status();
  *chunks = std::move(*resolved);
  if (absl::Status leads = CheckLeads(table, *chunks); !leads.ok()) return leads;
  PushTransaction push(table, in, *chunks);
  // Validate everything before touching anything.
  absl::Status s = push.Validate();
  if (!s.ok()) return s;
  // Every chunk of the push is locked (ascending index: no deadlock with
  // another push) while its updates are computed, checked and committed.
  // New values are written beside the current ones (a spare buffer) and
  // swapped in only if every update of the push is finite: values change
  // all together or not at all.
  std::vector<size_t> order(*chunks);
  std::sort(order.begin(), order.end());
  if (options_.before_push_locks) options_.before_push_locks(in.job, in.worker, in.generation);
  std::vector<std::unique_lock<std::mutex>> locks;  // why std::mutex: Chunk::mu
  locks.reserve(order.size());
  for (size_t c : order) locks.emplace_back(table.chunks[c]->mu);
  // Lock order: the chunks, then seats_mu (in CheckSeat and Prepare).
  s = CheckSeat(table, in.worker, in.generation);
  if (s.ok()) s = push.Prepare();
  if (s.ok()) s = push.ComputeUpdates();
  if (!s.ok()) return s;
  push.Commit(response, seqs);  // nothing in it can fail
  return absl::OkStatus();
}

}  // namespace pstrain
