#include "server/ps/shard_store.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <zlib.h>

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "server/ps/optimizer.h"

namespace pstrain {

struct ShardStore::Chunk {
  std::string key;
  DataType dtype = DT_INVALID;
  std::vector<int64_t> shape;
  size_t numel = 0;

  std::mutex mu;
  TensorBuffer value;               // replaced or updated under mu (copy-on-write)
  // Optimizer state buffers: state[k][slot], with k the worker under ASYNC
  // and SSP (see TableConfig.shared_async_state), else one set (k = 0).
  std::vector<std::vector<TensorBuffer>> state;
  std::vector<int64_t> optimizer_step;  // updates applied through state[k]
  TensorBuffer accum;               // SYNC: sum of this step's gradients
  std::vector<int64_t> last_step;   // per worker; -1 before its first push
  std::vector<bool> arrived;        // SYNC: worker pushed the current step
  uint32_t arrivals = 0;

  // Published under mu, read by waiters without it.
  std::atomic<int64_t> version{0};
  std::atomic<int64_t> clock{-1};  // min over workers of last_step
};

struct ShardStore::Table {
  std::string job;
  TableConfig config;
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::unordered_map<std::string, size_t> index;

  std::atomic<uint64_t> pushes_applied{0};
  std::atomic<uint64_t> pushes_duplicate{0};
  std::atomic<uint64_t> grads_skipped{0};
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> bytes_pushed{0};
  std::atomic<uint64_t> bytes_pulled{0};
};

struct ShardStore::Waiter {
  std::shared_ptr<Table> table;
  std::vector<size_t> chunks;
  bool by_clock = false;
  int64_t threshold = 0;
  absl::Time deadline;
  StatusCallback ready;

  bool Satisfied() const {
    for (size_t c : chunks) {
      const Chunk& chunk = *table->chunks[c];
      int64_t v = by_clock ? chunk.clock.load(std::memory_order_acquire)
                           : chunk.version.load(std::memory_order_acquire);
      if (v < threshold) return false;
    }
    return true;
  }

