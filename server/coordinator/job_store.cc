#include "server/coordinator/job_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pstrain {
namespace {

// SQLite's result codes by what the caller should do about them.
absl::StatusCode SqlCode(int rc) {
  switch (rc & 0xff) {  // the primary code
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return absl::StatusCode::kPermissionDenied;
    case SQLITE_CANTOPEN:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_IOERR:
      return absl::StatusCode::kDataLoss;
    case SQLITE_TOOBIG:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status SqlError(sqlite3* db, const std::string& what) {
  return absl::Status(SqlCode(sqlite3_errcode(db)), absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db)));
}

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    ok_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) == SQLITE_OK;
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return ok_; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void BindText(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  std::string Column(int i) {
    const void* p = sqlite3_column_blob(stmt_, i);
    return p == nullptr ? "" : std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, i));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  bool ok_ = false;
};

absl::StatusOr<StoredJob> RowToJob(Statement& st) {
  StoredJob job;
  job.id = st.Column(0);
  job.seq = sqlite3_column_int64(st.get(), 1);
  job.spec_yaml = st.Column(2);
  job.output_dir = st.Column(3);
  if (!job.status.ParseFromString(st.Column(4))) {
    return absl::DataLossError(absl::StrCat("job store: the status of ", job.id, " is corrupt"));
  }
  return job;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = absl::Status(SqlCode(rc),
        absl::StrCat("cannot open job store ", path, ": ", db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  absl::MutexLock lock(&store->mu_);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                          "CREATE TABLE IF NOT EXISTS jobs ("
                          "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                          "  id TEXT UNIQUE NOT NULL,"
                          "  spec_yaml BLOB NOT NULL,"
                          "  output_dir BLOB NOT NULL,"
                          "  status BLOB NOT NULL)",
                          // One row per counter the coordinator keeps
                          // beside its jobs (NextIncarnation).
                          "CREATE TABLE IF NOT EXISTS counters ("
                          "  name TEXT PRIMARY KEY,"
                          "  value INTEGER NOT NULL)"}) {
    absl::Status s = store->Exec(sql);
    if (!s.ok()) return s;
  }
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("job store: ", sql, ": ", err ? err : "?"));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredJob> JobStore::Create(const std::string& spec_yaml,
                                           const std::string& output_dir, JobStatus status) {
  absl::MutexLock lock(&mu_);
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  // The id follows the row's sequence number, so ids are never reused.
  Statement insert(db_, "INSERT INTO jobs (id, spec_yaml, output_dir, status) VALUES (?, ?, ?, ?)");
  const std::string placeholder = absl::StrCat("pending-", reinterpret_cast<uintptr_t>(&status));
  insert.BindText(1, placeholder);
  insert.Bind(2, spec_yaml);
  insert.Bind(3, output_dir);
  insert.Bind(4, "");
  if (!insert.ok() || sqlite3_step(insert.get()) != SQLITE_DONE) {
    Exec("ROLLBACK");
    return SqlError(db_, "insert");
  }
  StoredJob job;
  job.seq = sqlite3_last_insert_rowid(db_);
  job.id = absl::StrFormat("job-%06d", job.seq);
  status.set_job_id(job.id);
  job.status = std::move(status);
  job.spec_yaml = spec_yaml;
  job.output_dir = output_dir;
  Statement update(db_, "UPDATE jobs SET id = ?, status = ? WHERE seq = ?");
  update.BindText(1, job.id);
  update.Bind(2, job.status.SerializeAsString());
  sqlite3_bind_int64(update.get(), 3, job.seq);
  if (!update.ok() || sqlite3_step(update.get()) != SQLITE_DONE) {
    Exec("ROLLBACK");
    return SqlError(db_, "insert");
  }
  s = Exec("COMMIT");
  if (!s.ok()) return s;
  return job;
}

absl::Status JobStore::Update(const JobStatus& status) {
  absl::MutexLock lock(&mu_);
  Statement st(db_, "UPDATE jobs SET status = ? WHERE id = ?");
  st.Bind(1, status.SerializeAsString());
  st.BindText(2, status.job_id());
  if (!st.ok() || sqlite3_step(st.get()) != SQLITE_DONE) return SqlError(db_, "update");
  if (sqlite3_changes(db_) != 1) {
    return absl::NotFoundError(absl::StrCat("no job ", status.job_id(), " in the job store"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Delete(const std::vector<std::string>& ids) {
  if (ids.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  for (const std::string& id : ids) {
    Statement st(db_, "DELETE FROM jobs WHERE id = ?");
    st.BindText(1, id);
    if (!st.ok() || sqlite3_step(st.get()) != SQLITE_DONE) {
      absl::Status e = SqlError(db_, "delete");
      Exec("ROLLBACK");
      return e;
    }
  }
  return Exec("COMMIT");
}

absl::StatusOr<int64_t> JobStore::NextIncarnation() {
  absl::MutexLock lock(&mu_);
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  Statement bump(db_,
                 "INSERT INTO counters (name, value) VALUES ('incarnation', 1) "
                 "ON CONFLICT(name) DO UPDATE SET value = value + 1");
  Statement read(db_, "SELECT value FROM counters WHERE name = 'incarnation'");
  if (!bump.ok() || sqlite3_step(bump.get()) != SQLITE_DONE || !read.ok() ||
      sqlite3_step(read.get()) != SQLITE_ROW) {
    absl::Status e = SqlError(db_, "incarnation");
    Exec("ROLLBACK");
    return e;
  }
  const int64_t value = sqlite3_column_int64(read.get(), 0);
  s = Exec("COMMIT");  // synchronous=FULL: on disk when this returns
  if (!s.ok()) return s;
  return value;
}

absl::StatusOr<StoredJob> JobStore::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Statement st(db_, "SELECT id, seq, spec_yaml, output_dir, status FROM jobs WHERE id = ?");
  st.BindText(1, id);
  if (!st.ok()) return SqlError(db_, "get");
  if (sqlite3_step(st.get()) != SQLITE_ROW) return absl::NotFoundError(absl::StrCat("no job ", id));
  return RowToJob(st);
}

absl::StatusOr<std::vector<StoredJob>> JobStore::List() {
  absl::MutexLock lock(&mu_);
  Statement st(db_, "SELECT id, seq, spec_yaml, output_dir, status FROM jobs ORDER BY seq");
  if (!st.ok()) return SqlError(db_, "list");
  std::vector<StoredJob> out;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    auto job = RowToJob(st);
    if (!job.ok()) return job.status();
    out.push_back(std::move(*job));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "list");
  return out;
}

}  // namespace pstrain
