#include "worker/criteo_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {
namespace {

// How much of a bad cell or line a message quotes.
constexpr size_t kQuoteBytes = 40;
// Limits on the reader's own options, so a typo cannot ask for 1 TB.
constexpr size_t kMaxLineBytesLimit = size_t{1} << 30;
constexpr size_t kMaxChunkBytes = size_t{64} << 20;

gzFile Gz(void* p) { return static_cast<gzFile>(p); }

// "I3" or "C12", the names Criteo's documentation gives columns 2..40.
std::string ColumnName(int column) {
  if (column == 0) return "the label";
  if (column <= kCriteoDenseFields) return absl::StrCat("I", column);
  return absl::StrCat("C", column - kCriteoDenseFields);
}

absl::Status CellError(int column, absl::string_view cell, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("column ", column + 1, " (", ColumnName(column), ") \"",
                                                 Quote(cell, kQuoteBytes), "\" is not ", expected));
}

// 1 to 16 hex digits, nothing else (no sign, no 0x, no spaces): strict, so
// that a shifted column is an error rather than a different id.
bool ParseHexId(absl::string_view cell, uint64_t* out) {
  if (cell.empty() || cell.size() > 16) return false;
  uint64_t v = 0;
  for (char c : cell) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace

void CriteoBatch::Clear() {
  labels.clear();
  dense.clear();
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    sparse_offsets[f].assign(1, 0);
    sparse_ids[f].clear();
  }
}

absl::Status ParseCriteoLine(absl::string_view line, const CriteoParseOptions& options, CriteoBatch* batch) {
  absl::string_view cells[kCriteoColumns];
  int columns = 0;
  for (size_t start = 0;;) {
    const size_t tab = line.find('\t', start);
    const absl::string_view cell = line.substr(start, tab == absl::string_view::npos ? tab : tab - start);
    if (columns < kCriteoColumns) cells[columns] = cell;
    ++columns;
    if (tab == absl::string_view::npos) break;
    start = tab + 1;
  }
  if (columns != kCriteoColumns) {
    return absl::InvalidArgumentError(absl::StrCat("has ", columns, " tab-separated columns, not ", kCriteoColumns,
                                                   " (label, 13 integer, 26 categorical): \"",
                                                   Quote(line, kQuoteBytes), "\""));
  }
  // Parsed into locals first, so a bad line leaves the batch as it was.
  float label;
  if (cells[0] == "0") {
    label = 0;
  } else if (cells[0] == "1") {
    label = 1;
  } else {
    return CellError(0, cells[0], "0 or 1");
  }
  float dense[kCriteoDenseFields];
  for (int j = 0; j < kCriteoDenseFields; ++j) {
    const absl::string_view cell = cells[1 + j];
    int64_t x = 0;
    if (!cell.empty() && !absl::SimpleAtoi(cell, &x)) return CellError(1 + j, cell, "an integer");
    dense[j] = options.log_transform ? static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(x, 0))))
                                     : static_cast<float>(x);
  }
  int64_t ids[kCriteoSparseFields];
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    const int column = 1 + kCriteoDenseFields + f;
    const absl::string_view cell = cells[column];
    uint64_t id = 0;
    if (cell.empty()) {
      ids[f] = kCriteoMissingId;
    } else if (ParseHexId(cell, &id)) {
      ids[f] = static_cast<int64_t>(id);
    } else {
      return CellError(column, cell, "1 to 16 hex digits");
    }
  }
  batch->labels.push_back(label);
  batch->dense.insert(batch->dense.end(), dense, dense + kCriteoDenseFields);
  for (int f = 0; f < kCriteoSparseFields; ++f) {
    std::vector<int64_t>& offsets = batch->sparse_offsets[f];
    if (offsets.empty()) offsets.push_back(0);
    batch->sparse_ids[f].push_back(ids[f]);
    offsets.push_back(static_cast<int64_t>(batch->sparse_ids[f].size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& path,
                                                                 const CriteoReaderOptions& options) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " of world ", options.world, ": need 0 <= rank < world"));
  }
  if (options.max_line_bytes < 1 || options.max_line_bytes > kMaxLineBytesLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_line_bytes ", options.max_line_bytes, " is not in [1, ", kMaxLineBytesLimit, "]"));
  }
  if (options.read_chunk_bytes < 1 || options.read_chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("read_chunk_bytes ", options.read_chunk_bytes, " is not in [1, ", kMaxChunkBytes, "]"));
  }
  // Non-blocking, so that a FIFO does not wait here for a writer; refused
  // below unless it is a regular file.
  // no_follow: the caller confined the directories (ResolveUnderRoot) and
  // the last component must not lead elsewhere (ELOOP if it is a link).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (options.no_follow ? O_NOFOLLOW : 0));
  if (fd < 0) return ErrnoToStatus(errno, "cannot open Criteo file", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "cannot stat Criteo file", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("Criteo file ", Quote(path, 200), " is not a regular file (",
                                                   S_ISDIR(st.st_mode) ? "a directory" : "a device, FIFO or socket",
                                                   ")"));
  }
  (void)::fcntl(fd, F_SETFL, 0);  // regular files never block; reads are plain again
  gzFile gz = gzdopen(fd, "rb");  // reads a plain file as it is
  if (gz == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot open ", Quote(path, 200), " with zlib"));
  }
  return std::unique_ptr<CriteoReader>(new CriteoReader(path, options, gz));
}

CriteoReader::CriteoReader(std::string path, const CriteoReaderOptions& options, void* gz)
    : path_(std::move(path)), options_(options), gz_(gz), buffer_(options.read_chunk_bytes) {}

