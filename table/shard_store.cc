#include "table/shard_store.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"
#include "table/optimizer.h"

namespace pstrain {

struct ShardStore::Chunk {
  std::string key;
  DataType dtype = DT_INVALID;
  std::vector<int64_t> shape;
  size_t numel = 0;

  std::mutex mu;
  TensorBuffer value;  // replaced under mu (copy-on-write), never written in place
  // The previous value once no reader holds it: the next update is written
  // here and swapped in, so updates allocate nothing in the steady state.
  TensorBuffer spare;
  // Optimizer state buffers: state[k][slot], with k the worker under ASYNC
  // and SSP (see TableConfig.shared_async_state), else one set (k = 0). A
  // set is allocated on its worker's first push (its bytes were reserved
  // with the table); an empty set has not been used yet.
  std::vector<std::vector<TensorBuffer>> state;
  std::vector<int64_t> optimizer_step;  // updates applied through state[k]
  TensorBuffer accum;                   // SYNC: sum of this step's gradients
  std::vector<int64_t> last_step;       // per worker; -1 before its first push
  std::vector<bool> arrived;            // SYNC: worker pushed the current step
  uint32_t arrivals = 0;

  // Published under mu, read by waiters without it.
  std::atomic<int64_t> version{0};
  std::atomic<int64_t> clock{-1};  // min over workers of last_step
};

struct ShardStore::Table {
  std::string job;
  uint64_t attempt = 0;  // see InitTableRequest.attempt
  TableConfig config;
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::unordered_map<std::string, size_t> index;

  // Returned to the store's budget when the last reference goes.
  std::atomic<uint64_t>* budget = nullptr;
  uint64_t reserved = 0;
  ~Table() {
    if (budget != nullptr) budget->fetch_sub(reserved);
  }

  std::atomic<uint64_t> pushes_applied{0};
  std::atomic<uint64_t> pushes_duplicate{0};
  std::atomic<uint64_t> grads_skipped{0};
  std::atomic<uint64_t> updates_nonfinite{0};
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
        return absl::StrCat("key ", Quote(chunk.key), " is at ", by_clock ? "worker step " : "version ", v,
                            ", waited for ", threshold);
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

absl::StatusOr<TensorBuffer> Zeros(DataType dtype, const std::vector<int64_t>& shape) {
  absl::StatusOr<TensorBuffer> t = TensorBuffer::TryAllocate(dtype, shape);
  if (t.ok() && t->nbytes > 0) std::memset(t->MutableData(), 0, t->nbytes);
  return t;
}

absl::StatusOr<TensorBuffer> CopyBuffer(const TensorBuffer& from) {
  absl::StatusOr<TensorBuffer> t = TensorBuffer::TryAllocate(from.dtype, from.shape);
  if (t.ok() && t->nbytes > 0) std::memcpy(t->MutableData(), from.data, from.nbytes);
  return t;
}

// A fresh optimizer state set for a chunk of `v`'s dtype and shape.
absl::StatusOr<std::vector<TensorBuffer>> NewStateSet(const OptimizerConfig& optimizer, DataType dtype,
                                                      const std::vector<int64_t>& shape) {
  std::vector<TensorBuffer> set;
  for (int k = 0; k < OptimizerStateSlots(optimizer.kind()); ++k) {
    absl::StatusOr<TensorBuffer> z = Zeros(dtype, shape);
    if (!z.ok()) return z.status();
    set.push_back(std::move(*z));
  }
  if (optimizer.kind() == OptimizerConfig::ADAGRAD && !set.empty()) {
    if (dtype == DT_FLOAT32) {
      Fill<float>(set[0], optimizer.initial_accumulator_value());
    } else {
      Fill<double>(set[0], optimizer.initial_accumulator_value());
    }
  }
  return set;
}

// One update of a chunk: the new value into `out` (a buffer no reader
// holds), the optimizer state in place. Returns whether the new value and
// state are finite (checked in the same pass); if not, `out` must not be
// installed and the state must be reset (ResetStateSet).
bool ComputeUpdate(const OptimizerConfig& config, int64_t step, const TensorBuffer& value, const uint8_t* grad,
                   const std::vector<TensorBuffer>& state, double scale, TensorBuffer* out) {
  const size_t n = static_cast<size_t>(value.NumElements());
  if (value.dtype == DT_FLOAT32) {
    std::vector<float*> s;
    for (const TensorBuffer& b : state) s.push_back(reinterpret_cast<float*>(b.MutableData()));
    return ApplyOptimizer<float>(config, step, reinterpret_cast<const float*>(value.data),
                                 reinterpret_cast<float*>(out->MutableData()), reinterpret_cast<const float*>(grad),
                                 s.data(), n, scale);
  }
  std::vector<double*> s;
  for (const TensorBuffer& b : state) s.push_back(reinterpret_cast<double*>(b.MutableData()));
  return ApplyOptimizer<double>(config, step, reinterpret_cast<const double*>(value.data),
                                reinterpret_cast<double*>(out->MutableData()), reinterpret_cast<const double*>(grad),
                                s.data(), n, scale);
}

// Back to the state of a fresh table (zeros; Adagrad's initial accumulator).
void ResetStateSet(const OptimizerConfig& optimizer, std::vector<TensorBuffer>& set) {
  for (size_t k = 0; k < set.size(); ++k) {
    const TensorBuffer& b = set[k];
    const double init = optimizer.kind() == OptimizerConfig::ADAGRAD && k == 0 ? optimizer.initial_accumulator_value() : 0;
    if (b.dtype == DT_FLOAT32) {
      Fill<float>(b, init);
    } else {
      Fill<double>(b, init);
    }
  }
}

uint64_t DefaultMaxBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return uint64_t{1} << 34;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 10 * 8;
}

// Bytes a table of these chunk sizes may come to hold: values and their
// spare buffers (updates are written beside the value, then swapped in),
// optimizer state for every set it may allocate, SYNC accumulators.
uint64_t WorstCaseBytes(const TableConfig& config, uint64_t value_bytes) {
  const uint64_t slots = static_cast<uint64_t>(OptimizerStateSlots(config.optimizer().kind()));
  const bool per_worker = config.consistency() != SYNC && !config.shared_async_state();
  const uint64_t sets = per_worker ? config.num_workers() : 1;
  const uint64_t accum = config.consistency() == SYNC ? 1 : 0;
  return value_bytes * (2 + slots * sets + accum);
}

// In [lo, hi], and not NaN.
bool InRange(double x, double lo, double hi) { return x >= lo && x <= hi; }

}  // namespace

