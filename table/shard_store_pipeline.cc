// Pipelined tables (TableConfig.pipeline_stages; docs/pipeline.md): the
// shard holds every stage's keys of a job whose workers each hold one
// stage of the model. Every rank's InitTable names all of the shard's
// keys, and carries values for its own stage's only: the first request
// makes the table with the other keys pending, and each stage's first
// request fills its own and tells their stage. Who pushes a key (its
// stage's replicas) is the chunk's business (Chunk::PushedBy).
#include <algorithm>
#include <mutex>

#include "common/dtype.h"
#include "common/quote.h"
#include "table/shard_store_internal.h"

namespace pstrain {

absl::StatusOr<std::vector<TensorBuffer>> ShardStore::PipelinedInitValues(const InitTableRequest& request,
                                                                          std::vector<TensorBuffer> values,
                                                                          std::vector<bool>* pending) {
  const uint32_t stages = request.config().pipeline_stages();
  const int n = request.keys_size();
  if (request.copies_size() > 0) {
    return absl::InvalidArgumentError("a pipelined table cannot be replicated (copies)");
  }
  if (request.stage() >= stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", request.stage(), " is out of range: the table has ", stages, " stages"));
  }
  pending->assign(static_cast<size_t>(n), true);
  int64_t last = -1;
  for (uint32_t k : request.own_keys()) {
    if (static_cast<int64_t>(k) <= last || k >= static_cast<uint32_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat("own_keys must be ascending indices of the request's ", n,
                                                     " keys; ", k, " is not"));
    }
    (*pending)[k] = false;
    last = k;
  }
  const size_t own = static_cast<size_t>(request.own_keys_size());
  if (values.size() != own || static_cast<size_t>(request.layouts_size()) != n - own) {
    return absl::InvalidArgumentError(absl::StrCat(
        values.size(), " values and ", request.layouts_size(), " layouts for ", own, " keys of stage ",
        request.stage(), " and ", n - own, " others: give a value per own key and a layout per other key"));
  }
  std::vector<TensorBuffer> out(static_cast<size_t>(n));
  size_t next_value = 0;
  int next_layout = 0;
  for (int i = 0; i < n; ++i) {
    if (!(*pending)[i]) {
      out[i] = std::move(values[next_value++]);
      continue;
    }
    const KeyLayout& layout = request.layouts(next_layout++);
    TensorBuffer& v = out[i];
    v.dtype = layout.dtype();
    v.shape.assign(layout.shape().begin(), layout.shape().end());
    absl::StatusOr<size_t> bytes = ExpectedBytes(v.dtype, v.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout of key '", Quote(request.keys(i)), "': ", bytes.status().message()));
    }
    v.nbytes = *bytes;
  }
  return out;
}

absl::Status ShardStore::FillStage(Table& table, const InitTableRequest& request,
                                   const std::vector<TensorBuffer>& values) {
  const uint32_t stage = request.stage();
  // The values are copied before any lock is taken: a chunk pending now
  // may be filled meanwhile (by a replica of this stage), never emptied.
  std::vector<TensorBuffer> copies(table.chunks.size());
  std::vector<bool> copied(table.chunks.size(), false);
  for (uint32_t i : request.own_keys()) {
    if (!table.chunks[i]->pending.load()) continue;
    absl::StatusOr<TensorBuffer> copy = shard_internal::CopyBuffer(values[i]);
    if (!copy.ok()) return copy.status();
    copies[i] = std::move(*copy);
    copied[i] = true;
  }
  std::vector<std::unique_lock<std::mutex>> locks;  // index order, as a push takes them
  locks.reserve(request.own_keys_size());
  for (uint32_t i : request.own_keys()) locks.emplace_back(table.chunks[i]->mu);
  for (uint32_t i : request.own_keys()) {
    const Chunk& c = *table.chunks[i];
    if (c.stage_known.load() && c.stage.load() != stage) {
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", Quote(table.job), "' already has a table whose key '", Quote(c.key), "' is of stage ",
          c.stage.load(), ", not ", stage, ": every worker of a run must cut the model alike"));
    }
  }
  const bool sync = table.config.consistency() == SYNC;
  const std::vector<bool> active = table.Active();  // lock order: the chunks, then seats_mu
  for (uint32_t i : request.own_keys()) {
    Chunk& c = *table.chunks[i];
    c.stage.store(stage, std::memory_order_release);
    c.stage_known.store(true, std::memory_order_release);
    if (c.pending.load() && copied[i]) {
      c.value = std::move(copies[i]);
      c.pending.store(false, std::memory_order_release);
    }
    // A restored table's clock counts the ranks that push the chunk.
    if (!sync) c.clock.store(shard_internal::ActiveClock(c, active), std::memory_order_release);
  }
  return absl::OkStatus();
}

}  // namespace pstrain
