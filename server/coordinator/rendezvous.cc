#include "server/coordinator/rendezvous.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace pstrain {
namespace {

absl::Status CheckKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxKvKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a key must have 1 to ", kMaxKvKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

void Rendezvous::Open(const std::string& job, uint64_t attempt) {
  absl::MutexLock lock(&mu_);
  Table& t = tables_[job];
  t = Table();
  t.attempt = attempt;
  t.open = true;
  changed_.SignalAll();
}

void Rendezvous::Close(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(job);
  if (it == tables_.end()) return;
  it->second.open = false;
  it->second.kv.clear();
  it->second.bytes = 0;
  changed_.SignalAll();
}

void Rendezvous::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

absl::StatusOr<Rendezvous::Table*> Rendezvous::Access(const std::string& job, uint64_t attempt) {
  auto it = tables_.find(job);
  if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no job '", Quote(job), "'"));
  Table& t = it->second;
  if (attempt != t.attempt || !t.open) {
    return absl::AbortedError(absl::StrCat("job ", Quote(job), " is at attempt ", t.attempt,
                                           t.open ? "" : " (ended or requeued)", "; this request is of attempt ",
                                           attempt, ", which has ended"));
  }
  return &t;
}

absl::Status Rendezvous::Put(Table& table, const std::string& job, const std::string& key, std::string value) {
  auto it = table.kv.find(key);
  const size_t old = it == table.kv.end() ? 0 : key.size() + it->second.size();
  if ((it == table.kv.end() && table.kv.size() >= limits_.max_keys) ||
      table.bytes - old + key.size() + value.size() > limits_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", Quote(job), "'s rendezvous store is full (",
                                                     limits_.max_keys, " keys, ", limits_.max_bytes,
                                                     " bytes at most)"));
  }
  table.bytes = table.bytes - old + key.size() + value.size();
  table.kv[key] = std::move(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status Rendezvous::Set(const std::string& job, uint64_t attempt, const std::string& key,
                             const std::string& value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a value is limited to ", limits_.max_value_bytes, " bytes; got ", value.size()));
  }
  absl::MutexLock lock(&mu_);
  auto table = Access(job, attempt);
  if (!table.ok()) return table.status();
  return Put(**table, job, key, value);
}

absl::StatusOr<std::string> Rendezvous::Get(const std::string& job, uint64_t attempt, const std::string& key,
                                            absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto table = Access(job, attempt);
    if (!table.ok()) return table.status();
    auto it = (*table)->kv.find(key);
    if (it != (*table)->kv.end()) return it->second;
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    if (absl::Now() >= deadline) {
      return absl::NotFoundError(absl::StrCat("key '", Quote(key), "' of job ", Quote(job), " was not set in time"));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<int64_t> Rendezvous::Add(const std::string& job, uint64_t attempt, const std::string& key,
                                        int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto table = Access(job, attempt);
  if (!table.ok()) return table.status();
  auto it = (*table)->kv.find(key);
  int64_t n = 0;
  if (it != (*table)->kv.end() && !it->second.empty() && !absl::SimpleAtoi(it->second, &n)) {
    return absl::FailedPreconditionError(absl::StrCat("key '", Quote(key), "' does not hold a number"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(n, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrCat("key '", Quote(key), "' holds ", n, "; adding ", delta, " overflows"));
  }
  absl::Status s = Put(**table, job, key, std::to_string(sum));
  if (!s.ok()) return s;
  return sum;
}

}  // namespace pstrain