absl::Status ValidateTableConfig(TableConfig* config) {
  absl::Status s = NormalizeOptimizerConfig(config->mutable_optimizer());
  if (!s.ok()) return s;
  const OptimizerConfig& o = config->optimizer();
  auto bad = [](const char* field, const char* range) {
    return absl::InvalidArgumentError(absl::StrCat("config.optimizer.", field, " must be in ", range));
  };
  // Ranges beyond which no training converges; values outside them are a
  // mistake or an attack, and lead to non-finite parameters.
  if (!InRange(o.lr(), 1e-12, 100)) return bad("lr", "(0, 100]");
  if (!InRange(o.weight_decay(), 0, 1)) return bad("weight_decay", "[0, 1]");
  if (!InRange(o.momentum(), 0, 0.9999)) return bad("momentum", "[0, 1)");
  if (!InRange(o.dampening(), 0, 1)) return bad("dampening", "[0, 1]");
  if (!InRange(o.beta1(), 0, 0.9999)) return bad("beta1", "[0, 1)");
  if (!InRange(o.beta2(), 0, 0.999999)) return bad("beta2", "[0, 1)");
  if (!InRange(o.eps(), 0, 1)) return bad("eps", "[0, 1]");
  if (!InRange(o.lr_decay(), 0, 1)) return bad("lr_decay", "[0, 1]");
  if (!InRange(o.initial_accumulator_value(), 0, 1e6)) return bad("initial_accumulator_value", "[0, 1e6]");
  if (config->consistency() == CONSISTENCY_UNSPECIFIED || !Consistency_IsValid(config->consistency())) {
    return absl::InvalidArgumentError("config.consistency must be ASYNC, SYNC or SSP");
  }
  if (config->num_workers() == 0 || config->num_workers() > kMaxTableWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("config.num_workers must be between 1 and ", kMaxTableWorkers));
  }
  if (config->staleness() > 1000000) {
    return absl::InvalidArgumentError("config.staleness must be at most 1000000");
  }
  if (!NonFinitePolicy_IsValid(config->nonfinite())) {
    return absl::InvalidArgumentError("config.nonfinite is not a known policy");
  }
  return absl::OkStatus();
}

ShardStore::ShardStore(ShardStoreOptions options) : options_([&] {
  if (options.max_bytes == 0) options.max_bytes = DefaultMaxBytes();
  return std::move(options);
}()) {
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

namespace {

// Checks what a table's identity needs: a job name, keys, one value each.
absl::Status ValidateJobAndKeys(const std::string& job, const google::protobuf::RepeatedPtrField<std::string>& keys) {
  if (job.empty()) return absl::InvalidArgumentError("job must not be empty");
  if (job.size() > kMaxJobBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job '", Quote(job), "' is longer than ", kMaxJobBytes, " bytes"));
  }
  for (int i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) return absl::InvalidArgumentError(absl::StrCat("key ", i, " is empty"));
    if (keys[i].size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", Quote(keys[i]), "' is longer than ", kMaxKeyBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardStore::ValidateTableRequest(const std::string& job,
                                              const google::protobuf::RepeatedPtrField<std::string>& keys,
                                              TableConfig* config) {
  absl::Status s = ShutdownStatus();
  if (s.ok()) s = ValidateJobAndKeys(job, keys);
  if (s.ok()) s = ValidateTableConfig(config);
  return s;
}

absl::Status ShardStore::ShutdownStatus() {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  return shutdown_ ? Unavailable() : absl::OkStatus();
}

absl::Status ShardStore::CheckAttempt(const Table& table, uint64_t attempt) const {
  if (attempt < table.attempt) {
    return absl::AbortedError(absl::StrCat(
        "job '", Quote(table.job), "' was restarted: this request is of its attempt ", attempt,
        ", the table on shard ", options_.shard_index, " is of attempt ", table.attempt,
        "; the caller's run of the job is over"));
  }
  if (attempt > table.attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", Quote(table.job), "' has a table of attempt ", table.attempt, " on shard ", options_.shard_index,
        " but this request is of attempt ", attempt, ": call InitTable (or LoadTable) for attempt ", attempt,
        " first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ShardStore::Table>> ShardStore::FindTable(const std::string& job,
                                                                         uint64_t attempt) {
  absl::Status down = ShutdownStatus();
  if (!down.ok()) return down;
  std::shared_ptr<Table> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(job);
    if (it != tables_.end()) table = it->second;
  }
  if (table == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("job '", Quote(job), "' has no table on shard ",
                                                      options_.shard_index,
                                                      ": call InitTable before pushing or pulling"));
  }
  absl::Status s = CheckAttempt(*table, attempt);
  if (!s.ok()) return s;
  return table;
}

absl::StatusOr<std::shared_ptr<ShardStore::Table>> ShardStore::NewTable(const std::string& job, uint64_t attempt,
                                                                        const TableConfig& config,
                                                                        uint64_t bytes) {
  uint64_t before = reserved_.load();
  do {
    if (bytes > options_.max_bytes || before > options_.max_bytes - bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job '", Quote(job), "' needs up to ", bytes, " bytes on shard ", options_.shard_index,
          " (values, optimizer state for ", config.num_workers(), " worker(s)); ", options_.max_bytes - before,
          " of its ", options_.max_bytes, " are free (pstrain-ps --max_memory_mb)"));
    }
  } while (!reserved_.compare_exchange_weak(before, before + bytes));
  auto table = std::make_shared<Table>();
  table->job = job;
  table->attempt = attempt;
  table->config = config;
  table->budget = &reserved_;
  table->reserved = bytes;
  return table;
}