  // Names the first chunk that is behind, for a message a person can act on.
  std::string Lagging() const {
    for (size_t c : chunks) {
      const Chunk& chunk = *table->chunks[c];
      int64_t v = by_clock ? chunk.clock.load() : chunk.version.load();
      if (v < threshold) {
        return absl::StrCat("key ", chunk.key, " is at ", by_clock ? "worker step " : "version ",
                            v, ", waited for ", threshold);
      }
    }
    return "";
  }
};

namespace {

absl::Status Unavailable() {
  return absl::UnavailableError("parameter shard is shutting down; retry on its replacement");
}

bool IsFinite(const TensorBuffer& t) {
  return t.known_finite || AllFinite(t.dtype, t.data, t.nbytes);
}

template <typename T>
void AddInto(uint8_t* dst, const uint8_t* src, size_t numel) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  for (size_t i = 0; i < numel; ++i) d[i] += s[i];
}

template <typename T>
void Fill(const TensorBuffer& t, double value) {
  T* p = reinterpret_cast<T*>(t.MutableData());
  std::fill(p, p + t.NumElements(), static_cast<T>(value));
}


// Applies one update to `*value`. When a reader still holds the current
// buffer (a pull response being sent), the update is written to a new buffer
// instead (copy-on-write): reading p and writing p' costs the same memory
// traffic in place or not, so readers get values without any copy.
void ApplyToChunk(const OptimizerConfig& config, int64_t step, TensorBuffer* value,
                  const uint8_t* grad, const std::vector<TensorBuffer>& state, double scale) {
  const size_t n = static_cast<size_t>(value->NumElements());
  TensorBuffer out = *value;
  // Only this thread (holding the chunk lock) can add readers, so a count of
  // 1 cannot grow under us; a stale higher count only costs an allocation.
  if (value->owner.use_count() > 1) out = TensorBuffer::Allocate(value->dtype, value->shape);
  if (value->dtype == DT_FLOAT32) {
    std::vector<float*> s;
    for (const TensorBuffer& b : state) s.push_back(reinterpret_cast<float*>(b.MutableData()));
    ApplyOptimizer<float>(config, step, reinterpret_cast<const float*>(value->data),
                          reinterpret_cast<float*>(out.MutableData()),
                          reinterpret_cast<const float*>(grad), s.data(), n, scale);
  } else {
    std::vector<double*> s;
    for (const TensorBuffer& b : state) s.push_back(reinterpret_cast<double*>(b.MutableData()));
    ApplyOptimizer<double>(config, step, reinterpret_cast<const double*>(value->data),
                           reinterpret_cast<double*>(out.MutableData()),
                           reinterpret_cast<const double*>(grad), s.data(), n, scale);
  }
  *value = std::move(out);
}

TensorBuffer Zeros(DataType dtype, const std::vector<int64_t>& shape) {
  TensorBuffer t = TensorBuffer::Allocate(dtype, shape);
  if (t.nbytes > 0) std::memset(t.MutableData(), 0, t.nbytes);
  return t;
}

absl::Status ValidateTableConfig(TableConfig* config) {
  absl::Status s = NormalizeOptimizerConfig(config->mutable_optimizer());
  if (!s.ok()) return s;
  if (config->consistency() == CONSISTENCY_UNSPECIFIED || !Consistency_IsValid(config->consistency())) {
    return absl::InvalidArgumentError("config.consistency must be ASYNC, SYNC or SSP");
  }
  if (config->num_workers() == 0 || config->num_workers() > 65536) {
    return absl::InvalidArgumentError("config.num_workers must be between 1 and 65536");
  }
  if (!NonFinitePolicy_IsValid(config->nonfinite())) {
    return absl::InvalidArgumentError("config.nonfinite is not a known policy");
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<ShardStore::Chunk> ShardStore::NewChunk(const std::string& key, const TensorBuffer& v,
                                                       const TableConfig& config) {
  auto chunk = std::make_unique<Chunk>();
  chunk->key = key;
  chunk->dtype = v.dtype;
  chunk->shape = v.shape;
  chunk->numel = static_cast<size_t>(v.NumElements());
  chunk->value = TensorBuffer::CopyOf(v.dtype, v.shape, v.data, v.nbytes);
  const int slots = OptimizerStateSlots(config.optimizer().kind());
  const bool per_worker = config.consistency() != SYNC && !config.shared_async_state();
  const uint32_t sets = per_worker ? config.num_workers() : 1;
  chunk->state.resize(sets);
  chunk->optimizer_step.assign(sets, 0);
  for (auto& set : chunk->state) {
    for (int k = 0; k < slots; ++k) set.push_back(Zeros(v.dtype, v.shape));
    if (config.optimizer().kind() == OptimizerConfig::ADAGRAD) {
      if (v.dtype == DT_FLOAT32) {
        Fill<float>(set[0], config.optimizer().initial_accumulator_value());
      } else {
        Fill<double>(set[0], config.optimizer().initial_accumulator_value());
      }
    }
  }
  chunk->last_step.assign(config.num_workers(), -1);
  if (config.consistency() == SYNC) {
    chunk->accum = Zeros(v.dtype, v.shape);
    chunk->arrived.assign(config.num_workers(), false);
  }
  return chunk;
}

ShardStore::ShardStore(ShardStoreOptions options) : options_(std::move(options)) {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

ShardStore::~ShardStore() {
  Shutdown();
  if (reaper_.joinable()) reaper_.join();
}

void ShardStore::Shutdown() {
  std::list<std::shared_ptr<Waiter>> waiters;
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    if (shutdown_) return;
    shutdown_ = true;
    waiters.swap(waiters_);
    waiters_cv_.notify_all();
  }
  for (auto& w : waiters) w->ready(Unavailable());
}

absl::StatusOr<std::shared_ptr<ShardStore::Table>> ShardStore::FindTable(const std::string& job) {
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    if (shutdown_) return Unavailable();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(job);
  if (it == tables_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job, "' has no table on shard ", options_.shard_index,
                     ": call InitTable before pushing or pulling"));
  }
  return it->second;
}

absl::StatusOr<std::vector<size_t>> ShardStore::ResolveKeys(
    const Table& table, const google::protobuf::RepeatedPtrField<std::string>& keys) {
  std::vector<size_t> out;
  out.reserve(keys.size());
  std::unordered_set<size_t> seen;
  for (const std::string& key : keys) {
    auto it = table.index.find(key);
    if (it == table.index.end()) {
      return absl::NotFoundError(absl::StrCat("key '", key, "' is not in job '", table.job,
                                              "' on shard ", options_.shard_index,
                                              " (was it assigned to another shard?)"));
    }
    if (!seen.insert(it->second).second) {
      return absl::InvalidArgumentError(absl::StrCat("key '", key, "' appears twice in one request"));
    }
    out.push_back(it->second);
  }
  return out;
}

void ShardStore::InitTable(const InitTableRequest& request, std::vector<TensorBuffer> values,
                           InitTableResponse* response, const CallOptions& /*options*/,
                           StatusCallback done) {
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    if (shutdown_) return done(Unavailable());
  }
  if (request.job().empty()) return done(absl::InvalidArgumentError("job must not be empty"));
  TableConfig config = request.config();
  absl::Status s = ValidateTableConfig(&config);
  if (!s.ok()) return done(s);
  if (static_cast<size_t>(request.keys_size()) != values.size()) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        request.keys_size(), " keys but ", values.size(), " values: give one value per key")));
  }
  auto table = std::make_shared<Table>();
  table->job = request.job();
  table->config = config;
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& key = request.keys(static_cast<int>(i));
    const TensorBuffer& v = values[i];
    const std::string what = absl::StrCat("value of key '", key, "'");
    if (key.empty()) return done(absl::InvalidArgumentError(absl::StrCat("key ", i, " is empty")));
    s = ValidateTensorBuffer(v, what);
    if (!s.ok()) return done(s);
    if (v.dtype != DT_FLOAT32 && v.dtype != DT_FLOAT64) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          what, " is ", DataTypeName(v.dtype), ": trainable parameters must be float32 or float64")));
    }
    if (!IsFinite(v)) return done(absl::InvalidArgumentError(what + " has NaN or Inf"));
    if (!table->index.emplace(key, i).second) {
      return done(absl::InvalidArgumentError(absl::StrCat("key '", key, "' appears twice")));
    }
    std::unique_ptr<Chunk> chunk = NewChunk(key, v, config);
    table->chunks.push_back(std::move(chunk));
  }

  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(request.job());
  if (it != tables_.end()) {
    // Every worker may initialise with the same seeded values: an identical
    // layout and config keeps the existing table (and its progress).
    const Table& old = *it->second;
    bool same = old.config.SerializeAsString() == config.SerializeAsString() &&
                old.chunks.size() == table->chunks.size();
    for (size_t i = 0; same && i < old.chunks.size(); ++i) {
      const Chunk& a = *old.chunks[i];
      const Chunk& b = *table->chunks[i];
      same = a.key == b.key && a.dtype == b.dtype && a.shape == b.shape;
    }
    if (!same) {
      return done(absl::AlreadyExistsError(absl::StrCat(
          "job '", request.job(), "' already has a table on shard ", options_.shard_index,
          " with different keys, shapes or config; use a new job name")));
    }
    response->set_created(false);
    return done(absl::OkStatus());
  }
  tables_.emplace(request.job(), std::move(table));
  response->set_created(true);
  done(absl::OkStatus());
}

