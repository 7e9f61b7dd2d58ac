// Making a table from the workers' values (InitTableAsync), and pipelined
// tables (TableConfig.pipeline_stages; docs/pipeline.md): the shard holds
// every stage's keys of a job whose workers each hold one stage of the
// model. Every rank's InitTable names all of the shard's keys, and carries
// values for its own stage's only: the first request makes the table with
// the other keys pending, and each stage's first request fills its own and
// tells their stage. Who pushes a key (its stage's replicas) is the
// chunk's business (Chunk::PushedBy).
#include <algorithm>
#include <mutex>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/quote.h"
#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::CopyBuffer;
using shard_internal::IsFinite;
using shard_internal::WorstCaseBytes;
using shard_internal::Zeros;

absl::StatusOr<std::unique_ptr<ShardStore::Chunk>> ShardStore::NewChunk(const std::string& key,
                                                                        const TensorBuffer& v,
                                                                        const TableConfig& config, bool pending) {
  auto chunk = std::make_unique<Chunk>();
  chunk->key = key;
  chunk->dtype = v.dtype;
  chunk->shape = v.shape;
  chunk->numel = static_cast<size_t>(v.NumElements());
  absl::StatusOr<TensorBuffer> value = pending ? Zeros(v.dtype, v.shape) : CopyBuffer(v);
  if (!value.ok()) return value.status();
  chunk->value = std::move(*value);
  chunk->stages = shard_internal::PipelineStages(config);
  chunk->pending.store(pending);
  const uint32_t sets = shard_internal::StateSets(config);
  chunk->state.resize(sets);
  chunk->optimizer_step.assign(sets, 0);
  chunk->last_step.assign(config.num_workers(), -1);
  if (config.consistency() == SYNC) {
    absl::StatusOr<TensorBuffer> accum = Zeros(v.dtype, v.shape);
    if (!accum.ok()) return accum.status();
    chunk->accum = std::move(*accum);
    chunk->arrived.assign(config.num_workers(), false);
  }
  return chunk;
}