void ShardStore::AbortWaiters(const std::shared_ptr<Table>& table, const std::string& why) {
  std::vector<std::shared_ptr<Waiter>> orphans;
  {
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
  for (auto& w : orphans) w->ready(absl::AbortedError(why));
}

absl::StatusOr<std::shared_ptr<ShardStore::Table>> ShardStore::Install(std::shared_ptr<Table> table,
                                                                       bool keep_identical, bool* created) {
  std::shared_ptr<Table> replaced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(table->job);
    if (it != tables_.end()) {
      const Table& old = *it->second;
      if (old.attempt > table->attempt) return CheckAttempt(old, table->attempt);
      if (old.attempt == table->attempt) {
        // Every worker may initialise with the same seeded values: an
        // identical layout and config keeps the existing table (and its
        // progress).
        bool same = keep_identical && old.config.SerializeAsString() == table->config.SerializeAsString() &&
                    old.chunks.size() == table->chunks.size();
        for (size_t i = 0; same && i < old.chunks.size(); ++i) {
          const Chunk& a = *old.chunks[i];
          const Chunk& b = *table->chunks[i];
          same = a.key == b.key && a.dtype == b.dtype && a.shape == b.shape;
        }
        if (!same) {
          return absl::AlreadyExistsError(absl::StrCat(
              "job '", Quote(table->job), "' already has a table of attempt ", old.attempt, " on shard ",
              options_.shard_index,
              keep_identical ? " with different keys, shapes or config; use a new job name"
                             : "; restore into a new job or a new attempt"));
        }
        *created = false;
        return it->second;
      }
      // A table of an earlier attempt of the job (its drop was lost in a
      // partition): the new attempt replaces it.
      replaced = std::move(it->second);
      it->second = table;
    } else {
      if (tables_.size() >= options_.max_tables) {
        return absl::ResourceExhaustedError(absl::StrCat("shard ", options_.shard_index, " already holds ",
                                                         tables_.size(), " tables, its limit"));
      }
      tables_.emplace(table->job, table);
    }
  }
  if (replaced != nullptr) {
    AbortWaiters(replaced, absl::StrCat("job '", Quote(table->job), "' was restarted as attempt ", table->attempt,
                                        "; this call was of attempt ", replaced->attempt));
  }
  *created = true;
  return table;
}

absl::StatusOr<std::vector<size_t>> ShardStore::ResolveKeys(
    const Table& table, const google::protobuf::RepeatedPtrField<std::string>& keys) {
  std::vector<size_t> out;
  out.reserve(keys.size());
  std::unordered_set<size_t> seen;
  for (const std::string& key : keys) {
    auto it = table.index.find(key);
    if (it == table.index.end()) {
      return absl::NotFoundError(absl::StrCat("key '", Quote(key), "' is not in job '", Quote(table.job),
                                              "' on shard ", options_.shard_index,
                                              " (was it assigned to another shard?)"));
    }
    if (!seen.insert(it->second).second) {
      return absl::InvalidArgumentError(absl::StrCat("key '", Quote(key), "' appears twice in one request"));
    }
    out.push_back(it->second);
  }
  return out;
}


absl::StatusOr<std::unique_ptr<ShardStore::Chunk>> ShardStore::NewChunk(const std::string& key,
                                                                        const TensorBuffer& v,
                                                                        const TableConfig& config) {
  auto chunk = std::make_unique<Chunk>();
  chunk->key = key;
  chunk->dtype = v.dtype;
  chunk->shape = v.shape;
  chunk->numel = static_cast<size_t>(v.NumElements());
  absl::StatusOr<TensorBuffer> value = CopyBuffer(v);
  if (!value.ok()) return value.status();
  chunk->value = std::move(*value);
  const bool per_worker = config.consistency() != SYNC && !config.shared_async_state();
  const uint32_t sets = per_worker ? config.num_workers() : 1;
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

void ShardStore::InitTable(const InitTableRequest& request, std::vector<TensorBuffer> values,
                           InitTableResponse* response, const CallOptions& /*options*/, StatusCallback done) {
  TableConfig config = request.config();
  absl::Status s = ValidateTableRequest(request.job(), request.keys(), &config);
  if (!s.ok()) return done(s);
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
    s = ValidateTensorBuffer(v, what);
    if (!s.ok()) return done(s);
    if (v.dtype != DT_FLOAT32 && v.dtype != DT_FLOAT64) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          what, " is ", DataTypeName(v.dtype), ": trainable parameters must be float32 or float64")));
    }
    if (!IsFinite(v)) return done(absl::InvalidArgumentError(what + " has NaN or Inf"));
    if (!keys.insert(key).second) {
      return done(absl::InvalidArgumentError(absl::StrCat("key '", Quote(key), "' appears twice")));
    }
    value_bytes += v.nbytes;
  }

  // An existing table of this attempt (every worker calls InitTable) is
  // compared before anything is allocated.
  std::shared_ptr<Table> existing;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    if (!same) {
      return done(absl::AlreadyExistsError(absl::StrCat(
          "job '", Quote(request.job()), "' already has a table on shard ", options_.shard_index,
          " with different keys, shapes or config; use a new job name")));
    }
    response->set_created(false);
    return done(absl::OkStatus());
  }

  absl::StatusOr<std::shared_ptr<Table>> table =
      NewTable(request.job(), request.attempt(), config, WorstCaseBytes(config, value_bytes));
  if (!table.ok()) return done(table.status());
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& key = request.keys(static_cast<int>(i));
    absl::StatusOr<std::unique_ptr<Chunk>> chunk = NewChunk(key, values[i], config);
    if (!chunk.ok()) return done(chunk.status());
    (*table)->index.emplace(key, i);
    (*table)->chunks.push_back(std::move(*chunk));
  }
  bool created = false;
  absl::StatusOr<std::shared_ptr<Table>> installed = Install(std::move(*table), /*keep_identical=*/true, &created);
  if (!installed.ok()) return done(installed.status());
  response->set_created(created);
  done(absl::OkStatus());
}

