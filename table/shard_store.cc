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
#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::CopyBuffer;
using shard_internal::IsFinite;
using shard_internal::Unavailable;
using shard_internal::WorstCaseBytes;
using shard_internal::Zeros;

uint64_t DefaultShardMaxBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return uint64_t{1} << 34;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 10 * 8;
}

ShardStore::ShardStore(ShardStoreOptions options)
    : options_([&] {
        if (options.budget != nullptr) options.max_bytes = options.budget->max();
        if (options.max_bytes == 0) options.max_bytes = DefaultShardMaxBytes();
        return std::move(options);
      }()),
      own_budget_(options_.budget == nullptr ? std::make_unique<ByteBudget>(options_.max_bytes) : nullptr),
      budget_(options_.budget != nullptr ? options_.budget : own_budget_.get()) {
  reaper_ = std::thread([this] { ReaperLoop(); });
  replicator_ = std::thread([this] { ReplicationLoop(); });
}

ShardStore::~ShardStore() {
  Shutdown();
  if (reaper_.joinable()) reaper_.join();
  {
    absl::MutexLock lock(&repl_mu_);
    repl_stop_ = true;
  }
  if (replicator_.joinable()) replicator_.join();
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
  absl::MutexLock lock(&waiters_mu_);
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
    absl::MutexLock lock(&mu_);
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
  if (!budget_->TryReserve(bytes)) {
    const uint64_t used = std::min(budget_->used(), options_.max_bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", Quote(job), "' needs up to ", bytes, " bytes on shard ", options_.shard_index,
        " (values, optimizer state for ", config.num_workers(), " worker(s)); ", options_.max_bytes - used,
        " of its ", options_.max_bytes, " are free (pstrain-ps --max_memory_mb)"));
  }
  auto table = std::make_shared<Table>();
  table->job = job;
  table->attempt = attempt;
  table->config = config;
  table->budget = budget_;
  table->reserved = bytes;
  {
    absl::MutexLock lock(&table->seats_mu);
    table->seats.assign(config.num_workers(), Table::Seat());
  }
  return table;
}

absl::StatusOr<std::shared_ptr<ShardStore::Table>> ShardStore::Install(std::shared_ptr<Table> table,
                                                                       bool keep_identical, bool* created) {
  std::shared_ptr<Table> replaced;
  {
    absl::MutexLock lock(&mu_);
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
    if (absl::Status s = shard_internal::CheckStagePusher(*table.chunks[it->second], -1); !s.ok()) return s;
    out.push_back(it->second);
  }
  return out;
}

void ShardStore::PullAsync(const PullRequest& request, PullResponse* response, std::vector<TensorBuffer>* values,
                           const CallOptions& options, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
  if (!table.ok()) return done(table.status());
  absl::StatusOr<std::vector<size_t>> chunks = ResolveKeys(**table, request.keys());
  if (!chunks.ok()) return done(chunks.status());
  if (absl::Status leads = CheckLeads(**table, *chunks); !leads.ok()) return done(leads);
  if (request.min_version() >= kMaxStep || request.min_worker_steps() < 0 || request.min_worker_steps() >= kMaxStep) {
    return done(absl::InvalidArgumentError("min_version and min_worker_steps must be in [0, 2^40)"));
  }
  std::shared_ptr<Table> t = *table;
  const bool by_clock = request.min_worker_steps() > 0;
  if (by_clock && (t->config.consistency() == SYNC || request.min_version() > 0)) {
    return done(absl::InvalidArgumentError(
        "min_worker_steps is for ASYNC and SSP tables, without min_version (under SYNC, wait for the step's version)"));
  }
  const DataType value_dtype = request.value_dtype();
  absl::Status wire = shard_internal::CheckValueDtype(value_dtype);
  if (!wire.ok()) return done(wire);
  auto idx = std::make_shared<std::vector<size_t>>(std::move(*chunks));
  WhenReadyAsync(t, *idx, by_clock, by_clock ? request.min_worker_steps() - 1 : request.min_version(), options.deadline,
                 [this, t, idx, response, values, value_dtype, done = std::move(done)](absl::Status s) {
                   if (s.ok()) Snapshot(*t, *idx, value_dtype, response->mutable_versions(), values, response->mutable_vacant_ranks());
                   done(s);
                 });
}

void ShardStore::PushAsync(const PushRequest& request, std::vector<TensorBuffer> grads, PushResponse* response,
                           const CallOptions& options, StatusCallback done) {
  if (options_.before_push) options_.before_push(request.job(), request.attempt(), request.worker(), request.step());
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
  if (!table.ok()) return done(table.status());
  if (absl::Status w = shard_internal::WidenNarrowGradients(grads); !w.ok()) return done(w);
  PushInput in{request.job(), request.worker(), request.generation(), request.step(), request.lr(), &request.keys(),
               &grads, request.extra_batches(), request.empty()};
  std::vector<size_t> chunks;
  std::vector<int64_t> seqs;
  absl::Status s = ApplyPush(**table, in, &chunks, response, &seqs);
  if (!s.ok()) return done(s);
  NotifyWaiters();
  if ((*table)->replica == nullptr) return done(s);
  // Answered once the backups hold the update.
  KickReplication();
  WhenReadyAsync(*table, std::move(chunks), false, 0, options.deadline, std::move(done), std::move(seqs));
}

void ShardStore::PushPullAsync(const PushPullRequest& request, std::vector<TensorBuffer> grads,
                               PushPullResponse* response, std::vector<TensorBuffer>* values,
                               const CallOptions& options, StatusCallback done) {
  if (options_.before_push) options_.before_push(request.job(), request.attempt(), request.worker(), request.step());
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
  if (!table.ok()) return done(table.status());
  std::shared_ptr<Table> t = *table;
  const DataType value_dtype = request.value_dtype();
  absl::Status wire = shard_internal::CheckValueDtype(value_dtype);
  if (wire.ok()) wire = shard_internal::WidenNarrowGradients(grads);
  if (!wire.ok()) return done(wire);
  PushInput in{request.job(), request.worker(), request.generation(), request.step(), request.lr(), &request.keys(),
               &grads, request.extra_batches(), request.empty()};
  auto idx = std::make_shared<std::vector<size_t>>();
  std::vector<int64_t> seqs;
  absl::Status s = ApplyPush(*t, in, idx.get(), response->mutable_push(), &seqs);
  if (!s.ok()) return done(s);
  NotifyWaiters();
  // A replicated table's callers also wait for the backups to hold the
  // update (and under SYNC the step's result).
  if (t->replica != nullptr) {
    KickReplication();
  } else {
    seqs.clear();
  }
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
  WhenReadyAsync(
      t, *idx, by_clock, threshold, options.deadline,
      [this, t, idx, response, values, value_dtype, done = std::move(done)](absl::Status s) {
        if (s.ok()) Snapshot(*t, *idx, value_dtype, response->mutable_versions(), values, response->mutable_vacant_ranks());
        done(s);
      },
      std::move(seqs));
}

void ShardStore::StatsAsync(const StatsRequest& request, StatsResponse* response, const CallOptions& /*options*/,
                            StatusCallback done) {
  std::vector<std::shared_ptr<Table>> tables;
  {
    absl::MutexLock lock(&mu_);
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
    if (t->replica != nullptr) FillReplicationStats(*t, s->mutable_replication());
  }
  done(absl::OkStatus());
}

void ShardStore::DropTableAsync(const DropTableRequest& request, DropTableResponse* response,
                                const CallOptions& /*options*/, StatusCallback done) {
  std::shared_ptr<Table> table;
  uint64_t newer = 0;
  {
    absl::MutexLock lock(&mu_);
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
