#include "checkpoint/pause_keys.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

std::string PauseVotesKey(int64_t pause_id) { return absl::StrCat("pause/", pause_id, "/votes"); }
std::string PauseStepKey(int64_t pause_id) { return absl::StrCat("pause/", pause_id, "/step"); }
std::string CheckpointPathKey(int64_t pause_id) { return absl::StrCat("ckpt/", pause_id, "/path"); }
std::string CheckpointSavedKey(int64_t pause_id) { return absl::StrCat("ckpt/", pause_id, "/saved"); }
std::string CheckpointBuffersPathKey(int64_t pause_id) { return absl::StrCat("ckpt/", pause_id, "/buffers_path"); }
std::string CheckpointBuffersSavedKey(int64_t pause_id) { return absl::StrCat("ckpt/", pause_id, "/buffers_saved"); }

bool IsCheckpointPathKey(const std::string& key) {
  return absl::StartsWith(key, "ckpt/") && (absl::EndsWith(key, "/path") || absl::EndsWith(key, "/buffers_path"));
}

bool IsCheckpointSavedKey(const std::string& key) {
  return absl::StartsWith(key, "ckpt/") && (absl::EndsWith(key, "/saved") || absl::EndsWith(key, "/buffers_saved"));
}

}  // namespace pstrain