absl::Status ShardStore::ApplyPush(Table& table, const PushInput& in, std::vector<size_t>* chunks,
                                   PushResponse* response) {
  const TableConfig& config = table.config;
  response->Clear();
  if (static_cast<size_t>(in.keys->size()) != in.grads->size()) {
    return absl::InvalidArgumentError(absl::StrCat(in.keys->size(), " keys but ",
                                                   in.grads->size(), " gradients"));
  }
  if (in.worker >= config.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", in.worker, " is out of range: job '",
                                                   table.job, "' has ", config.num_workers(),
                                                   " workers (0..", config.num_workers() - 1, ")"));
  }
  if (in.step < 0) return absl::InvalidArgumentError("step must be >= 0");
  if (in.lr < 0 || !std::isfinite(in.lr)) {
    return absl::InvalidArgumentError("lr must be a finite number >= 0 (0: the table's)");
  }
  OptimizerConfig optimizer = config.optimizer();
  if (in.lr > 0) optimizer.set_lr(in.lr);
  if (config.consistency() != SYNC && !config.shared_async_state()) {
    // With per-worker state, one round of pushes from all N workers moves the
    // parameters as far as one SYNC step of the averaged gradient: the job's
    // lr means the same in every mode (and as in DDP).
    optimizer.set_lr(optimizer.lr() / config.num_workers());
  }
  absl::StatusOr<std::vector<size_t>> resolved = ResolveKeys(table, *in.keys);
  if (!resolved.ok()) return resolved.status();
  *chunks = std::move(*resolved);

  // Validate everything before touching anything.
  std::vector<bool> skip(chunks->size(), false);
  for (size_t i = 0; i < chunks->size(); ++i) {
    const Chunk& c = *table.chunks[(*chunks)[i]];
    const TensorBuffer& g = (*in.grads)[i];
    const std::string what = absl::StrCat("gradient for key '", c.key, "'");
    absl::Status s = ValidateTensorBuffer(g, what);
    if (!s.ok()) return s;
    if (g.dtype != c.dtype || g.shape != c.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is ", DataTypeName(g.dtype), g.ShapeString(), " but the parameter is ",
                       DataTypeName(c.dtype), c.value.ShapeString()));
    }
    if (config.consistency() == SYNC && in.step > c.version.load(std::memory_order_acquire)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", c.key, "' is at step ", c.version.load(), " but worker ", in.worker,
          " pushed step ", in.step, "; under SYNC a worker pulls step t's result before pushing step t+1"));
    }
    if (!IsFinite(g)) {
      if (config.nonfinite() == NONFINITE_REJECT) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " from worker ", in.worker, " at step ", in.step,
            " has NaN or Inf; nothing in this push was applied (lower the learning rate, clip "
            "gradients, or set the table's nonfinite policy to SKIP)"));
      }
      skip[i] = true;
    }
  }

  uint32_t applied = 0, duplicates = 0, skipped = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks->size(); ++i) {
    Chunk& c = *table.chunks[(*chunks)[i]];
    const TensorBuffer& g = (*in.grads)[i];
    std::lock_guard<std::mutex> lock(c.mu);
    int64_t& last = c.last_step[in.worker];
    if (config.consistency() == SYNC) {
      const int64_t version = c.version.load(std::memory_order_relaxed);
      // Versions only grow, so the check above still holds: step <= version.
      if (in.step != version || c.arrived[in.worker]) {
        ++duplicates;
      } else {
        c.arrived[in.worker] = true;
        ++c.arrivals;
        last = in.step;
        if (skip[i]) {
          ++skipped;  // counts as this worker's (empty) contribution
        } else {
          if (c.dtype == DT_FLOAT32) {
            AddInto<float>(c.accum.MutableData(), g.data, c.numel);
          } else {
            AddInto<double>(c.accum.MutableData(), g.data, c.numel);
          }
          ++applied;
          bytes += g.nbytes;
        }
        if (c.arrivals == config.num_workers()) {
          ApplyToChunk(optimizer, ++c.optimizer_step[0], &c.value, c.accum.data, c.state[0],
                       1.0 / config.num_workers());
          std::memset(c.accum.MutableData(), 0, c.accum.nbytes);
          std::fill(c.arrived.begin(), c.arrived.end(), false);
          c.arrivals = 0;
          c.version.store(version + 1, std::memory_order_release);
        }
      }
    } else {
      if (in.step <= last) {
        ++duplicates;
      } else {
        last = in.step;
        if (skip[i]) {
          ++skipped;
        } else {
          const size_t k = c.state.size() == 1 ? 0 : in.worker;
          ApplyToChunk(optimizer, ++c.optimizer_step[k], &c.value, g.data, c.state[k], 1.0);
          c.version.fetch_add(1, std::memory_order_release);
          ++applied;
          bytes += g.nbytes;
        }
        c.clock.store(*std::min_element(c.last_step.begin(), c.last_step.end()),
                      std::memory_order_release);
      }
    }
    response->add_versions(c.version.load(std::memory_order_relaxed));
  }
  response->set_applied(applied);
  response->set_duplicates(duplicates);
  response->set_skipped_nonfinite(skipped);
  table.pushes_applied += applied;
  table.pushes_duplicate += duplicates;
  table.grads_skipped += skipped;
  table.bytes_pushed += bytes;
  return absl::OkStatus();
}

