#include "embedding/embedding_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "embedding/row_math.h"

namespace pstrain {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'E', 'M', 'B', '0', '1', '\n'};
constexpr uint32_t kMaxHeaderBytes = 1 << 20;
constexpr uint32_t kMaxBlockRows = 1 << 16;
constexpr uint32_t kEndBlock = 0xffffffffu;
// A block of ids (an incremental file's unchanged rows): the table index
// with this bit set.
constexpr uint32_t kIdsBlock = 0x80000000u;
constexpr size_t kBufferBytes = 1 << 20;

uint32_t Crc(uint32_t crc, const void* p, size_t n) {
  return static_cast<uint32_t>(crc32(crc, static_cast<const Bytef*>(p), static_cast<uInt>(n)));
}

// Appends to a file descriptor through a buffer, keeping the crc32 and the
// byte count of everything appended.
class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) { buffer_.reserve(kBufferBytes); }
  void Append(const void* p, size_t n) {
    crc_ = Crc(crc_, p, n);
    bytes_ += n;
    buffer_.append(static_cast<const char*>(p), n);
    if (buffer_.size() >= kBufferBytes) Flush();
  }
  template <typename T>
  void Put(T v) {
    Append(&v, sizeof(v));
  }
  // False once a write failed (errno kept in error()).
  bool Flush() {
    size_t done = 0;
    while (ok() && done < buffer_.size()) {
      const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) error_ = w < 0 ? errno : EIO;
      if (w > 0) done += static_cast<size_t>(w);
    }
    buffer_.clear();
    return ok();
  }
  bool ok() const { return error_ == 0; }
  int error() const { return error_; }
  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  const int fd_;
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  int error_ = 0;
};

absl::Status WriteRows(Writer& w, const std::vector<const EmbeddingTable*>& tables, size_t per_part,
                       const std::vector<uint32_t>& changed_since, EmbeddingFileInfo* info) {
  for (size_t part = 0; part < tables.size(); ++part) {
    const EmbeddingTable& table = *tables[part];
    const uint32_t t = static_cast<uint32_t>(part % per_part);
    // A stripe's rows come in a burst; blocks of them, each with its count:
    // rows written whole in one, the ids of unchanged rows in the other.
    std::string rows, ids;
    uint32_t in_rows = 0, in_ids = 0;
    auto end_block = [&w](uint32_t index, std::string& block, uint32_t& n) {
      if (n == 0) return;
      w.Put<uint32_t>(index);
      w.Put<uint32_t>(n);
      w.Append(block.data(), block.size());
      block.clear();
      n = 0;
    };
    auto put = [](std::string& to, const void* p, size_t n) { to.append(static_cast<const char*>(p), n); };
    absl::Status s = table.ForEachRow(
        [&](const EmbeddingRowView& r) {
          if (r.value == nullptr) {
            put(ids, &r.id, sizeof(r.id));
            ++info->unchanged_rows;
            if (++in_ids == kMaxBlockRows) end_block(t | kIdsBlock, ids, in_ids);
          } else {
            put(rows, &r.id, sizeof(r.id));
            put(rows, &r.last_step, sizeof(r.last_step));
            put(rows, &r.count, sizeof(r.count));
            put(rows, r.value, sizeof(float) * table.dim());
            put(rows, r.slots, sizeof(float) * table.slot_floats());
            ++info->rows;
            if (++in_rows == kMaxBlockRows) end_block(t, rows, in_rows);
          }
          return w.ok() ? absl::OkStatus() : ErrnoToStatus(w.error(), "writing", "an embedding checkpoint");
        },
        changed_since.empty() ? 0 : changed_since[part]);
    if (!s.ok()) return s;
    end_block(t, rows, in_rows);
    end_block(t | kIdsBlock, ids, in_ids);
  }
  w.Put<uint32_t>(kEndBlock);
  w.Put<uint32_t>(0);
  const uint32_t crc = w.crc();
  w.Put<uint32_t>(crc);
  return absl::OkStatus();
}

std::string Directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace

