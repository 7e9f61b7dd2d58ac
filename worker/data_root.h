// Where a worker reads a job's files from: the data files a spec names
// (data.dir and the idx files in it, data.train_csv, data.test_csv) and
// TorchScript models (model: torchscript:<path>), all relative to the
// worker's --data_root, and how much of them it reads.
//
// A job spec is written by a user, not by whoever runs the worker: without
// this a spec could name any file the worker can read (its cluster token, a
// TLS key) or a device that never ends (/dev/zero), and take a pool worker
// down on every requeue. So a name is refused when it is absolute, has a
// "." or ".." component, a NUL or control byte, or leads (through a symbolic
// link) outside the root; only regular files are read (a FIFO, device or
// directory is refused after opening, from the opened descriptor), and at
// most --max_data_file_bytes of them, on disk and decompressed (a gzip bomb
// stops there).
#ifndef PSTRAIN_WORKER_DATA_ROOT_H_
#define PSTRAIN_WORKER_DATA_ROOT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

struct DataRoot {
  // The directory (--data_root); empty: this process reads no job files.
  std::string dir;
  // The most bytes read of one file (--max_data_file_bytes): its size on
  // disk and, for a gzip file, its decompressed size.
  uint64_t max_file_bytes = uint64_t{4} << 30;
};

// What messages call the root, so that a person knows which flag to change.
inline constexpr char kDataRootName[] = "the worker's --data_root";

// The contents of `name`, a path relative to root.dir that a job spec gave
// (see the file comment for what is refused). With `maybe_gzip`, a file that
// starts with gzip's magic bytes is decompressed. Errors name the file
// (quoted, bounded) and the flag to change.
absl::StatusOr<std::string> ReadDataFile(const DataRoot& root, absl::string_view name, bool maybe_gzip);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_ROOT_H_