void ShardStore::InitTableAsync(const InitTableRequest& request, std::vector<TensorBuffer> values,
                                InitTableResponse* response, const CallOptions& /*options*/, StatusCallback done) {
  TableConfig config = request.config();
  absl::Status s = ValidateTableRequest(request.job(), request.keys(), &config);
  if (!s.ok()) return done(s);
  const bool pipelined = config.pipeline_stages() > 1;
  std::vector<bool> pending(values.size(), false);
  if (pipelined) {
    absl::StatusOr<std::vector<TensorBuffer>> all = PipelinedInitValues(request, std::move(values), &pending);
    if (!all.ok()) return done(all.status());
    values = std::move(*all);
  } else if (request.own_keys_size() > 0 || request.layouts_size() > 0 || request.stage() > 0) {
    return done(absl::InvalidArgumentError("stage, own_keys and layouts are for pipelined tables "
                                           "(config.pipeline_stages > 1)"));
  }
  if (static_cast<size_t>(request.keys_size()) != values.size()) {
    return done(absl::InvalidArgumentError(absl::StrCat(request.keys_size(), " keys but ", values.size(),
                                                        " values: give one value per key")));
  }
  uint64_t value_bytes = 0;
  std::unordered_set<std::string> keys;
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& key = request.keys(static_cast<int>(i));
    const TensorBuffer& v = values[i];
    const std::string what = absl::StrCat("value of key '", Quote(key), "'");
    if (!pending[i]) s = ValidateTensorBuffer(v, what);
    if (!s.ok()) return done(s);
    if (v.dtype != DT_FLOAT32 && v.dtype != DT_FLOAT64) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          what, " is ", DataTypeName(v.dtype), ": trainable parameters must be float32 or float64")));
    }
    if (!pending[i] && !IsFinite(v)) return done(absl::InvalidArgumentError(what + " has NaN or Inf"));
    if (!keys.insert(key).second) {
      return done(absl::InvalidArgumentError(absl::StrCat("key '", Quote(key), "' appears twice")));
    }
    // A layout costs nothing to send: the sum is bounded before it can
    // wrap (a table over the shard's memory cannot be made anyway).
    if (v.nbytes > options_.max_bytes - value_bytes) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "job '", Quote(request.job()), "' has more than the ", options_.max_bytes, " bytes of values shard ",
          options_.shard_index, " may hold (pstrain-ps --max_memory_mb)")));
    }
    value_bytes += v.nbytes;
  }

  // An existing table of this attempt (every worker calls InitTable) is
  // compared before anything is allocated.
  std::shared_ptr<Table> existing;
  {
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(request.job());
    if (it != tables_.end()) existing = it->second;
  }
  if (existing != nullptr && existing->attempt >= request.attempt()) {
    s = CheckAttempt(*existing, request.attempt());
    if (!s.ok()) return done(s);
    bool same = existing->config.SerializeAsString() == config.SerializeAsString() &&
                existing->chunks.size() == values.size();
    for (size_t i = 0; same && i < values.size(); ++i) {
      const Chunk& c = *existing->chunks[i];
      same = c.key == request.keys(static_cast<int>(i)) && c.dtype == values[i].dtype && c.shape == values[i].shape;
    }
    same = same && (existing->replica == nullptr) == (request.copies_size() == 0);
    for (int i = 0; same && existing->replica != nullptr && i < request.copies_size(); ++i) {
      const auto& want = request.copies(i).shards();
      same = existing->replica->copies[i] == std::vector<uint32_t>(want.begin(), want.end());
    }
    if (!same) {
      return done(absl::AlreadyExistsError(absl::StrCat(
          "job '", Quote(request.job()), "' already has a table on shard ", options_.shard_index,
          " with different keys, shapes or config; use a new job name")));
    }
    if (pipelined) s = FillStage(*existing, request, values);
    if (!s.ok()) return done(s);
    if (pipelined) NotifyWaiters();  // a restored chunk's clock may have moved
    response->set_created(false);
    // A worker's InitTable for a spare catching up may bring a newer routing
    // than the one a leftover table holds (ignored unless newer).
    if (existing->replica != nullptr && request.has_routing()) {
      s = shard_internal::ValidateRouting(request.routing(), existing->replica->routing.targets_size());
      if (!s.ok()) return done(s);
      ApplyRouting(existing, request.routing());
    }
    return done(absl::OkStatus());
  }

  absl::StatusOr<std::shared_ptr<Table>> table =
      NewTable(request.job(), request.attempt(), config, WorstCaseBytes(config, value_bytes));
  if (!table.ok()) return done(table.status());
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& key = request.keys(static_cast<int>(i));
    absl::StatusOr<std::unique_ptr<Chunk>> chunk = NewChunk(key, values[i], config, pending[i]);
    if (!chunk.ok()) return done(chunk.status());
    if (pipelined && !pending[i]) {
      (*chunk)->stage.store(request.stage());
      (*chunk)->stage_known.store(true);
    }
    (*table)->index.emplace(key, i);
    (*table)->chunks.push_back(std::move(*chunk));
  }
  if (s = SetUpReplica(**table, request); !s.ok()) return done(s);
  bool created = false;
  absl::StatusOr<std::shared_ptr<Table>> installed = Install(std::move(*table), /*keep_identical=*/true, &created);
  if (!installed.ok()) return done(installed.status());
  // Another stage's InitTable may have made the table first.
  if (pipelined && !created) s = FillStage(**installed, request, values);
  if (!s.ok()) return done(s);
  if ((*installed)->replica != nullptr) ApplyRouting(*installed, request.routing());
  response->set_created(created);
  done(absl::OkStatus());
}

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
  locks.reserve(table.chunks.size());
  for (const auto& c : table.chunks) locks.emplace_back(c->mu);
  // Every key must stay where it is: one of the request's own keys of
  // another stage, or a key of the request's stage it does not claim (its
  // pushers would wait for this rank's pushes), is another cut.
  std::vector<bool> own(table.chunks.size(), false);
  for (uint32_t i : request.own_keys()) own[i] = true;
  for (size_t i = 0; i < table.chunks.size(); ++i) {
    const Chunk& c = *table.chunks[i];
    if (!c.stage_known.load() || (c.stage.load() == stage) == own[i]) continue;
    return absl::AlreadyExistsError(absl::StrCat(
        "job '", Quote(table.job), "' already has a table whose key '", Quote(c.key), "' is of stage ",
        c.stage.load(), ", which this request of stage ", stage,
        own[i] ? " claims" : " does not claim", ": every worker of a run must cut the model alike"));
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