absl::StatusOr<EmbeddingFileInfo> WriteEmbeddingFile(const std::string& path, const EmbeddingFileHeader& header,
                                                     const std::vector<const EmbeddingTable*>& tables,
                                                     const std::vector<uint32_t>& changed_since) {
  const bool incremental =
      std::any_of(changed_since.begin(), changed_since.end(), [](uint32_t e) { return e != 0; });
  if ((!changed_since.empty() && changed_since.size() != tables.size()) || (incremental && header.base_id() == 0)) {
    return absl::InvalidArgumentError("an incremental embedding file needs one epoch per part and its base's id");
  }
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", std::random_device()());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "creating", tmp);
  Writer w(fd);
  w.Append(kMagic, sizeof(kMagic));
  const std::string head = header.SerializeAsString();
  w.Put<uint32_t>(static_cast<uint32_t>(head.size()));
  w.Append(head.data(), head.size());
  EmbeddingFileInfo info;
  info.incremental = header.base_id() != 0;
  if (header.tables_size() == 0 || tables.size() % header.tables_size() != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return absl::InvalidArgumentError(absl::StrCat("an embedding file of ", header.tables_size(), " tables given ",
                                                   tables.size(), " parts of tables"));
  }
  absl::Status s = WriteRows(w, tables, static_cast<size_t>(header.tables_size()), changed_since, &info);
  if (s.ok() && !w.Flush()) s = ErrnoToStatus(w.error(), "writing", tmp);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoToStatus(errno, "syncing", tmp);
  if (::close(fd) != 0 && s.ok()) s = ErrnoToStatus(errno, "closing", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoToStatus(errno, "renaming", tmp);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  SyncDirectory(Directory(path));
  info.bytes = w.bytes();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) info.bytes = static_cast<uint64_t>(st.st_size);
  // Of the whole file, as a checkpoint's manifest lists it. (zlib's crc32
  // of no buffer is its initial value, 0, whatever the running crc.)
  info.crc32 = w.crc();
  return info;
}

namespace {

// Reads a file descriptor through a buffer, keeping the crc32 of every byte
// read.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}
  // False at the end of the file or on an error (error() says which).
  bool Read(void* p, size_t n) {
    char* out = static_cast<char*>(p);
    while (n > 0) {
      if (pos_ == buffer_.size() && !Fill()) return false;
      const size_t k = std::min(n, buffer_.size() - pos_);
      std::memcpy(out, buffer_.data() + pos_, k);
      crc_ = Crc(crc_, out, k);
      pos_ += k;
      out += k;
      n -= k;
    }
    return true;
  }
  bool AtEnd() { return pos_ == buffer_.size() && !Fill() && error_ == 0; }
  uint32_t crc() const { return crc_; }
  int error() const { return error_; }

 private:
  bool Fill() {
    buffer_.resize(kBufferBytes);
    ssize_t r;
    do {
      r = ::read(fd_, buffer_.data(), buffer_.size());
    } while (r < 0 && errno == EINTR);
    if (r < 0) error_ = errno;
    buffer_.resize(r > 0 ? static_cast<size_t>(r) : 0);
    pos_ = 0;
    return r > 0;
  }

  const int fd_;
  std::string buffer_;
  size_t pos_ = 0;
  uint32_t crc_ = 0;
  int error_ = 0;
};

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("embedding checkpoint ", path, ": ", what));
}

absl::Status ReadHeader(const std::string& path, Reader& r, EmbeddingFileHeader* head) {
  char magic[sizeof(kMagic)];
  uint32_t head_bytes = 0;
  if (!r.Read(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(path, "not an embedding checkpoint (no PSEMB01 magic)");
  }
  if (!r.Read(&head_bytes, sizeof(head_bytes)) || head_bytes > kMaxHeaderBytes) return Corrupt(path, "bad header");
  std::string bytes(head_bytes, '\0');
  if (!r.Read(bytes.data(), bytes.size()) || !head->ParseFromString(bytes)) return Corrupt(path, "bad header");
  return absl::OkStatus();
}

// A regular file opened for reading, never through a symbolic link.
absl::StatusOr<int> OpenRegular(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "opening", path);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("embedding checkpoint ", path, " is not a regular file"));
  }
  return fd;
}

absl::Status CheckTables(const std::string& path, const EmbeddingFileHeader& header,
                         const std::vector<EmbeddingTable*>& tables) {
  if (header.tables_size() != static_cast<int>(tables.size())) {
    return absl::InvalidArgumentError(absl::StrCat("embedding checkpoint ", path, " holds ", header.tables_size(),
                                                   " tables, the job ", tables.size()));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingTableConfig& saved = header.tables(static_cast<int>(t));
    const EmbeddingTableConfig& now = tables[t]->config();
    if (saved.name() != now.name() || saved.dim() != now.dim() || saved.optimizer().kind() != now.optimizer().kind()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding checkpoint ", path, ": table ", t, " is '", saved.name().substr(0, 64), "' (dim ", saved.dim(),
          ") there and '", now.name(), "' (dim ", now.dim(), ") in the job, or its optimizer differs"));
    }
  }
  return absl::OkStatus();
}

