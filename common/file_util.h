// Files that are either whole or absent: written to a temporary name in the
// same directory, fsynced, renamed over the target, and the directory fsynced.
#ifndef PSTRAIN_COMMON_FILE_UTIL_H_
#define PSTRAIN_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// fsyncs a directory, so a rename inside it is durable.
void SyncDirectory(const std::string& dir);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_FILE_UTIL_H_