void ShardStore::Snapshot(Table& table, const std::vector<size_t>& chunks,
                          google::protobuf::RepeatedField<int64_t>* versions,
                          std::vector<TensorBuffer>* values) {
  // Without destinations, readers share the chunk's current buffer: updates
  // are copy-on-write (ApplyToChunk), so it never changes under them. With
  // caller-provided destinations that fit, the values are copied into them.
  bool use_destinations = !values->empty() && values->size() == chunks.size();
  for (size_t i = 0; use_destinations && i < chunks.size(); ++i) {
    const Chunk& c = *table.chunks[chunks[i]];
    use_destinations = (*values)[i].dtype == c.dtype && (*values)[i].nbytes == c.value.nbytes;
  }
  if (!use_destinations) values->assign(chunks.size(), TensorBuffer());
  uint64_t bytes = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *table.chunks[chunks[i]];
    TensorBuffer& out = (*values)[i];
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (use_destinations) {
        if (out.nbytes > 0) std::memcpy(out.MutableData(), c.value.data, out.nbytes);
      } else {
        out = c.value;
      }
      versions->Add(c.version.load(std::memory_order_relaxed));
    }
    bytes += out.nbytes;
  }
  ++table.pulls;
  table.bytes_pulled += bytes;
}

void ShardStore::WhenReady(std::shared_ptr<Table> table, std::vector<size_t> chunks,
                           bool by_clock, int64_t threshold, absl::Time deadline,
                           StatusCallback ready) {
  auto w = std::make_shared<Waiter>();
  w->table = std::move(table);
  w->chunks = std::move(chunks);
  w->by_clock = by_clock;
  w->threshold = threshold;
  w->deadline = std::min(deadline, absl::Now() + options_.max_wait);
  w->ready = std::move(ready);
  absl::Status now;
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    if (shutdown_) {
      now = Unavailable();
    } else if (!w->Satisfied()) {
      waiters_.push_back(w);
      waiters_cv_.notify_all();  // the reaper may need an earlier wake-up
      return;
    }
  }
  w->ready(now);
}