// What a read of a file does with its entries. kAll: rows written whole
// are put back, ids of unchanged rows mark theirs (one missing is
// DATA_LOSS). A link of a chain is read twice: kMarkIds marks the row of
// every id the file names (whole or not; an unchanged one missing is
// DATA_LOSS) and puts nothing back, kPutRows puts back the rows written
// whole and skips the ids.
enum class ReadMode { kAll, kMarkIds, kPutRows };

absl::Status ReadRows(const std::string& path, Reader& r, const EmbeddingFileHeader& head,
                      const std::vector<EmbeddingTable*>& tables, const std::function<bool(size_t, int64_t)>& keep,
                      ReadMode mode) {
  std::vector<float> row;
  for (;;) {
    uint32_t t = 0, n = 0;
    if (!r.Read(&t, sizeof(t)) || !r.Read(&n, sizeof(n))) return Corrupt(path, "cut short");
    if (t == kEndBlock) return n == 0 ? absl::OkStatus() : Corrupt(path, "a malformed end block");
    const bool ids_only = (t & kIdsBlock) != 0 && head.base_id() != 0;
    if (ids_only) t &= ~kIdsBlock;
    if (t >= tables.size() || n == 0 || n > kMaxBlockRows) return Corrupt(path, "a malformed block of rows");
    EmbeddingTable& table = *tables[t];
    if (ids_only) {
      for (uint32_t i = 0; i < n; ++i) {
        int64_t id = 0;
        if (!r.Read(&id, sizeof(id))) return Corrupt(path, "cut short");
        if (mode == ReadMode::kPutRows || !keep(t, id) || table.MarkRow(id)) continue;
        return Corrupt(path, absl::StrCat("row ", id, " of table '", table.config().name(),
                                          "' is unchanged since checkpoint ", head.base_id(),
                                          ", whose rows do not hold it (read the checkpoint it is incremental on "
                                          "first)"));
      }
      continue;
    }
    row.resize(static_cast<size_t>(table.dim()) + table.slot_floats());
    for (uint32_t i = 0; i < n; ++i) {
      EmbeddingRowView v;
      if (!r.Read(&v.id, sizeof(v.id)) || !r.Read(&v.last_step, sizeof(v.last_step)) ||
          !r.Read(&v.count, sizeof(v.count)) || !r.Read(row.data(), sizeof(float) * row.size())) {
        return Corrupt(path, "cut short");
      }
      if (!keep(t, v.id)) continue;
      if (mode == ReadMode::kMarkIds) {
        table.MarkRow(v.id);  // an older value, replaced by the second read
        continue;
      }
      v.value = row.data();
      v.slots = row.data() + table.dim();
      absl::Status s = table.InsertRow(v);
      if (!s.ok()) return s;
    }
  }
}

// ReadEmbeddingFile's work, in `mode`. `accept` (may be null) judges the
// header this open read before any row is: a file swapped under the reader
// cannot pass one header's checks and give another's rows.
absl::Status ReadFile(const std::string& path, const std::vector<EmbeddingTable*>& tables,
                      const std::function<bool(size_t, int64_t)>& keep, ReadMode mode,
                      const std::function<absl::Status(const EmbeddingFileHeader&)>& accept,
                      EmbeddingFileHeader* header) {
  auto opened = OpenRegular(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  Reader r(fd);
  EmbeddingFileHeader head;
  absl::Status s = [&]() -> absl::Status {
    absl::Status c = ReadHeader(path, r, &head);
    if (c.ok() && accept) c = accept(head);
    if (!c.ok()) return c;
    c = CheckTables(path, head, tables);
    if (!c.ok()) return c;
    c = ReadRows(path, r, head, tables, keep, mode);
    if (!c.ok()) return c;
    const uint32_t want = r.crc();
    uint32_t crc = 0;
    if (!r.Read(&crc, sizeof(crc))) return Corrupt(path, "cut short");
    if (crc != want) return Corrupt(path, absl::StrCat("crc32 ", crc, " recorded, ", want, " read: altered"));
    if (!r.AtEnd()) return Corrupt(path, "bytes after the end block");
    return absl::OkStatus();
  }();
  ::close(fd);
  if (s.ok() && r.error() != 0) s = ErrnoToStatus(r.error(), "reading", path);
  *header = std::move(head);
  return s;
}

}  // namespace