absl::Status ShardStore::ApplyPush(Table& table, const PushInput& in, std::vector<size_t>* chunks,
                                   PushResponse* response) {
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
  if (in.step < 0 || in.step >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", in.step, " is out of range [0, 2^40)"));
  }
  if (!(in.lr >= 0) || !std::isfinite(in.lr) || in.lr > 100) {
    return absl::InvalidArgumentError("lr must be a number in [0, 100] (0: the table's)");
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
    const std::string what = absl::StrCat("gradient for key '", Quote(c.key), "'");
    absl::Status s = ValidateTensorBuffer(g, what);
    if (!s.ok()) return s;
    if (g.dtype != c.dtype || g.shape != c.shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is ", DataTypeName(g.dtype), g.ShapeString(),
                                                     " but the parameter is ", DataTypeName(c.dtype),
                                                     c.value.ShapeString()));
    }
    const int64_t version = c.version.load(std::memory_order_acquire);
    if (config.consistency() == SYNC && in.step > version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", Quote(c.key), "' is at step ", version, " but worker ", in.worker, " pushed step ", in.step,
          "; under SYNC a worker pulls step t's result before pushing step t+1"));
    }
    if (in.step > version + kMaxStepAhead) {
      return absl::InvalidArgumentError(absl::StrCat("step ", in.step, " of worker ", in.worker, " is more than ",
                                                     kMaxStepAhead, " steps ahead of key '", Quote(c.key),
                                                     "' (version ", version, ")"));
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

  // Every chunk of the push is locked (ascending index: no deadlock with
  // another push) while its updates are computed, checked and committed.
  // New values are written beside the current ones (a spare buffer) and
  // swapped in only if every update of the push is finite: values change
  // all together or not at all.
  std::vector<size_t> order(chunks->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return (*chunks)[a] < (*chunks)[b]; });
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(order.size());
  for (size_t i : order) locks.emplace_back(table.chunks[(*chunks)[i]]->mu);

  const bool sync = config.consistency() == SYNC;
  // What this push does to chunk i: nothing (a duplicate), count an arrival
  // (SYNC), or install a new value (an update).
  enum class Action { kDuplicate, kArrive, kSkip, kUpdate };
  std::vector<Action> action(chunks->size());
  std::vector<TensorBuffer> new_value(chunks->size());
  // A buffer for the chunk's next value: its spare if no reader holds it.
  auto take_spare = [](Chunk& c) -> absl::StatusOr<TensorBuffer> {
    if (c.spare.data != nullptr && c.spare.owner.use_count() == 1) {
      TensorBuffer out = std::move(c.spare);
      c.spare = TensorBuffer();
      return out;
    }
    c.spare = TensorBuffer();
    return TensorBuffer::TryAllocate(c.dtype, c.shape);
  };
  auto state_set = [&](Chunk& c, size_t k) -> absl::Status {
    if (!c.state[k].empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<TensorBuffer>> set = NewStateSet(optimizer, c.dtype, c.shape);
    if (!set.ok()) return set.status();
    c.state[k] = std::move(*set);
    return absl::OkStatus();
  };
  const size_t k = config.consistency() != SYNC && !config.shared_async_state() ? in.worker : 0;
  try {
    for (size_t i = 0; i < chunks->size(); ++i) {
      Chunk& c = *table.chunks[(*chunks)[i]];
      const int64_t version = c.version.load(std::memory_order_relaxed);
      if (sync) {
        // Versions only grow, so the check above still holds: step <= version.
        if (in.step != version || c.arrived[in.worker]) {
          action[i] = Action::kDuplicate;
          continue;
        }
        action[i] = Action::kArrive;
        if (c.arrivals + 1 < config.num_workers()) continue;
        // This push completes the step: the update of the mean is computed
        // at commit (it cannot be refused: the step is over either way).
        absl::Status s = state_set(c, 0);
        if (!s.ok()) return s;
        absl::StatusOr<TensorBuffer> out = take_spare(c);
        if (!out.ok()) return out.status();
        new_value[i] = std::move(*out);
        continue;
      }
      if (in.step <= c.last_step[in.worker]) {
        action[i] = Action::kDuplicate;
        continue;
      }
      if (skip[i]) {
        action[i] = Action::kSkip;
        continue;
      }
      absl::Status s = state_set(c, k);
      if (!s.ok()) return s;
      absl::StatusOr<TensorBuffer> out = take_spare(c);
      if (!out.ok()) return out.status();
      new_value[i] = std::move(*out);
      action[i] = Action::kUpdate;
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while applying a push; nothing was applied");
  }
  // ASYNC/SSP: the updates, into the new buffers (the optimizer state in
  // place). One that is not finite is never installed and its optimizer
  // state restarts (it may hold Inf); under REJECT no value of the push
  // changes and the state of every chunk it touched restarts.
  for (size_t i = 0; i < chunks->size() && !sync; ++i) {
    if (action[i] != Action::kUpdate) continue;
    Chunk& c = *table.chunks[(*chunks)[i]];
    if (ComputeUpdate(optimizer, c.optimizer_step[k] + 1, c.value, (*in.grads)[i].data, c.state[k], 1.0,
                      &new_value[i])) {
      continue;
    }
    ++table.updates_nonfinite;
    ResetStateSet(optimizer, c.state[k]);
    c.optimizer_step[k] = 0;
    c.spare = std::move(new_value[i]);
    action[i] = Action::kSkip;
    if (config.nonfinite() == NONFINITE_REJECT) {
      for (size_t j = 0; j < i; ++j) {
        if (action[j] != Action::kUpdate) continue;
        Chunk& earlier = *table.chunks[(*chunks)[j]];
        ResetStateSet(optimizer, earlier.state[k]);
        earlier.optimizer_step[k] = 0;
        earlier.spare = std::move(new_value[j]);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "the update of key '", Quote(c.key), "' by worker ", in.worker, " at step ", in.step,
          " is not finite (gradient too large for the learning rate); no value of this push was applied"));
    }
  }

  // Commit: nothing below can fail.
  uint32_t applied = 0, duplicates = 0, skipped = 0;
  uint64_t bytes = 0;
  auto install = [](Chunk& c, TensorBuffer value) {
    TensorBuffer old = std::move(c.value);
    c.value = std::move(value);
    if (old.owner.use_count() == 1) c.spare = std::move(old);  // else a reader still has it
  };
  for (size_t i = 0; i < chunks->size(); ++i) {
    Chunk& c = *table.chunks[(*chunks)[i]];
    const TensorBuffer& g = (*in.grads)[i];
    switch (action[i]) {
      case Action::kDuplicate:
        ++duplicates;
        break;
      case Action::kArrive: {
        c.arrived[in.worker] = true;
        ++c.arrivals;
        c.last_step[in.worker] = in.step;
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
          // The mean of the step; a non-finite result is dropped (the step
          // completes without changing the value, the state restarts).
          if (ComputeUpdate(optimizer, c.optimizer_step[0] + 1, c.value, c.accum.data, c.state[0],
                            1.0 / config.num_workers(), &new_value[i])) {
            install(c, std::move(new_value[i]));
            ++c.optimizer_step[0];
          } else {
            ++table.updates_nonfinite;
            ResetStateSet(optimizer, c.state[0]);
            c.optimizer_step[0] = 0;
            c.spare = std::move(new_value[i]);
          }
          std::memset(c.accum.MutableData(), 0, c.accum.nbytes);
          std::fill(c.arrived.begin(), c.arrived.end(), false);
          c.arrivals = 0;
          c.version.store(c.version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
        }
        break;
      }
      case Action::kSkip:
        ++skipped;
        c.last_step[in.worker] = in.step;
        break;
      case Action::kUpdate:
        install(c, std::move(new_value[i]));
        ++c.optimizer_step[k];
        c.last_step[in.worker] = in.step;
        c.version.fetch_add(1, std::memory_order_release);
        ++applied;
        bytes += g.nbytes;
        break;
    }
    if (!sync && action[i] != Action::kDuplicate) {
      c.clock.store(*std::min_element(c.last_step.begin(), c.last_step.end()), std::memory_order_release);
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
                          google::protobuf::RepeatedField<int64_t>* versions, std::vector<TensorBuffer>* values) {
  // Without destinations, readers share the chunk's current buffer: updates
  // always write new buffers (ApplyPush), so it never changes under them.
  // With caller-provided destinations that fit, the values are copied in.
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

void ShardStore::WhenReady(std::shared_ptr<Table> table, std::vector<size_t> chunks, bool by_clock,
                           int64_t threshold, absl::Time deadline, StatusCallback ready) {
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
      if (waiters_.size() >= options_.max_waiters) {
        now = absl::ResourceExhaustedError(absl::StrCat("shard ", options_.shard_index, " already has ",
                                                        waiters_.size(), " waiting calls, its limit"));
      } else {
        waiters_.push_back(w);
        waiters_cv_.notify_all();  // the reaper may need an earlier wake-up
        return;
      }
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
      w->ready(absl::DeadlineExceededError(absl::StrCat("deadline passed while waiting on job '",
                                                        Quote(w->table->job), "': ", w->Lagging(),
                                                        "; a worker may have died or fallen behind")));
    }
    lock.lock();
  }
}

void ShardStore::Pull(const PullRequest& request, PullResponse* response, std::vector<TensorBuffer>* values,
                      const CallOptions& options, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
  if (!table.ok()) return done(table.status());
  absl::StatusOr<std::vector<size_t>> chunks = ResolveKeys(**table, request.keys());
  if (!chunks.ok()) return done(chunks.status());
  if (request.min_version() >= kMaxStep) {
    return done(absl::InvalidArgumentError("min_version is out of range [0, 2^40)"));
  }
  std::shared_ptr<Table> t = *table;
  auto idx = std::make_shared<std::vector<size_t>>(std::move(*chunks));
  WhenReady(t, *idx, /*by_clock=*/false, request.min_version(), options.deadline,
            [this, t, idx, response, values, done = std::move(done)](absl::Status s) {
              if (s.ok()) Snapshot(*t, *idx, response->mutable_versions(), values);
              done(s);
            });
}

void ShardStore::Push(const PushRequest& request, std::vector<TensorBuffer> grads, PushResponse* response,
                      const CallOptions& /*options*/, StatusCallback done) {
  if (options_.before_push) options_.before_push(request.job(), request.attempt(), request.worker(), request.step());
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
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
  if (options_.before_push) options_.before_push(request.job(), request.attempt(), request.worker(), request.step());
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
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

void ShardStore::Stats(const StatsRequest& request, StatsResponse* response, const CallOptions& /*options*/,
                       StatusCallback done) {
  std::vector<std::shared_ptr<Table>> tables;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [job, table] : tables_) {
      if (request.job().empty() || request.job() == job) tables.push_back(table);
    }
  }
  if (!request.job().empty() && tables.empty()) {
    return done(absl::NotFoundError(
        absl::StrCat("job '", Quote(request.job()), "' has no table on shard ", options_.shard_index)));
  }
  response->set_shard_index(options_.shard_index);
  response->set_num_shards(options_.num_shards);
  for (const auto& t : tables) {
    TableStats* s = response->add_tables();
    s->set_job(t->job);
    s->set_attempt(t->attempt);
    *s->mutable_config() = t->config;
    s->set_num_chunks(t->chunks.size());
    int64_t lo = INT64_MAX, hi = 0;
    uint64_t elements = 0, bytes = 0;
    for (const auto& c : t->chunks) {
      elements += c->numel;
      bytes += c->numel * DataTypeSize(c->dtype);
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
    s->set_updates_nonfinite(t->updates_nonfinite.load());
    s->set_pulls(t->pulls.load());
    s->set_bytes_pushed(t->bytes_pushed.load());
    s->set_bytes_pulled(t->bytes_pulled.load());
  }
  done(absl::OkStatus());
}

void ShardStore::SaveTable(const SaveTableRequest& request, SaveTableResponse* response,
                           const CallOptions& /*options*/, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
  if (!table.ok()) return done(table.status());
  if (options_.checkpoint_root.empty()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " has no checkpoint root (pstrain-ps --checkpoint_root)")));
  }
  absl::StatusOr<std::string> path = ResolveUnderRoot(options_.checkpoint_root, request.path());
  if (!path.ok()) return done(path.status());
  TableSnapshot snap;
  snap.set_job((*table)->job);
  *snap.mutable_config() = (*table)->config;
  snap.set_shard_index(options_.shard_index);
  int64_t lo = INT64_MAX, hi = 0;
  try {
    for (const auto& c : (*table)->chunks) {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->arrivals > 0) {
        return done(absl::FailedPreconditionError(absl::StrCat(
            "key '", Quote(c->key), "' has a SYNC step half pushed; checkpoint when every worker is paused")));
      }
      ChunkSnapshot* cs = snap.add_chunks();
      cs->set_key(c->key);
      cs->set_dtype(c->dtype);
      for (int64_t d : c->shape) cs->add_shape(d);
      cs->set_value(reinterpret_cast<const char*>(c->value.data), c->value.nbytes);
      for (size_t k = 0; k < c->state.size(); ++k) {
        ChunkSnapshot::StateSet* set = cs->add_state();  // empty: never used
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
  } catch (const std::bad_alloc&) {
    return done(absl::ResourceExhaustedError("out of memory while building the checkpoint file"));
  }
  std::string bytes;
  if (snap.ByteSizeLong() > (size_t{1} << 31) - 1 || !snap.SerializeToString(&bytes)) {
    return done(absl::ResourceExhaustedError("the table is too large for one checkpoint file (2 GiB)"));
  }
  snap.Clear();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(*path).parent_path(), ec);
  if (ec) return done(ErrnoToStatus(ec.value(), "cannot create the directory of", request.path()));
  absl::Status s = WriteFileAtomically(*path, bytes);
  if (!s.ok()) return done(s);
  response->set_path(request.path());
  response->set_bytes(bytes.size());
  response->set_crc32(static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()))));
  response->set_min_version(lo == INT64_MAX ? 0 : lo);
  response->set_max_version(hi);
  done(absl::OkStatus());
}