void ShardStore::NotifyWaiters() {
  std::vector<std::shared_ptr<Waiter>> fired;
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
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
  std::unique_lock<std::mutex> lock(waiters_mu_);
  while (!shutdown_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& w : waiters_) next = std::min(next, w->deadline);
    if (next == absl::InfiniteFuture()) {
      waiters_cv_.wait(lock);
    } else {
      waiters_cv_.wait_until(lock, absl::ToChronoTime(next));
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
    lock.unlock();
    for (auto& w : expired) {
      w->ready(absl::DeadlineExceededError(absl::StrCat(
          "deadline passed while waiting on job '", w->table->job, "': ", w->Lagging(),
          "; a worker may have died or fallen behind")));
    }
    lock.lock();
  }
}

void ShardStore::Pull(const PullRequest& request, PullResponse* response,
                      std::vector<TensorBuffer>* values, const CallOptions& options,
                      StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job());
  if (!table.ok()) return done(table.status());
  absl::StatusOr<std::vector<size_t>> chunks = ResolveKeys(**table, request.keys());
  if (!chunks.ok()) return done(chunks.status());
  std::shared_ptr<Table> t = *table;
  auto idx = std::make_shared<std::vector<size_t>>(std::move(*chunks));
  WhenReady(t, *idx, /*by_clock=*/false, request.min_version(), options.deadline,
            [this, t, idx, response, values, done = std::move(done)](absl::Status s) {
              if (s.ok()) Snapshot(*t, *idx, response->mutable_versions(), values);
              done(s);
            });
}

