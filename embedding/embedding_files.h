// A shard's embedding tables in a checkpoint file, written and read as a
// stream: memory beyond the tables is one stripe's rows and an I/O buffer,
// however large the tables.
//
// Format (little-endian): the magic "PSEMB01\n"; the EmbeddingFileHeader's
// length (uint32, at most 1 MiB) and bytes; blocks of rows, each a table
// index (uint32) and a row count (uint32, at most 65536), then per row its
// id (int64), last step (int64), count (uint32), value (dim float32) and
// optimizer slots (float32); an end block (table index 0xffffffff, count 0)
// and the crc32 of every byte before it. Each row is copied under its
// stripe's lock (EmbeddingTable::ForEachRow): its value and slots are from
// one state, never torn between two updates.
//
// An incremental file (header.base_id nonzero) writes whole only the rows
// changed since its base checkpoint; the others come in blocks of ids (the
// table index with its top bit set, a count, then the ids as int64), so the
// file still names every row the shard holds: a restore reads the base
// first, and drops the rows the newest file no longer names (evicted).
#ifndef PSTRAIN_EMBEDDING_EMBEDDING_FILES_H_
#define PSTRAIN_EMBEDDING_EMBEDDING_FILES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "embedding/embedding_table.h"
#include "proto/embedding.pb.h"

namespace pstrain {

struct EmbeddingFileInfo {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;  // of the whole file
  int64_t rows = 0;            // written whole
  int64_t unchanged_rows = 0;  // written by id alone
  bool incremental = false;    // header.base_id set
};

// Writes `tables` (in the header's order; several parts of each, a shard
// that leads several slots: tables[k * n + t] is a part of the header's
// table t) to `path` (absolute, already confined by the caller): under a
// temporary name in the same directory, fsynced, then renamed over `path`.
// On failure nothing is left behind. `changed_since` (empty, or one epoch
// per part; header.base_id must then be set where any is nonzero): the
// rows of part i unchanged since changed_since[i] are written by id alone.
absl::StatusOr<EmbeddingFileInfo> WriteEmbeddingFile(const std::string& path, const EmbeddingFileHeader& header,
                                                     const std::vector<const EmbeddingTable*>& tables,
                                                     const std::vector<uint32_t>& changed_since = {});

// Reads a file written by WriteEmbeddingFile into `tables`, which must be the
// file's tables (same names, dims and optimizer kinds, in order; else
// INVALID_ARGUMENT), inserting the rows for which keep(table, id) holds.
// DATA_LOSS for a file cut short, altered (its crc32) or malformed; rows
// read before the error are already in `tables`, so callers read into
// tables they discard on error. `header` (may be null) gets the header.
// The ids of an incremental file's unchanged rows mark those rows
// (EmbeddingTable::MarkRow); one the tables lack is DATA_LOSS (its base
// was not read first).
absl::Status ReadEmbeddingFile(const std::string& path, const std::vector<EmbeddingTable*>& tables,
                               const std::function<bool(size_t table, int64_t id)>& keep, EmbeddingFileHeader* header);

// Reads a checkpoint and the checkpoints it is incremental on: chain[0] is
// a full checkpoint's files (every shard's), each later element the files
// of one incremental on the one before it, the newest last. Each later
// checkpoint's files are read twice: first the rows they name (by id or
// whole) are kept and the others dropped (evicted meanwhile), then their
// rows written whole replace the older ones. The tables end as the newest
// checkpoint's shards held them, and never hold more rows than those did
// at one of the checkpoints: a table at its eviction cap drops none. DATA_LOSS where the chain does not hold
// together (a file incremental on another checkpoint than the one before
// it, files of two checkpoints in one element). Returns the newest
// checkpoint's id (0: its files record none).
absl::StatusOr<uint64_t> ReadEmbeddingChain(const std::vector<std::vector<std::string>>& chain,
                                            const std::vector<EmbeddingTable*>& tables,
                                            const std::function<bool(size_t table, int64_t id)>& keep);

// The header alone (which tables, of which job and shard): what a reader
// needs to make the tables ReadEmbeddingFile fills.
absl::StatusOr<EmbeddingFileHeader> ReadEmbeddingFileHeader(const std::string& path);

// Every row of a checkpoint's embedding files (written by any number of
// shards; a chain as ReadEmbeddingChain reads it), in tables of this
// process with the first file's configs and no memory budget: what an
// export or a check of a checkpoint reads.
absl::StatusOr<std::vector<std::unique_ptr<EmbeddingTable>>> ReadEmbeddingFiles(
    const std::vector<std::vector<std::string>>& chain);

}  // namespace pstrain

#endif  // PSTRAIN_EMBEDDING_EMBEDDING_FILES_H_