namespace {

// Field-by-field check of one chunk of a checkpoint file against the
// snapshot's own config: a file whose size and CRC match may still have been
// crafted, or written by a bug.
absl::Status ValidateChunkSnapshot(const ChunkSnapshot& c, const TableConfig& snap_config, const std::string& file) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", Quote(file, 256), ": chunk '", Quote(c.key()), "' ", what));
  };
  if (c.key().empty() || c.key().size() > kMaxKeyBytes) return bad("has an empty or over-long key");
  if (c.dtype() != DT_FLOAT32 && c.dtype() != DT_FLOAT64) return bad("is not float32 or float64");
  const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
  absl::StatusOr<size_t> expected = ExpectedBytes(c.dtype(), shape);
  if (!expected.ok()) return bad(absl::StrCat("has an invalid shape: ", expected.status().message()));
  if (*expected != c.value().size()) {
    return bad(absl::StrCat("has ", c.value().size(), " value bytes for a shape of ", *expected));
  }
  if (!AllFinite(c.dtype(), reinterpret_cast<const uint8_t*>(c.value().data()), c.value().size())) {
    return bad("has NaN or Inf values");
  }
  if (c.version() < 0 || c.version() >= kMaxStep) return bad(absl::StrCat("has version ", c.version()));
  if (c.last_step_size() != static_cast<int>(snap_config.num_workers())) {
    return bad(absl::StrCat("has ", c.last_step_size(), " worker steps for ", snap_config.num_workers(), " workers"));
  }
  for (int64_t l : c.last_step()) {
    if (l < -1 || l >= kMaxStep) return bad(absl::StrCat("has a worker step of ", l));
  }
  const bool per_worker = snap_config.consistency() != SYNC && !snap_config.shared_async_state();
  const int sets = per_worker ? static_cast<int>(snap_config.num_workers()) : 1;
  if (c.state_size() != sets) return bad(absl::StrCat("has ", c.state_size(), " optimizer state sets, not ", sets));
  const int slots = OptimizerStateSlots(snap_config.optimizer().kind());
  for (const auto& set : c.state()) {
    if (set.optimizer_step() < 0 || set.optimizer_step() >= kMaxStep) {
      return bad(absl::StrCat("has an optimizer step of ", set.optimizer_step()));
    }
    if (set.slots_size() != 0 && set.slots_size() != slots) {
      return bad(absl::StrCat("has ", set.slots_size(), " optimizer state slots, not ", slots));
    }
    for (const std::string& b : set.slots()) {
      if (b.size() != c.value().size()) return bad("has an optimizer state slot of the wrong size");
      if (!AllFinite(c.dtype(), reinterpret_cast<const uint8_t*>(b.data()), b.size())) {
        return bad("has NaN or Inf optimizer state");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

void ShardStore::LoadTable(const LoadTableRequest& request, LoadTableResponse* response,
                           const CallOptions& /*options*/, StatusCallback done) {
  TableConfig config = request.config();
  absl::Status s = ValidateTableRequest(request.job(), request.keys(), &config);
  if (!s.ok()) return done(s);
  if (options_.checkpoint_root.empty()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " has no checkpoint root (pstrain-ps --checkpoint_root)")));
  }
  if (request.files_size() > kMaxCheckpointFiles) {
    return done(absl::InvalidArgumentError(absl::StrCat("at most ", kMaxCheckpointFiles, " checkpoint files")));
  }
  // Refused before any file is read when the table exists.
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(request.job());
    if (it != tables_.end() && it->second->attempt >= request.attempt()) {
      s = CheckAttempt(*it->second, request.attempt());
      if (s.ok()) {
        s = absl::AlreadyExistsError(absl::StrCat("job '", Quote(request.job()), "' already has a table of attempt ",
                                                  request.attempt(), " on shard ", options_.shard_index,
                                                  "; restore into a new job or a new attempt"));
      }
    }
  }
  if (!s.ok()) return done(s);
  std::vector<std::string> paths;
  for (const auto& f : request.files()) {
    absl::StatusOr<std::string> path = ResolveUnderRoot(options_.checkpoint_root, f.path());
    if (!path.ok()) return done(path.status());
    if (f.bytes() == 0 || f.bytes() > options_.max_bytes) {
      return done(absl::InvalidArgumentError(absl::StrCat("checkpoint file ", Quote(f.path()), ": its size (",
                                                          f.bytes(), ") must be given, at most ", options_.max_bytes)));
    }
    paths.push_back(std::move(*path));
  }
  std::unordered_map<std::string, ChunkSnapshot> wanted;
  std::unordered_map<std::string, TableConfig> wanted_config;  // the config of the file it came from
  for (const std::string& k : request.keys()) {
    if (!wanted.emplace(k, ChunkSnapshot()).second) {
      return done(absl::InvalidArgumentError(absl::StrCat("key '", Quote(k), "' appears twice")));
    }
  }
  std::unordered_set<std::string> found;
  try {
    for (int i = 0; i < request.files_size(); ++i) {
      const auto& f = request.files(i);
      const std::string name = Quote(f.path(), 256);
      absl::StatusOr<std::string> bytes = ReadRegularFile(paths[i], f.bytes());
      if (!bytes.ok()) {
        return done(absl::DataLossError(absl::StrCat("checkpoint file ", name, ": ", bytes.status().message())));
      }
      if (bytes->size() != f.bytes()) {
        return done(absl::DataLossError(absl::StrCat("checkpoint file ", name, " has ", bytes->size(),
                                                     " bytes, the manifest says ", f.bytes(), " (truncated?)")));
      }
      const uint32_t crc = static_cast<uint32_t>(
          crc32(0L, reinterpret_cast<const Bytef*>(bytes->data()), static_cast<uInt>(bytes->size())));
      if (crc != f.crc32()) {
        return done(absl::DataLossError(absl::StrCat("checkpoint file ", name, " is corrupt (crc32 ", crc,
                                                     ", the manifest says ", f.crc32(), ")")));
      }
      TableSnapshot snap;
      if (!snap.ParseFromString(*bytes)) {
        return done(absl::DataLossError(absl::StrCat("checkpoint file ", name, " cannot be parsed")));
      }
      bytes->clear();
      bytes->shrink_to_fit();
      TableConfig snap_config = snap.config();
      if (!ValidateTableConfig(&snap_config).ok()) {
        return done(absl::DataLossError(absl::StrCat("checkpoint file ", name, " has an invalid table config")));
      }
      for (ChunkSnapshot& c : *snap.mutable_chunks()) {
        auto it = wanted.find(c.key());
        if (it == wanted.end()) continue;
        s = ValidateChunkSnapshot(c, snap_config, f.path());
        if (!s.ok()) return done(s);
        if (!found.insert(it->first).second) {
          return done(absl::DataLossError(absl::StrCat("chunk '", Quote(c.key()),
                                                       "' appears twice in the checkpoint (file ", name, ")")));
        }
        it->second = std::move(c);
        wanted_config[it->first] = snap_config;
      }
    }
  } catch (const std::bad_alloc&) {
    return done(absl::ResourceExhaustedError("out of memory while reading the checkpoint"));
  }
  uint64_t value_bytes = 0;
  for (const std::string& key : request.keys()) {
    if (found.count(key) == 0) {
      return done(absl::DataLossError(
          absl::StrCat("the checkpoint has no chunk '", Quote(key), "': it is incomplete or from another model")));
    }
    value_bytes += wanted[key].value().size();
  }
  absl::StatusOr<std::shared_ptr<Table>> table =
      NewTable(request.job(), request.attempt(), config, WorstCaseBytes(config, value_bytes));
  if (!table.ok()) return done(table.status());
  const int slots = OptimizerStateSlots(config.optimizer().kind());
  int64_t lo = INT64_MAX;
  for (const std::string& key : request.keys()) {
    const ChunkSnapshot& c = wanted[key];
    TensorBuffer v;
    v.dtype = c.dtype();
    v.shape.assign(c.shape().begin(), c.shape().end());
    v.data = reinterpret_cast<const uint8_t*>(c.value().data());
    v.nbytes = c.value().size();
    absl::StatusOr<std::unique_ptr<Chunk>> made = NewChunk(key, v, config);
    if (!made.ok()) return done(made.status());
    Chunk& chunk = **made;
    // Optimizer state and per-worker steps carry over when they fit the new
    // table (same worker count, consistency and optimizer); otherwise they
    // start afresh.
    const TableConfig& old = wanted_config[key];
    const bool state_fits = static_cast<size_t>(c.state_size()) == chunk.state.size() &&
                            old.optimizer().kind() == config.optimizer().kind();
    if (state_fits) {
      for (size_t k = 0; k < chunk.state.size(); ++k) {
        const auto& set = c.state(static_cast<int>(k));
        if (set.slots_size() == slots && slots > 0) {
          std::vector<TensorBuffer> restored;
          for (int j = 0; j < slots; ++j) {
            absl::StatusOr<TensorBuffer> b = TensorBuffer::TryAllocate(v.dtype, v.shape);
            if (!b.ok()) return done(b.status());
            std::memcpy(b->MutableData(), set.slots(j).data(), v.nbytes);
            restored.push_back(std::move(*b));
          }
          chunk.state[k] = std::move(restored);
        }
        chunk.optimizer_step[k] = set.optimizer_step();
      }
    }
    if (static_cast<size_t>(c.last_step_size()) == chunk.last_step.size()) {
      chunk.last_step.assign(c.last_step().begin(), c.last_step().end());
      chunk.clock.store(*std::min_element(chunk.last_step.begin(), chunk.last_step.end()));
    }
    chunk.version.store(c.version());
    lo = std::min(lo, c.version());
    (*table)->index.emplace(key, (*table)->chunks.size());
    (*table)->chunks.push_back(std::move(*made));
  }
  const size_t loaded = (*table)->chunks.size();
  bool created = false;
  absl::StatusOr<std::shared_ptr<Table>> installed = Install(std::move(*table), /*keep_identical=*/false, &created);
  if (!installed.ok()) return done(installed.status());
  response->set_chunks(static_cast<uint32_t>(loaded));
  response->set_min_version(lo == INT64_MAX ? 0 : lo);
  done(absl::OkStatus());
}