void ShardStore::Push(const PushRequest& request, std::vector<TensorBuffer> grads,
                      PushResponse* response, const CallOptions& /*options*/,
                      StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job());
  if (!table.ok()) return done(table.status());
  PushInput in{request.job(), request.worker(), request.step(), request.lr(), &request.keys(), &grads};
  std::vector<size_t> chunks;
  absl::Status s = ApplyPush(**table, in, &chunks, response);
  if (s.ok()) NotifyWaiters();
  done(s);
}

void ShardStore::PushPull(const PushPullRequest& request, std::vector<TensorBuffer> grads,
                          PushPullResponse* response, std::vector<TensorBuffer>* values,
                          const CallOptions& options, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job());
  if (!table.ok()) return done(table.status());
  std::shared_ptr<Table> t = *table;
  PushInput in{request.job(), request.worker(), request.step(), request.lr(), &request.keys(), &grads};
  auto idx = std::make_shared<std::vector<size_t>>();
  absl::Status s = ApplyPush(*t, in, idx.get(), response->mutable_push());
  if (!s.ok()) return done(s);
  NotifyWaiters();
  bool by_clock = false;
  int64_t threshold = 0;
  switch (t->config.consistency()) {
    case SYNC:
      threshold = request.step() + 1;
      break;
    case SSP:
      by_clock = true;
      threshold = request.step() - static_cast<int64_t>(t->config.staleness());
      break;
    default:
      break;
  }
  WhenReady(t, *idx, by_clock, threshold, options.deadline,
            [this, t, idx, response, values, done = std::move(done)](absl::Status s) {
              if (s.ok()) Snapshot(*t, *idx, response->mutable_versions(), values);
              done(s);
            });
}

void ShardStore::Stats(const StatsRequest& request, StatsResponse* response,
                       const CallOptions& /*options*/, StatusCallback done) {
  std::vector<std::shared_ptr<Table>> tables;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [job, table] : tables_) {
      if (request.job().empty() || request.job() == job) tables.push_back(table);
    }
  }
  if (!request.job().empty() && tables.empty()) {
    return done(absl::NotFoundError(
        absl::StrCat("job '", request.job(), "' has no table on shard ", options_.shard_index)));
  }
  response->set_shard_index(options_.shard_index);
  response->set_num_shards(options_.num_shards);
  for (const auto& t : tables) {
    TableStats* s = response->add_tables();
    s->set_job(t->job);
    *s->mutable_config() = t->config;
    s->set_num_chunks(t->chunks.size());
    int64_t lo = INT64_MAX, hi = 0;
    uint64_t elements = 0, bytes = 0;
    for (const auto& c : t->chunks) {
      elements += c->numel;
      bytes += c->value.nbytes;
      const int64_t v = c->version.load();
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    s->set_num_elements(elements);
    s->set_value_bytes(bytes);
    s->set_min_version(t->chunks.empty() ? 0 : lo);
    s->set_max_version(hi);
    s->set_pushes_applied(t->pushes_applied.load());
    s->set_pushes_duplicate(t->pushes_duplicate.load());
    s->set_grads_skipped_nonfinite(t->grads_skipped.load());
    s->set_pulls(t->pulls.load());
    s->set_bytes_pushed(t->bytes_pushed.load());
    s->set_bytes_pulled(t->bytes_pulled.load());
  }
  done(absl::OkStatus());
}

