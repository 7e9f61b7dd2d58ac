#include "checkpoint/layout.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {

absl::StatusOr<std::string> PathUnderRoot(const std::string& root, const std::string& path, const char* what) {
  if (path.empty() || path.find('\0') != std::string::npos || path.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", Quote(path), "' is not a usable path"));
  }
  // Symbolic links in the part that exists are resolved: one planted in the
  // tree cannot lead out of the root.
  std::error_code ec;
  std::string abs = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec).string();
  while (abs.size() > 1 && abs.back() == '/') abs.pop_back();
  if (ec || (root != "/" && abs != root && abs.rfind(root + "/", 0) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", Quote(path), "' is outside the checkpoint root ",
                                                   root, " (pstrain-coordinator --checkpoint_root): shards and "
                                                   "workers read and write only there"));
  }
  return abs;
}

std::string RelativeToRoot(const std::string& root, const std::string& dir) {
  if (dir == root) return "";
  if (root == "/") return dir.substr(1);
  return dir.substr(root.size() + 1);
}

std::string JobDir(const std::string& output_dir, const std::string& job_id) {
  return absl::StrCat(output_dir, "/", job_id);
}

std::string CheckpointDir(const std::string& job_dir, int64_t step) {
  return absl::StrCat(job_dir, "/ckpt-", step);
}

std::string PendingCheckpointDir(const std::string& checkpoint_dir) { return checkpoint_dir + ".tmp"; }

absl::Status CommitCheckpoint(const std::string& pending, const std::string& dir, int keep) {
  std::error_code ec;
  // The directory appears whole or not at all.
  std::filesystem::remove_all(dir, ec);
  std::filesystem::rename(pending, dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot rename ", pending, " to"), dir);
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  SyncDirectory(parent.string());
  // Retention: the newest `keep` ckpt-<step> of this job (ckpt-<step>.tmp
  // of one in progress does not parse as a step and is left alone). The
  // non-throwing iteration: nothing here may throw.
  std::vector<std::pair<int64_t, std::filesystem::path>> all;
  std::filesystem::directory_iterator it(parent, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (name.rfind("ckpt-", 0) == 0 && absl::SimpleAtoi(name.substr(5), &step)) all.emplace_back(step, it->path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + static_cast<size_t>(std::max(keep, 1)) < all.size(); ++i) {
    std::filesystem::remove_all(all[i].second, ec);
  }
  return absl::OkStatus();
}

LoadTableRequest RestoreRequest(const CheckpointManifest& manifest, const std::string& dir_name,
                                const std::string& job, uint64_t attempt, const TableConfig& config,
                                const std::vector<std::string>& keys) {
  LoadTableRequest req;
  req.set_job(job);
  req.set_attempt(attempt);
  *req.mutable_config() = config;
  for (const auto& f : manifest.shards) {
    LoadTableRequest::File* file = req.add_files();
    file->set_path(absl::StrCat(dir_name, "/", f.file));
    file->set_crc32(f.crc32);
    file->set_bytes(f.bytes);
  }
  for (const std::string& k : keys) req.add_keys(k);
  return req;
}

}  // namespace pstrain
