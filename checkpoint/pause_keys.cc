#include "checkpoint/pause_keys.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

std::string PauseVotesKey(int64_t pause_id) { return absl::StrCat("pause/", pause_id, "/votes"); }
std::string PauseStepKey(int64_t pause_id) { return absl::StrCat("pause/", pause_id, "/step"); }
namespace {

// "ckpt/<id>/" for stage 0, "ckpt/<id>/stage-<s>/" after it.
std::string StagePrefix(int64_t pause_id, int stage) {
  return stage == 0 ? absl::StrCat("ckpt/", pause_id, "/") : absl::StrCat("ckpt/", pause_id, "/stage-", stage, "/");
}

}  // namespace

std::string CheckpointPathKey(int64_t pause_id, int stage) { return StagePrefix(pause_id, stage) + "path"; }
std::string CheckpointSavedKey(int64_t pause_id, int stage) { return StagePrefix(pause_id, stage) + "saved"; }
std::string CheckpointBuffersPathKey(int64_t pause_id) { return absl::StrCat("ckpt/", pause_id, "/buffers_path"); }
std::string CheckpointBuffersSavedKey(int64_t pause_id) { return absl::StrCat("ckpt/", pause_id, "/buffers_saved"); }

bool IsCheckpointPathKey(const std::string& key) {
  return absl::StartsWith(key, "ckpt/") && (absl::EndsWith(key, "/path") || absl::EndsWith(key, "/buffers_path"));
}

bool IsCheckpointSavedKey(const std::string& key) {
  return absl::StartsWith(key, "ckpt/") && (absl::EndsWith(key, "/saved") || absl::EndsWith(key, "/buffers_saved"));
}

int CheckpointSavedKeyWriter(const std::string& key) {
  const size_t mark = key.rfind("/stage-");
  if (mark == std::string::npos) return 0;
  // ckpt/<id>/stage-<s>/saved: <s> a plain decimal in 1..64 (kMaxStages).
  absl::string_view rest = absl::string_view(key).substr(mark + 7);
  if (!absl::ConsumeSuffix(&rest, "/saved")) return -1;
  if (rest.empty() || rest.size() > 2 || rest[0] == '0') return -1;
  int stage = 0;
  for (char c : rest) {
    if (c < '0' || c > '9') return -1;
    stage = stage * 10 + (c - '0');
  }
  return stage <= 64 ? stage : -1;
}

}  // namespace pstrain