void ShardStore::DropTable(const DropTableRequest& request, DropTableResponse* response,
                           const CallOptions& /*options*/, StatusCallback done) {
  std::shared_ptr<Table> table;
  uint64_t newer = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(request.job());
    if (it != tables_.end()) {
      if (it->second->attempt <= request.attempt()) {
        table = std::move(it->second);
        tables_.erase(it);
      } else {
        newer = it->second->attempt;
      }
    }
  }
  response->set_dropped(table != nullptr);
  if (newer != 0) {
    // A late drop of an ended attempt: its successor's table stays.
    return done(absl::AbortedError(absl::StrCat("job '", Quote(request.job()), "' has a table of attempt ", newer,
                                                ", newer than this drop's ", request.attempt(), "; kept")));
  }
  // Calls still waiting on the table (a SYNC step whose other workers were
  // stopped) fail now instead of at their deadline.
  if (table != nullptr) {
    AbortWaiters(table, absl::StrCat("job '", Quote(request.job()), "' ended; its table was dropped"));
  }
  done(absl::OkStatus());
}

}  // namespace pstrain

namespace pstrain {

absl::Status ShardStore::ExportChunks(const std::string& job, std::vector<ChunkState>* chunks) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(job, /*attempt=*/0);
  if (!table.ok()) return table.status();
  google::protobuf::RepeatedPtrField<std::string> keys;
  for (const ChunkState& c : *chunks) keys.Add()->assign(c.key);
  absl::StatusOr<std::vector<size_t>> index = ResolveKeys(**table, keys);
  if (!index.ok()) return index.status();
  const int slots = OptimizerStateSlots((*table)->config.optimizer().kind());
  for (size_t i = 0; i < chunks->size(); ++i) {
    ChunkState& out = (*chunks)[i];
    Chunk& c = *(*table)->chunks[(*index)[i]];
    std::lock_guard<std::mutex> lock(c.mu);
    if (static_cast<int>(out.slots.size()) != slots) {
      return absl::InvalidArgumentError(absl::StrCat("key '", Quote(c.key), "' has ", slots, " state slots"));
    }
    std::memcpy(out.value, c.value.data, c.value.nbytes);
    if (c.state.empty() || c.state[0].empty()) {
      // Never updated: the state a first update would start from.
      absl::StatusOr<std::vector<TensorBuffer>> fresh = NewStateSet((*table)->config.optimizer(), c.dtype, c.shape);
      if (!fresh.ok()) return fresh.status();
      for (int j = 0; j < slots; ++j) std::memcpy(out.slots[j], (*fresh)[j].data, (*fresh)[j].nbytes);
      out.optimizer_step = 0;
    } else {
      for (int j = 0; j < slots; ++j) std::memcpy(out.slots[j], c.state[0][j].data, c.state[0][j].nbytes);
      out.optimizer_step = c.optimizer_step[0];
    }
  }
  return absl::OkStatus();
}

