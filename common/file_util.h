// Files that are either whole or absent, confined to a root, read with a
// bound; and the one mapping from errno to a status code.
//
// Writes go to a unique temporary name in the same directory, are fsynced,
// renamed over the target, and the directory is fsynced.
#ifndef PSTRAIN_COMMON_FILE_UTIL_H_
#define PSTRAIN_COMMON_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// The status for a failed system call on a file: ENOENT -> NOT_FOUND,
// EACCES/EPERM/EROFS -> PERMISSION_DENIED, ENOSPC/EDQUOT/EMFILE/ENOMEM ->
// RESOURCE_EXHAUSTED, EEXIST -> ALREADY_EXISTS, ENOTDIR/EISDIR/ELOOP/
// ENAMETOOLONG/EINVAL -> INVALID_ARGUMENT (a bad name), EINTR/EAGAIN/EBUSY
// -> UNAVAILABLE (try again), EIO -> DATA_LOSS, anything else -> INTERNAL.
// The message is "<what> <path>: <strerror>".
absl::Status ErrnoToStatus(int err, absl::string_view what, absl::string_view path);

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);
// Reads a whole file (no size bound: for files of our own, never for a name
// a client gave; see ReadRegularFile).
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Reads a regular file of at most `max_bytes` bytes. Never blocks on a FIFO
// or device (opened non-blocking and refused unless S_ISREG), never follows a
// symbolic link in the last component, never buffers more than max_bytes.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);
// fsyncs a directory, so a rename inside it is durable.
void SyncDirectory(const std::string& dir);

// `name`, a path relative to some root that a client sent, checked by its
// letters alone: refused (INVALID_ARGUMENT) when it is empty, holds a NUL or
// a control character, is absolute, has a ".." or "." component, or is
// longer than 1024 bytes. `root_name` says in the message what it must be
// relative to ("the checkpoint root", "the worker's --data_root").
absl::Status CheckRelativeName(absl::string_view name, absl::string_view root_name = "the checkpoint root");

// `name`, a path relative to `root` that a client sent, resolved to an
// absolute path inside root: refused as CheckRelativeName does, and
// (PERMISSION_DENIED) when its existing part resolves (through symbolic
// links) outside root. The last component is not resolved: open it with
// O_NOFOLLOW. `root` must be absolute and normalized (see CanonicalRoot).
absl::StatusOr<std::string> ResolveUnderRoot(const std::string& root, absl::string_view name,
                                             absl::string_view root_name = "the checkpoint root");
// The absolute, symlink-free form of a root directory, created if missing.
absl::StatusOr<std::string> CanonicalRoot(const std::string& dir);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_FILE_UTIL_H_
