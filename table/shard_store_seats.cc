// Who holds a job's ranks (parameter-server mode): the coordinator removes a
// lost worker's rank, hands it to a replacement with a higher generation,
// or adds and removes ranks when it scales the job. A SYNC step then waits
// for the active ranks only, and SSP's clock counts them only.
#include <new>

#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::ActiveClock;
using shard_internal::CompleteSyncStep;
using shard_internal::EnsureStateSet;
using shard_internal::StepComplete;
using shard_internal::TakeSpare;
using shard_internal::ValidateRouting;

namespace {

// Completes the chunk's SYNC step if every active rank has now pushed it.
absl::Status SettleChunk(ShardStore::Table& table, ShardStore::Chunk& c, const std::vector<bool>& active) {
  if (table.config.consistency() != SYNC) {
    c.clock.store(ActiveClock(c, active), std::memory_order_release);
    return absl::OkStatus();
  }
  if (!StepComplete(c, active)) return absl::OkStatus();
  absl::Status s = EnsureStateSet(c, 0, table.config.optimizer());
  if (!s.ok()) return s;
  absl::StatusOr<TensorBuffer> value = TakeSpare(c);
  if (!value.ok()) return value.status();
  CompleteSyncStep(table, c, *value, active);
  return absl::OkStatus();
}

}  // namespace

bool ShardStore::HoldsTable(const std::string& job) {
  absl::MutexLock lock(&mu_);
  return tables_.count(job) > 0;
}

void ShardStore::SetWorkersAsync(const SetWorkersRequest& request, SetWorkersResponse* response,
                                 const CallOptions& /*options*/, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> found = FindTable(request.job(), request.attempt());
  if (!found.ok()) return done(found.status());
  Table& table = **found;
  const uint32_t n = table.config.num_workers();
  if (request.has_routing()) {
    if (table.replica == nullptr) {
      return done(absl::FailedPreconditionError(
          absl::StrCat("job '", Quote(table.job), "' has no replicated table on this shard: a routing is for one")));
    }
    absl::Status routing = ValidateRouting(request.routing(), table.replica->routing.targets_size());
    if (!routing.ok()) return done(routing);
  }
  if (static_cast<uint32_t>(request.seats_size()) != n) {
    return done(absl::InvalidArgumentError(absl::StrCat("job '", Quote(table.job), "' has ", n, " ranks; got ",
                                                        request.seats_size(), " seats")));
  }
  std::vector<bool> active(n);
  {
    absl::MutexLock lock(&table.seats_mu);
    for (uint32_t r = 0; r < n; ++r) {
      const WorkerSeat& want = request.seats(static_cast<int>(r));
      Table::Seat& seat = table.seats[r];
      if (want.generation() >= seat.generation) seat = {want.active(), want.generation()};
      active[r] = seat.active;
    }
  }
  std::vector<int64_t> last(n, INT64_MAX);
  int64_t min_version = INT64_MAX;
  absl::Status status;
  try {
    for (const auto& chunk : table.chunks) {
      std::lock_guard<std::mutex> lock(chunk->mu);
      absl::Status s = SettleChunk(table, *chunk, active);
      if (!s.ok() && status.ok()) status = s;
      for (uint32_t r = 0; r < n; ++r) last[r] = std::min(last[r], chunk->last_step[r]);
      min_version = std::min(min_version, chunk->version.load(std::memory_order_relaxed));
    }
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory while completing a step for the new ranks");
  }
  if (request.has_routing()) ApplyRouting(*found, request.routing());
  NotifyWaiters();
  if (table.replica != nullptr) KickReplication();
  for (int64_t l : last) response->add_last_steps(l == INT64_MAX ? -1 : l);
  response->set_min_version(min_version == INT64_MAX ? 0 : min_version);
  done(status);
}

}  // namespace pstrain