absl::Status ShardStore::ImportChunks(const std::string& job, const std::vector<ChunkState>& chunks, int64_t step) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(job, /*attempt=*/0);
  if (!table.ok()) return table.status();
  google::protobuf::RepeatedPtrField<std::string> keys;
  for (const ChunkState& c : chunks) keys.Add()->assign(c.key);
  absl::StatusOr<std::vector<size_t>> index = ResolveKeys(**table, keys);
  if (!index.ok()) return index.status();
  const int slots = OptimizerStateSlots((*table)->config.optimizer().kind());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkState& in = chunks[i];
    Chunk& c = *(*table)->chunks[(*index)[i]];
    if (static_cast<int>(in.slots.size()) != slots) {
      return absl::InvalidArgumentError(absl::StrCat("key '", Quote(c.key), "' has ", slots, " state slots"));
    }
    // Everything allocated first: the chunk changes all at once or not at all.
    absl::StatusOr<TensorBuffer> value = TensorBuffer::TryAllocate(c.dtype, c.shape);
    if (!value.ok()) return value.status();
    std::memcpy(value->MutableData(), in.value, value->nbytes);
    std::vector<TensorBuffer> set;
    for (int j = 0; j < slots; ++j) {
      absl::StatusOr<TensorBuffer> b = TensorBuffer::TryAllocate(c.dtype, c.shape);
      if (!b.ok()) return b.status();
      std::memcpy(b->MutableData(), in.slots[j], b->nbytes);
      set.push_back(std::move(*b));
    }
    std::lock_guard<std::mutex> lock(c.mu);
    c.value = std::move(*value);  // readers keep the old value through its owner
    c.spare = TensorBuffer();
    if (c.state.empty()) return absl::FailedPreconditionError("the table keeps no optimizer state");
    c.state[0] = std::move(set);
    c.optimizer_step[0] = in.optimizer_step;
    for (auto& l : c.last_step) l = step;
    c.clock.store(step, std::memory_order_release);
    c.version.store(std::max(c.version.load(), in.optimizer_step), std::memory_order_release);
  }
  NotifyWaiters();
  return absl::OkStatus();
}

}  // namespace pstrain
