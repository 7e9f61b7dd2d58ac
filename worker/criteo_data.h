// Criteo's click logs, as the Kaggle Display Advertising Challenge and the
// Terabyte release ship them, read as a stream of batches.
//
// A line is 40 tab-separated columns: the label (0 or 1), 13 integer
// features and 26 categorical features, each a hashed value written in hex
// (8 digits in Criteo's files). Any feature may be empty (missing). Lines
// end in '\n' (a '\r' before it is dropped); an empty line is skipped and is
// no example. Files may be gzip or plain: zlib reads both.
//
// What a batch holds, per example:
//  - dense: the 13 integer features as log(1 + max(x, 0)), the transform of
//    DLRM's reference data loader (negative counts, which the Kaggle set
//    has in its second column, become 0); a missing value is 0;
//  - sparse: per field, the hex parsed as uint64 and cast to int64 (the id
//    is already a hash; embedding tables key rows by any int64). A missing
//    value is kCriteoMissingId, the same in every field: each field is its
//    own table, so "missing" is one row per table. (A 16-digit id
//    ffffffffffffffff would read as the same -1; Criteo's ids are 8 digits.)
//
// Criteo has exactly one id per field per example, but the layout is the
// general one (offsets and ids per field, as torch's EmbeddingBag and
// DLRM's lS_o / lS_i take them) so that multi-hot fields fit later.
//
// Every input is hostile: a line longer than max_line_bytes is refused
// before it is buffered whole (a 1 GB line never allocates 1 GB), as is a
// wrong column count, a label other than 0 or 1, a non-integer count or a
// non-hex id; the error names the file and line and quotes a bounded part
// of the bad text. A truncated gzip file is an error, not a short epoch.
#ifndef PSTRAIN_WORKER_CRITEO_DATA_H_
#define PSTRAIN_WORKER_CRITEO_DATA_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

inline constexpr int kCriteoDenseFields = 13;
inline constexpr int kCriteoSparseFields = 26;
inline constexpr int kCriteoColumns = 1 + kCriteoDenseFields + kCriteoSparseFields;
inline constexpr int64_t kCriteoMissingId = -1;

// Examples in columns. For field f, example i's ids are
// sparse_ids[f][sparse_offsets[f][i] .. sparse_offsets[f][i + 1]); after
// Clear or the first example, sparse_offsets[f] has size() + 1 entries.
struct CriteoBatch {
  std::vector<float> labels;  // 0 or 1, one per example
  std::vector<float> dense;   // kCriteoDenseFields per example, row-major
  std::array<std::vector<int64_t>, kCriteoSparseFields> sparse_offsets;
  std::array<std::vector<int64_t>, kCriteoSparseFields> sparse_ids;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  // Empties the batch (every sparse_offsets[f] becomes {0}), keeping its
  // capacity: a reader's batches reuse it.
  void Clear();
};

struct CriteoParseOptions {
  // false: dense holds the counts as written (missing still 0), for a model
  // that wants its own transform.
  bool log_transform = true;
};

// Parses one line (without its '\n') and appends its example to *batch.
// On error the batch is unchanged and the message quotes the bad column;
// the caller adds the file and line.
absl::Status ParseCriteoLine(absl::string_view line, const CriteoParseOptions& options, CriteoBatch* batch);

struct CriteoReaderOptions {
  CriteoParseOptions parse;
  // This reader keeps example i (counting from 0 in the file, empty lines
  // not counted) when i % world == rank: each of `world` workers reads its
  // own share of one file. Lines of other ranks are split off but not
  // parsed, so a bad one fails the rank that owns it.
  int rank = 0;
  int world = 1;
  // The longest line accepted, '\n' excluded. Criteo's lines are under
  // 1 KiB; the bound is what a hostile file can make the reader allocate.
  size_t max_line_bytes = 64 << 10;
  // Refuse `path` when its last component is a symbolic link: what a
  // caller sets for a name from a job spec it resolved under a root.
  bool no_follow = false;
  // Bytes handed to zlib per read.
  size_t read_chunk_bytes = 1 << 20;
};

// Reads one file from start to end, sequentially. Not thread-safe: one
// thread calls ReadBatch at a time. Owns its open file until destroyed.
class CriteoReader {
 public:
  // Opens `path` as given: a caller holding a name from a job spec confines
  // it first (worker/data_root.h, ResolveUnderRoot). Only a regular file is
  // opened (a FIFO or device is refused without blocking).
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(const std::string& path,
                                                            const CriteoReaderOptions& options);
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // Clears *batch and fills it with up to max_examples of this rank's next
  // examples; fewer only at the end of the file, and 0 after it. An error
  // is final: later calls return it again.
  absl::Status ReadBatch(int64_t max_examples, CriteoBatch* batch);

  // Reads the next per_rank * world examples (fewer only at the end of the
  // file) and parses those of ranks[k] into *out[k] (cleared first): each
  // listed rank's next per_rank examples, as its own reader's ReadBatch
  // would give them, and the others' lines passed over unparsed. A worker
  // covering vacant ranks reads its batch and theirs in one pass; every
  // read of a file must then be a ReadRanks (ReadBatch stops within a
  // window). Returns how many examples (of every rank) it read. An error
  // is final as for ReadBatch.
  absl::StatusOr<int64_t> ReadRanks(int64_t per_rank, const std::vector<int>& ranks,
                                    const std::vector<CriteoBatch*>& out);

  // Reads the rest of the file without parsing it and returns how many
  // examples (non-empty lines) of every rank it held: on a new reader, the
  // file's examples. After it, ReadBatch returns no more. An error is final
  // as for ReadBatch.
  absl::StatusOr<int64_t> CountRemainingExamples();

  // Lines consumed so far (the number of the last line read, from 1).
  int64_t line_number() const { return line_number_; }

 private:
  CriteoReader(std::string path, const CriteoReaderOptions& options, void* gz);
  // The next line into *line (valid until the next call); false at the end.
  absl::StatusOr<bool> NextLine(absl::string_view* line);
  // The next example's line and its index among every rank's (empty lines
  // are none); false at the end, or on an error (in error_).
  bool NextExample(absl::string_view* line, int64_t* index);
  absl::Status Fill();
  absl::Status LineError(absl::string_view what) const;

  const std::string path_;
  const CriteoReaderOptions options_;
  void* gz_;                  // zlib's gzFile, kept out of this header
  std::vector<char> buffer_;  // read_chunk_bytes
  size_t begin_ = 0, end_ = 0;  // the unconsumed bytes of buffer_
  bool eof_ = false;
  std::string carry_;  // a line that spans reads; never above max_line_bytes
  int64_t line_number_ = 0;
  int64_t example_index_ = 0;  // examples (non-empty lines) seen, of every rank
  absl::Status error_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CRITEO_DATA_H_
