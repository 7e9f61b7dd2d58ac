#include "embedding/embedding_store.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/quote.h"
#include "embedding/embedding_store_internal.h"
#include "embedding/embedding_table.h"
#include "embedding/row_math.h"
#include "google/protobuf/util/message_differencer.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ids and values travel as little-endian bytes");

namespace pstrain {

using embedding_internal::Finite;
using embedding_internal::Invalid;
using embedding_internal::kMaxJobBytes;
using embedding_internal::kMaxReplicas;
using embedding_internal::kMaxTargetBytes;
using embedding_internal::kMaxStep;
using embedding_internal::kMaxTables;
using embedding_internal::kMaxWorkers;
using embedding_internal::Leads;
using embedding_internal::Pending;
EmbeddingStore::EmbeddingStore(EmbeddingStoreOptions options) : options_(std::move(options)) {}

EmbeddingStore::~EmbeddingStore() { Shutdown(); }

void EmbeddingStore::Shutdown() {
  std::map<Key, std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    jobs.swap(jobs_);
  }
  for (auto& [name, job] : jobs) {
    absl::MutexLock lock(&job->mu);
    job->gone = job->shut_down = true;
    job->changed.SignalAll();
  }
}

namespace {

absl::Status CheckInit(const InitEmbeddingsRequest& r) {
  if (r.job().empty() || r.job().size() > kMaxJobBytes) return Invalid(r.job(), "the job name must be 1 to 256 bytes");
  if (r.num_workers() < 1 || r.num_workers() > kMaxWorkers) return Invalid(r.job(), "num_workers must be in 1..4096");
  if (r.consistency() != ASYNC && r.consistency() != SYNC && r.consistency() != SSP) {
    return Invalid(r.job(), "consistency must be async, sync or ssp");
  }
  if (r.staleness() > 1000000) return Invalid(r.job(), "staleness must be at most 1000000");
  if (r.num_shards() < 1 || r.num_shards() > 65536 || r.shard_index() >= r.num_shards()) {
    return Invalid(r.job(), "shard_index must be below num_shards (1..65536)");
  }
  if (r.tables_size() < 1 || r.tables_size() > kMaxTables) return Invalid(r.job(), "1 to 64 tables");
  if (r.replicas() >= r.num_shards() || r.replicas() > kMaxReplicas) {
    return Invalid(r.job(), absl::StrCat("replicas must be below num_shards and at most ", kMaxReplicas));
  }
  if (r.replicas() > 0 && r.routing().targets_size() != static_cast<int>(r.num_shards())) {
    return Invalid(r.job(), "replicated tables need the routing's address of every shard");
  }
  for (const std::string& t : r.routing().targets()) {
    if (t.empty() || t.size() > kMaxTargetBytes) {
      return Invalid(r.job(), absl::StrCat("routing target '", Quote(t), "' must be 1..", kMaxTargetBytes,
                                           " bytes (host:port)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<EmbeddingStore::Job>> EmbeddingStore::MakeJob(const InitEmbeddingsRequest& request,
                                                                             uint32_t slot, int64_t start_step) {
  absl::Status s = CheckInit(request);
  if (!s.ok()) return s;
  auto job = std::make_shared<Job>();
  job->name = request.job();
  job->self = request.shard_index();
  job->init = request;
  job->init.set_shard_index(slot);
  for (int i = 0; i < request.tables_size(); ++i) {
    auto table = EmbeddingTable::Create(request.tables(i), options_.budget, options_.stripes);
    if (!table.ok()) return table.status();
    *job->init.mutable_tables(i) = (*table)->config();
    if (!job->table_index.emplace(request.tables(i).name(), i).second) {
      return Invalid(request.job(), absl::StrCat("two tables are named '", Quote(request.tables(i).name()), "'"));
    }
    job->tables.push_back(std::move(*table));
  }
  absl::MutexLock lock(&job->mu);
  // A restored job continues at start_step: every rank's earlier steps count
  // as sent and applied.
  job->claimed.assign(request.num_workers(), start_step);
  job->applied.assign(request.num_workers(), start_step);
  job->active.assign(request.num_workers(), 1);
  job->steps = job->released = start_step;
  job->max_step = start_step;
  job->pending.resize(job->tables.size());
  job->pending_ranks.assign(request.num_workers(), 0);
  return job;
}

absl::Status EmbeddingStore::Install(std::vector<std::shared_ptr<Job>> jobs, bool keep_identical, bool* created) {
  std::vector<std::shared_ptr<Job>> replaced;
  *created = false;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the shard is shutting down");
    std::vector<char> keep(jobs.size(), 0);
    size_t fresh = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {  // every slot checked before any is installed
      const InitEmbeddingsRequest& request = jobs[i]->init;
      auto it = jobs_.find(Key(request.job(), request.shard_index()));
      if (it == jobs_.end()) {
        ++fresh;
        continue;
      }
      const uint64_t have = it->second->init.attempt();
      if (request.attempt() < have) {
        return absl::AbortedError(absl::StrCat("job '", Quote(request.job()), "' attempt ", request.attempt(),
                                               " is over: the shard holds attempt ", have));
      }
      if (request.attempt() == have) {
        if (!keep_identical || !google::protobuf::util::MessageDifferencer::Equals(it->second->init, request)) {
          return absl::AlreadyExistsError(absl::StrCat("job '", Quote(request.job()), "' attempt ", have,
                                                       " has other embedding tables on this shard"));
        }
        keep[i] = 1;
      }
    }
    if (fresh > 0 && jobs_.size() + fresh > options_.max_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this shard holds ", jobs_.size(), " embedding slots of jobs, its most"));
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (keep[i]) continue;
      const InitEmbeddingsRequest& request = jobs[i]->init;
      // An earlier attempt's slots go, also those the new one does not hold.
      for (auto it = jobs_.lower_bound(Key(request.job(), 0)); it != jobs_.end() && it->first.first == request.job();) {
        if (it->second->init.attempt() < request.attempt()) {
          replaced.push_back(it->second);
          it = jobs_.erase(it);
        } else {
          ++it;
        }
      }
      jobs_[Key(request.job(), request.shard_index())] = jobs[i];
      *created = true;
    }
  }
  for (const auto& job : replaced) {
    absl::MutexLock lock(&job->mu);
    job->gone = true;
    job->changed.SignalAll();
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStore::Init(const InitEmbeddingsRequest& request, InitEmbeddingsResponse* response) {
  auto jobs = MakeJobs(request, 0);
  if (!jobs.ok()) return jobs.status();
  bool created = false;
  absl::Status s = Install(std::move(*jobs), /*keep_identical=*/true, &created);
  response->set_created(created);
  return s;
}

absl::StatusOr<std::shared_ptr<EmbeddingStore::Job>> EmbeddingStore::FindJob(const std::string& job, uint64_t attempt,
                                                                             const uint32_t* slot) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the shard is shutting down");
  auto it = jobs_.lower_bound(Key(job, slot == nullptr ? 0 : *slot));
  if (slot == nullptr) {  // this shard's own slot
    while (it != jobs_.end() && it->first.first == job && it->second->self != it->first.second) ++it;
  }
  if (it == jobs_.end() || it->first.first != job || (slot != nullptr && it->first.second != *slot)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", Quote(job), "' has no embedding tables", slot == nullptr ? "" : absl::StrCat(" of slot ", *slot),
        " on this shard: call InitEmbeddings first"));
  }
  const uint64_t have = it->second->init.attempt();
  if (attempt != have) {
    return absl::AbortedError(absl::StrCat("job '", Quote(job), "' attempt ", attempt, " is not the shard's (", have,
                                           "); the job was restarted"));
  }
  return it->second;
}

// The tables of a request, checked: each named once and known, its ids a
// whole number of int64, at most kMaxEmbeddingIdsPerRequest, and every id one
// of this shard's (a misrouted id would live where no other worker looks).
absl::Status EmbeddingStore::ParseTables(const Job& job, const google::protobuf::RepeatedPtrField<EmbeddingIds>& in,
                                         std::vector<int>* tables, std::vector<std::vector<int64_t>>* ids) {
  const InitEmbeddingsRequest& init = job.init;
  tables->clear();
  ids->assign(in.size(), {});
  for (int t = 0; t < in.size(); ++t) {
    const EmbeddingIds& e = in.Get(t);
    auto it = job.table_index.find(e.table());
    if (it == job.table_index.end()) {
      return Invalid(init.job(), absl::StrCat("no embedding table '", Quote(e.table()), "'"));
    }
    if (std::find(tables->begin(), tables->end(), it->second) != tables->end()) {
      return Invalid(init.job(), absl::StrCat("table '", Quote(e.table()), "' named twice in one request"));
    }
    tables->push_back(it->second);
    if (e.ids().size() % sizeof(int64_t) != 0) {
      return Invalid(init.job(), absl::StrCat("ids of table '", Quote(e.table()), "' are ", e.ids().size(),
                                              " bytes, not a whole number of int64"));
    }
    const size_t n = e.ids().size() / sizeof(int64_t);
    if (n > kMaxEmbeddingIdsPerRequest) {
      return Invalid(init.job(), absl::StrCat(n, " ids for table '", Quote(e.table()), "'; at most ",
                                              kMaxEmbeddingIdsPerRequest, " per request"));
    }
    std::vector<int64_t>& v = (*ids)[t];
    v.resize(n);
    std::memcpy(v.data(), e.ids().data(), e.ids().size());
    const uint32_t vshards = init.tables(it->second).virtual_shards();
    for (int64_t id : v) {
      if (ShardOfId(id, vshards, init.num_shards()) != init.shard_index()) {
        return Invalid(init.job(),
                       absl::StrCat("id ", id, " of table '", Quote(e.table()), "' belongs to shard ",
                                    ShardOfId(id, vshards, init.num_shards()), ", not to shard ", init.shard_index()));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Whether rank `rank`'s lookup for `step` may be answered. Under SSP the
// other active ranks must have pushed steps 0..step-staleness-1; the
// caller's own steps before `step` are done (it updates a step before it
// looks up the next), also when it took over a lost rank whose last update
// was lost with it.
bool Reached(const InitEmbeddingsRequest& init, int64_t steps, const std::vector<int64_t>& applied,
             const std::vector<char>& active, uint32_t rank, int64_t step) {
  switch (init.consistency()) {
    case SYNC:
      return steps >= step;
    case SSP:
      for (uint32_t r = 0; r < applied.size(); ++r) {
        if (r != rank && active[r] && applied[r] < step - static_cast<int64_t>(init.staleness())) return false;
      }
      return true;
    default:
      return true;
  }
}

}  // namespace

template <typename Request>
absl::StatusOr<EmbeddingStore::Call> EmbeddingStore::OpenCall(const Request& request) {
  const uint32_t slot = request.slot();
  auto found = FindJob(request.job(), request.attempt(), request.has_slot() ? &slot : nullptr);
  if (!found.ok()) return found.status();
  Call call;
  call.job = std::move(*found);
  if (request.rank() >= call.job->init.num_workers()) return Invalid(request.job(), "rank out of range");
  if (request.step() < 0 || request.step() >= kMaxStep) return Invalid(request.job(), "step out of range");
  if (absl::Status s = CheckLeads(*call.job); !s.ok()) return s;
  absl::Status s = ParseTables(*call.job, request.tables(), &call.tables, &call.ids);
  if (!s.ok()) return s;
  return call;
}

absl::Status EmbeddingStore::Lookup(const EmbeddingLookupRequest& request, absl::Time deadline,
                                    EmbeddingLookupResponse* response) {
  auto call = OpenCall(request);
  if (!call.ok()) return call.status();
  Job& job = *call->job;
  const std::vector<int>& tables = call->tables;
  const std::vector<std::vector<int64_t>>& ids = call->ids;
  absl::Status s;
  uint64_t bytes = 0;
  for (size_t t = 0; t < tables.size(); ++t) bytes += ids[t].size() * job.tables[tables[t]]->dim() * sizeof(float);
  if (bytes > options_.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a lookup of job '", Quote(job.name), "' would answer ", bytes,
                                                     " bytes of rows, more than this shard's ",
                                                     options_.max_response_bytes, ": look up fewer ids per request"));
  }
  {
    absl::MutexLock lock(&job.mu);
    if (!job.gone && !Reached(job.init, job.released, job.applied, job.active, request.rank(), request.step())) {
      if (waiters_.fetch_add(1) >= options_.max_waiters) {
        --waiters_;
        return absl::ResourceExhaustedError("too many embedding lookups are waiting on this shard");
      }
      const absl::Time until = std::min(deadline, absl::Now() + options_.max_wait);
      // Also until the slot is handed to another shard (fenced, or a spare
      // caught up): the step is then released there, not here.
      while (!job.gone && Leads(job.self, job.replica.get()) &&
             !Reached(job.init, job.released, job.applied, job.active, request.rank(), request.step())) {
        if (job.replica != nullptr && !job.replica->queue.empty() && !job.replica->sending) {
          // A forward no caller sends (SetWorkers completed a SYNC step for
          // a rank made vacant): the lookups that wait for it send it.
          const int64_t seq = job.replica->queue.back().seq();
          job.mu.Unlock();
          absl::Status sent = AwaitForwarded(job, seq);
          job.mu.Lock();
          if (!sent.ok()) {
            --waiters_;
            return sent;
          }
          continue;
        }
        if (job.changed.WaitWithDeadline(&job.mu, until)) break;
      }
      --waiters_;
    }
    if (job.shut_down) return absl::UnavailableError("the shard is shutting down");
    if (job.gone) {
      return absl::AbortedError(absl::StrCat("job '", Quote(job.name), "''s embeddings were dropped or replaced"));
    }
    if (!Leads(job.self, job.replica.get())) return NotLeading(job);
    if (!Reached(job.init, job.released, job.applied, job.active, request.rank(), request.step())) {
      std::vector<uint32_t> late;
      for (uint32_t r = 0; r < job.applied.size(); ++r) {
        if (job.init.consistency() == SYNC
                ? job.active[r] && job.pending_ranks[r] == 0
                : r != request.rank() && job.active[r] &&
                      job.applied[r] < request.step() - static_cast<int64_t>(job.init.staleness())) {
          late.push_back(r);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", request.step(), " of job '", Quote(job.name), "' still waits for the updates of rank(s) ",
          absl::StrJoin(late.begin(), late.begin() + std::min<size_t>(late.size(), 16), ", ")));
    }
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    EmbeddingTable& table = *job.tables[tables[t]];
    std::string* values = response->add_values();
    values->resize(ids[t].size() * table.dim() * sizeof(float));
    float* out = reinterpret_cast<float*>(values->data());
    s = request.read_only() ? table.Read(ids[t], out) : table.Lookup(ids[t], request.step(), out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStore::Update(const EmbeddingUpdateRequest& request) {
  auto call = OpenCall(request);
  if (!call.ok()) return call.status();
  Job& job = *call->job;
  const std::vector<int>& tables = call->tables;
  const std::vector<std::vector<int64_t>>& ids = call->ids;
  absl::Status s;
  if (request.grads_size() != request.tables_size()) return Invalid(job.name, "one grads entry per table");
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingTable& table = *job.tables[tables[t]];
    const size_t n = ids[t].size() * table.dim();
    if (request.grads(t).size() != n * sizeof(float)) {
      return Invalid(job.name, absl::StrCat("table '", table.config().name(), "' needs ", n * sizeof(float),
                                            " bytes of gradients (", ids[t].size(), " ids x dim ", table.dim(),
                                            " float32), not ", request.grads(t).size()));
    }
    if (table.config().nonfinite() == NONFINITE_REJECT &&
        !Finite(reinterpret_cast<const float*>(request.grads(t).data()), n)) {
      return Invalid(job.name, absl::StrCat("a gradient for table '", table.config().name(),
                                            "' has NaN or Inf; nothing was applied"));
    }
  }
  if ((request.extra_batches() > 0 || request.empty()) && job.init.consistency() != SYNC) {
    return Invalid(job.name, "extra_batches and empty are for SYNC steps (covering vacant ranks)");
  }
  if (request.empty()) {
    for (const auto& t : ids) {
      if (!t.empty() || request.extra_batches() > 0) {
        return Invalid(job.name, "an empty arrival carries no ids and no extra batches");
      }
    }
  }
  if (request.extra_batches() >= job.init.num_workers()) {
    return Invalid(job.name, absl::StrCat("extra_batches ", request.extra_batches(), " of ",
                                          job.init.num_workers(), " ranks"));
  }
  int64_t forwarded = 0;  // replicated: the forward every live backup must hold before the answer
  if (job.init.consistency() == SYNC) {
    s = AddSync(job, request, tables, ids, &forwarded);
    return s.ok() && forwarded > 0 ? AwaitForwarded(job, forwarded) : s;
  }
  {
    // Replicated: the apply and its forward's seq in one order.
    std::optional<absl::MutexLock> ordered;
    if (job.replica != nullptr) ordered.emplace(&job.apply_mu);
    int64_t retry = -1;
    {
      absl::MutexLock lock(&job.mu);
      if (request.step() < job.claimed[request.rank()]) {
        retry = job.replica != nullptr ? job.replica->seq : 0;
      } else {
        job.claimed[request.rank()] = request.step() + 1;
      }
    }
    if (retry >= 0) {  // a retry: answered once what it may have changed is held by the backups
      ordered.reset();
      return retry > 0 ? AwaitForwarded(job, retry) : absl::OkStatus();
    }
    const double scale = 1.0 / job.init.num_workers();
    for (size_t t = 0; t < tables.size(); ++t) {
      s = job.tables[tables[t]]->Update(ids[t], reinterpret_cast<const float*>(request.grads(t).data()),
                                        request.step() + 1, scale, /*create_missing=*/job.replica != nullptr);
      if (!s.ok()) return s;
    }
    if (job.replica != nullptr) {
      absl::MutexLock lock(&job.mu);
      EmbeddingForward f;
      f.set_rank(request.rank());
      f.set_step(request.step());
      forwarded = QueueForward(job, tables, ids, std::move(f));
    }
  }
  if (forwarded > 0 && !(s = AwaitForwarded(job, forwarded)).ok()) return s;
  bool evict = false;
  {
    absl::MutexLock lock(&job.mu);
    job.applied[request.rank()] = std::max(job.applied[request.rank()], request.step() + 1);
    evict = request.step() > job.max_step;
    job.max_step = std::max(job.max_step, request.step());
    job.changed.SignalAll();
  }
  if (evict) {
    for (auto& table : job.tables) table->EvictExpired(request.step());
  }
  return absl::OkStatus();
}

}  // namespace pstrain