absl::Status ReadEmbeddingFile(const std::string& path, const std::vector<EmbeddingTable*>& tables,
                               const std::function<bool(size_t table, int64_t id)>& keep, EmbeddingFileHeader* header) {
  EmbeddingFileHeader head;
  absl::Status s = ReadFile(path, tables, keep, ReadMode::kAll, nullptr, &head);
  if (s.ok() && header != nullptr) *header = std::move(head);
  return s;
}

absl::StatusOr<EmbeddingFileHeader> ReadEmbeddingFileHeader(const std::string& path) {
  auto opened = OpenRegular(path);
  if (!opened.ok()) return opened.status();
  Reader r(*opened);
  EmbeddingFileHeader head;
  absl::Status s = ReadHeader(path, r, &head);
  ::close(*opened);
  if (!s.ok()) return s;
  return head;
}

absl::StatusOr<uint64_t> ReadEmbeddingChain(const std::vector<std::vector<std::string>>& chain,
                                            const std::vector<EmbeddingTable*>& tables,
                                            const std::function<bool(size_t table, int64_t id)>& keep) {
  uint64_t previous = 0;  // the id of the checkpoint read before
  // Each file's header, as the open that reads its rows read it: of one
  // checkpoint per link, and incremental only on the link before.
  uint64_t id = 0;
  auto check = [&](size_t k, size_t f, const std::string& path, const EmbeddingFileHeader& head) -> absl::Status {
    if (f > 0 && head.checkpoint_id() != id) {
      return Corrupt(path, absl::StrCat("belongs to checkpoint ", head.checkpoint_id(), ", the files beside it to ", id,
                                        ": files of two checkpoints given as one"));
    }
    id = head.checkpoint_id();
    if (head.base_id() != 0 && (k == 0 || head.base_id() != previous)) {
      return Corrupt(path, absl::StrCat("is incremental on checkpoint ", head.base_id(), ", but ",
                                        k == 0 ? std::string("no checkpoint was read before it")
                                               : absl::StrCat("the one read before it is ", previous),
                                        " (its base is gone or was replaced)"));
    }
    return absl::OkStatus();
  };
  for (size_t k = 0; k < chain.size(); ++k) {
    if (chain[k].empty()) return absl::InvalidArgumentError(absl::StrCat("checkpoint ", k, " of a chain has no files"));
    EmbeddingFileHeader head;
    if (k > 0) {
      // First the rows this checkpoint names (every file's ids) keep their
      // place and the rest go, then its rows written whole are put back:
      // the tables never hold more rows than its shards did, so a table
      // at its memory cap evicts none of them.
      std::vector<uint32_t> epochs;
      for (EmbeddingTable* t : tables) epochs.push_back(t->NextEpoch());
      for (size_t f = 0; f < chain[k].size(); ++f) {
        absl::Status s = ReadFile(chain[k][f], tables, keep, ReadMode::kMarkIds,
                                  [&](const EmbeddingFileHeader& h) { return check(k, f, chain[k][f], h); }, &head);
        if (!s.ok()) return s;
      }
      for (size_t t = 0; t < tables.size(); ++t) tables[t]->DropRowsBefore(epochs[t]);
    }
    for (size_t f = 0; f < chain[k].size(); ++f) {
      absl::Status s = ReadFile(chain[k][f], tables, keep, k > 0 ? ReadMode::kPutRows : ReadMode::kAll,
                                [&](const EmbeddingFileHeader& h) { return check(k, f, chain[k][f], h); }, &head);
      if (!s.ok()) return s;
    }
    previous = id;
  }
  return previous;
}

absl::StatusOr<std::vector<std::unique_ptr<EmbeddingTable>>> ReadEmbeddingFiles(
    const std::vector<std::vector<std::string>>& chain) {
  if (chain.empty() || chain.back().empty()) return absl::InvalidArgumentError("no embedding checkpoint files");
  auto header = ReadEmbeddingFileHeader(chain.back().front());
  if (!header.ok()) return header.status();
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  std::vector<EmbeddingTable*> targets;
  for (EmbeddingTableConfig config : header->tables()) {
    // Every shard's rows in one table: no shard's memory cap applies.
    config.mutable_eviction()->set_max_memory_mb(0);
    auto table = EmbeddingTable::Create(config, /*budget=*/nullptr);
    if (!table.ok()) return table.status();
    targets.push_back(table->get());
    tables.push_back(std::move(*table));
  }
  auto read = ReadEmbeddingChain(chain, targets, [](size_t, int64_t) { return true; });
  if (!read.ok()) return read.status();
  return tables;
}

}  // namespace pstrain