void ShardStore::SaveTable(const SaveTableRequest& request, SaveTableResponse* response,
                           const CallOptions& /*options*/, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job());
  if (!table.ok()) return done(table.status());
  if (request.path().empty()) return done(absl::InvalidArgumentError("path must not be empty"));
  TableSnapshot snap;
  snap.set_job((*table)->job);
  *snap.mutable_config() = (*table)->config;
  snap.set_shard_index(options_.shard_index);
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& c : (*table)->chunks) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->arrivals > 0) {
      return done(absl::FailedPreconditionError(absl::StrCat(
          "key '", c->key, "' has a SYNC step half pushed; checkpoint when every worker is paused")));
    }
    ChunkSnapshot* cs = snap.add_chunks();
    cs->set_key(c->key);
    cs->set_dtype(c->dtype);
    for (int64_t d : c->shape) cs->add_shape(d);
    cs->set_value(reinterpret_cast<const char*>(c->value.data), c->value.nbytes);
    for (size_t k = 0; k < c->state.size(); ++k) {
      ChunkSnapshot::StateSet* set = cs->add_state();
      for (const TensorBuffer& b : c->state[k]) set->add_slots(reinterpret_cast<const char*>(b.data), b.nbytes);
      set->set_optimizer_step(c->optimizer_step[k]);
    }
    const int64_t v = c->version.load();
    cs->set_version(v);
    for (int64_t l : c->last_step) cs->add_last_step(l);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    response->add_keys(c->key);
  }
  std::string bytes;
  if (!snap.SerializeToString(&bytes)) {
    return done(absl::ResourceExhaustedError("the table is too large for one checkpoint file (2 GiB)"));
  }
  absl::Status s = WriteFileAtomically(request.path(), bytes);
  if (!s.ok()) return done(s);
  response->set_path(request.path());
  response->set_bytes(bytes.size());
  response->set_crc32(static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()))));
  response->set_min_version(lo == INT64_MAX ? 0 : lo);
  response->set_max_version(hi);
  done(absl::OkStatus());
}