CriteoReader::~CriteoReader() { gzclose(Gz(gz_)); }

absl::Status CriteoReader::LineError(absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(Quote(path_, 200), ":", line_number_, ": ", what));
}

absl::Status CriteoReader::Fill() {
  const int n = gzread(Gz(gz_), buffer_.data(), static_cast<unsigned>(buffer_.size()));
  int err = Z_OK;
  const char* msg = gzerror(Gz(gz_), &err);
  // zlib keeps a truncated stream's Z_BUF_ERROR ("unexpected end of file")
  // after returning what it could: without this check a cut-off .gz would
  // read as a shorter epoch.
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    const bool truncated = err == Z_BUF_ERROR;
    return absl::DataLossError(absl::StrCat(Quote(path_, 200), ": after line ", line_number_, ": ",
                                            truncated ? "truncated gzip file (the stream ends early)"
                                                      : absl::StrCat("corrupt gzip data (", Quote(msg, 200), ")")));
  }
  begin_ = 0;
  end_ = static_cast<size_t>(n);
  if (n == 0) eof_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> CriteoReader::NextLine(absl::string_view* line) {
  carry_.clear();  // the previous line, if it was returned from here
  while (true) {
    if (begin_ < end_) {
      const char* start = buffer_.data() + begin_;
      const size_t avail = end_ - begin_;
      const void* newline = std::memchr(start, '\n', avail);
      const size_t len = newline ? static_cast<size_t>(static_cast<const char*>(newline) - start) : avail;
      // Checked before appending: carry_ never holds more than the bound.
      if (carry_.size() + len > options_.max_line_bytes) {
        ++line_number_;
        return LineError(absl::StrCat("line longer than ", options_.max_line_bytes,
                                      " bytes (max_line_bytes); it starts \"",
                                      Quote(carry_.empty() ? absl::string_view(start, len) : carry_, kQuoteBytes),
                                      "\""));
      }
      if (newline != nullptr) {
        ++line_number_;
        begin_ += len + 1;
        if (carry_.empty()) {
          *line = absl::string_view(start, len);  // straight from the buffer: no copy
        } else {
          carry_.append(start, len);
          *line = carry_;
        }
        if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
        return true;
      }
      carry_.append(start, len);
      begin_ = end_;
    }
    if (eof_) {
      if (carry_.empty()) return false;
      ++line_number_;  // a last line without '\n'
      *line = carry_;
      if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
      return true;
    }
    if (absl::Status s = Fill(); !s.ok()) return s;
  }
}

absl::StatusOr<int64_t> CriteoReader::CountRemainingExamples() {
  int64_t examples = 0;
  while (error_.ok()) {
    absl::string_view line;
    absl::StatusOr<bool> got = NextLine(&line);
    if (!got.ok()) {
      error_ = got.status();
      break;
    }
    if (!*got) return examples;
    if (line.empty()) continue;
    ++example_index_;
    ++examples;
  }
  return error_;
}

bool CriteoReader::NextExample(absl::string_view* line, int64_t* index) {
  for (;;) {
    absl::StatusOr<bool> got = NextLine(line);
    if (!got.ok()) {
      error_ = got.status();
      return false;
    }
    if (!*got) return false;
    if (line->empty()) continue;  // no example
    *index = example_index_++;
    return true;
  }
}

absl::Status CriteoReader::ReadBatch(int64_t max_examples, CriteoBatch* batch) {
  batch->Clear();
  if (!error_.ok()) return error_;
  if (max_examples < 1) return absl::InvalidArgumentError(absl::StrCat("a batch of ", max_examples, " examples"));
  absl::string_view line;
  int64_t index = 0;
  while (batch->size() < max_examples && NextExample(&line, &index)) {
    if (index % options_.world != options_.rank) continue;
    if (absl::Status s = ParseCriteoLine(line, options_.parse, batch); !s.ok()) {
      error_ = LineError(s.message());
      break;
    }
  }
  if (!error_.ok()) batch->Clear();
  return error_;
}

absl::StatusOr<int64_t> CriteoReader::ReadRanks(int64_t per_rank, const std::vector<int>& ranks,
                                                const std::vector<CriteoBatch*>& out) {
  for (CriteoBatch* b : out) b->Clear();
  if (!error_.ok()) return error_;
  if (per_rank < 1 || ranks.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a read of ", per_rank, " examples of ", ranks.size(),
                                                   " ranks into ", out.size(), " batches"));
  }
  // Where example i goes: the batch of rank i % world, if it is listed.
  std::vector<CriteoBatch*> of_rank(static_cast<size_t>(options_.world), nullptr);
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (ranks[k] < 0 || ranks[k] >= options_.world || of_rank[static_cast<size_t>(ranks[k])] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", ranks[k], " of ", options_.world, ", or listed twice"));
    }
    of_rank[static_cast<size_t>(ranks[k])] = out[k];
  }
  int64_t read = 0;
  absl::string_view line;
  int64_t index = 0;
  while (read < per_rank * options_.world && NextExample(&line, &index)) {
    ++read;
    CriteoBatch* into = of_rank[static_cast<size_t>(index % options_.world)];
    if (into == nullptr) continue;
    if (absl::Status s = ParseCriteoLine(line, options_.parse, into); !s.ok()) {
      error_ = LineError(s.message());
      break;
    }
  }
  if (!error_.ok()) {
    for (CriteoBatch* b : out) b->Clear();
    return error_;
  }
  return read;
}

}  // namespace pstrain
