// Where a shard writes a job's checkpoint files: only under a directory
// named after the job (its <output_dir>/<job>/), so no job's checkpoint is
// written over another's. Shared by the dense and the embedding services.
#ifndef PSTRAIN_SERVER_PS_JOB_PATHS_H_
#define PSTRAIN_SERVER_PS_JOB_PATHS_H_

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// Whether `path` (relative to the checkpoint root) lies in a directory
// named `job`: the job's own <output_dir>/<job>/.
// A path the store refuses anyway (empty, absolute, "..", NUL: its
// INVALID_ARGUMENT says what is wrong) passes here.
inline bool InJobDirectory(const std::string& path, const std::string& job) {
  if (job.empty()) return true;  // standalone runs name no job
  if (path.empty() || path[0] == '/' || path.find('\0') != std::string::npos) return true;
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  for (absl::string_view part : parts) {
    if (part == "..") return true;
  }
  parts.pop_back();  // the file
  for (absl::string_view part : parts) {
    if (part == job) return true;
  }
  return false;
}

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_PS_JOB_PATHS_H_