void ShardStore::LoadTable(const LoadTableRequest& request, LoadTableResponse* response,
                           const CallOptions& /*options*/, StatusCallback done) {
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    if (shutdown_) return done(Unavailable());
  }
  if (request.job().empty()) return done(absl::InvalidArgumentError("job must not be empty"));
  TableConfig config = request.config();
  absl::Status s = ValidateTableConfig(&config);
  if (!s.ok()) return done(s);
  std::unordered_map<std::string, ChunkSnapshot> wanted;
  for (const std::string& k : request.keys()) wanted.emplace(k, ChunkSnapshot());
  std::unordered_set<std::string> found;
  for (const auto& f : request.files()) {
    absl::StatusOr<std::string> bytes = ReadFile(f.path());
    if (!bytes.ok()) {
      return done(absl::DataLossError(absl::StrCat("checkpoint file ", f.path(), " is missing")));
    }
    if (f.bytes() != 0 && bytes->size() != f.bytes()) {
      return done(absl::DataLossError(absl::StrCat("checkpoint file ", f.path(), " has ", bytes->size(),
                                                   " bytes, the manifest says ", f.bytes(), " (truncated?)")));
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(bytes->data()), static_cast<uInt>(bytes->size())));
    if (crc != f.crc32()) {
      return done(absl::DataLossError(absl::StrCat("checkpoint file ", f.path(), " is corrupt (crc32 ", crc,
                                                   ", the manifest says ", f.crc32(), ")")));
    }
    TableSnapshot snap;
    if (!snap.ParseFromString(*bytes)) {
      return done(absl::DataLossError(absl::StrCat("checkpoint file ", f.path(), " cannot be parsed")));
    }
    for (ChunkSnapshot& c : *snap.mutable_chunks()) {
      auto it = wanted.find(c.key());
      if (it != wanted.end()) {
        it->second = std::move(c);
        found.insert(it->first);
      }
    }
  }
  auto table = std::make_shared<Table>();
  table->job = request.job();
  table->config = config;
  const int slots = OptimizerStateSlots(config.optimizer().kind());
  int64_t lo = INT64_MAX;
  for (const std::string& key : request.keys()) {
    if (found.count(key) == 0) {
      return done(absl::DataLossError(absl::StrCat("the checkpoint has no chunk '", key,
                                                   "': it is incomplete or from another model")));
    }
    const ChunkSnapshot& c = wanted[key];
    TensorBuffer v;
    v.dtype = c.dtype();
    v.shape.assign(c.shape().begin(), c.shape().end());
    v.data = reinterpret_cast<const uint8_t*>(c.value().data());
    v.nbytes = c.value().size();
    s = ValidateTensorBuffer(v, absl::StrCat("checkpointed chunk '", key, "'"));
    if (!s.ok() || (v.dtype != DT_FLOAT32 && v.dtype != DT_FLOAT64)) {
      return done(absl::DataLossError(s.ok() ? absl::StrCat("chunk '", key, "' is not float") : std::string(s.message())));
    }
    if (!table->index.emplace(key, table->chunks.size()).second) {
      return done(absl::InvalidArgumentError(absl::StrCat("key '", key, "' appears twice")));
    }
    std::unique_ptr<Chunk> chunk = NewChunk(key, v, config);
    // Optimizer state and per-worker steps carry over when they fit the new
    // table (same worker count and optimizer); otherwise they start afresh.
    bool state_fits = static_cast<size_t>(c.state_size()) == chunk->state.size();
    for (const auto& set : c.state()) {
      state_fits = state_fits && set.slots_size() == slots;
      for (const std::string& b : set.slots()) state_fits = state_fits && b.size() == v.nbytes;
    }
    if (state_fits) {
      for (size_t k = 0; k < chunk->state.size(); ++k) {
        for (int j = 0; j < slots; ++j) {
          std::memcpy(chunk->state[k][j].MutableData(), c.state(k).slots(j).data(), v.nbytes);
        }
        chunk->optimizer_step[k] = c.state(k).optimizer_step();
      }
    }
    if (static_cast<size_t>(c.last_step_size()) == chunk->last_step.size()) {
      chunk->last_step.assign(c.last_step().begin(), c.last_step().end());
      chunk->clock.store(*std::min_element(chunk->last_step.begin(), chunk->last_step.end()));
    }
    chunk->version.store(c.version());
    lo = std::min(lo, c.version());
    table->chunks.push_back(std::move(chunk));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (tables_.count(request.job()) != 0) {
    return done(absl::AlreadyExistsError(absl::StrCat("job '", request.job(), "' already has a table on shard ",
                                                      options_.shard_index, "; restore into a new job")));
  }
  response->set_chunks(static_cast<uint32_t>(table->chunks.size()));
  response->set_min_version(lo == INT64_MAX ? 0 : lo);
  tables_.emplace(request.job(), std::move(table));
  done(absl::OkStatus());
}

void ShardStore::DropTable(const DropTableRequest& request, DropTableResponse* response,
                           const CallOptions& /*options*/, StatusCallback done) {
  std::shared_ptr<Table> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(request.job());
    if (it != tables_.end()) {
      table = std::move(it->second);
      tables_.erase(it);
    }
  }
  response->set_dropped(table != nullptr);
  // Calls still waiting on the table (a SYNC step whose other workers were
  // stopped) fail now instead of at their deadline.
  std::vector<std::shared_ptr<Waiter>> orphans;
  if (table != nullptr) {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->table == table) {
        orphans.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : orphans) {
    w->ready(absl::AbortedError(absl::StrCat("job '", request.job(), "' ended; its table was dropped")));
  }
  done(absl::OkStatus());
}

}  // namespace pstrain
