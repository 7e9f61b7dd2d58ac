#include "checkpoint/layout.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
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

namespace {

CommitCheckpointTesting& Testing() {
  static CommitCheckpointTesting* t = new CommitCheckpointTesting();
  return *t;
}

void AfterStep(const char* step) {
  if (Testing().after_step) Testing().after_step(step);
}

// Beside <job_dir>/ckpt-<step> while a commit replaces it: the incoming
// directory (.new) and, without RENAME_EXCHANGE, the outgoing one (.old).
// Neither is a ckpt-<step> name, so retention never counts them.
constexpr char kIncomingSuffix[] = ".new";
constexpr char kOutgoingSuffix[] = ".old";

// Swaps `a` and `b` (both exist) in one step: renameat2(RENAME_EXCHANGE).
// EINVAL/ENOSYS/ENOTSUP: the file system cannot (then the caller falls back).
int ExchangePaths(const std::string& a, const std::string& b) {
  if (Testing().no_exchange) return EINVAL;
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
}

// ckpt-<step><suffix>: the ckpt-<step> it belongs to, else "".
std::string LeftoverOf(const std::filesystem::path& path, absl::string_view suffix) {
  const std::string name = path.filename().string();
  int64_t step = 0;
  if (name.rfind("ckpt-", 0) != 0 || !absl::EndsWith(name, suffix) ||
      !absl::SimpleAtoi(absl::string_view(name).substr(5, name.size() - 5 - suffix.size()), &step)) {
    return "";
  }
  std::string dir = path.string();
  dir.resize(dir.size() - suffix.size());
  return dir;
}

}  // namespace

void SetCommitCheckpointTestingForTesting(CommitCheckpointTesting testing) { Testing() = std::move(testing); }

void RecoverCheckpoints(const std::string& job_dir) {
  std::error_code ec;
  std::vector<std::pair<std::filesystem::path, std::string>> outgoing, incoming;
  std::filesystem::directory_iterator it(job_dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (std::string dir = LeftoverOf(it->path(), kOutgoingSuffix); !dir.empty()) outgoing.emplace_back(it->path(), dir);
    if (std::string dir = LeftoverOf(it->path(), kIncomingSuffix); !dir.empty()) incoming.emplace_back(it->path(), dir);
  }
  bool renamed = false;
  for (const auto& [old, dir] : outgoing) {
    if (std::filesystem::exists(dir, ec)) {
      std::filesystem::remove_all(old, ec);  // the new one is in: garbage
    } else {
      // A commit without RENAME_EXCHANGE died between moving the old
      // directory aside and renaming the new one in: the old one comes back.
      std::filesystem::rename(old, dir, ec);
      renamed = true;
    }
  }
  if (renamed) SyncDirectory(job_dir);
  // A new directory that was never swapped in (the commit died first; its
  // checkpoint was never reported), or the old one it was swapped with.
  for (const auto& [path, dir] : incoming) {
    if (std::filesystem::exists(dir, ec)) std::filesystem::remove_all(path, ec);
  }
}

absl::Status CommitCheckpoint(const std::string& pending, const std::string& dir, int keep) {
  std::error_code ec;
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  // What an earlier commit that crashed left behind.
  RecoverCheckpoints(parent);
  if (!std::filesystem::exists(pending, ec)) {
    return ErrnoToStatus(ENOENT, absl::StrCat("cannot rename ", pending, " to"), dir);
  }
  // The directory appears whole or not at all, and a directory of the same
  // step (a checkpoint taken again at that step, e.g. right after a restore)
  // is never removed before the new one has replaced it: at every instant
  // ckpt-<step> holds one whole checkpoint, the old or the new, so a crash
  // anywhere in here loses neither. (Removing the old one first and then
  // renaming lost the step to a crash in between.)
  if (!std::filesystem::exists(dir, ec)) {
    std::filesystem::rename(pending, dir, ec);
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot rename ", pending, " to"), dir);
    SyncDirectory(parent);
    AfterStep("renamed");
  } else {
    // The new directory first takes the incoming name, so whatever a crash
    // leaves beside ckpt-<step> has a name RecoverCheckpoints knows; then
    // one RENAME_EXCHANGE swaps it with the old one.
    const std::string incoming = dir + kIncomingSuffix;
    std::filesystem::remove_all(incoming, ec);
    std::filesystem::rename(pending, incoming, ec);
    if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot rename ", pending, " to"), incoming);
    SyncDirectory(parent);
    AfterStep("staged");
    std::string old = incoming;  // after the swap
    const int err = ExchangePaths(incoming, dir);
    if (err == 0) {
      SyncDirectory(parent);
      AfterStep("exchanged");
    } else if (err == EINVAL || err == ENOSYS || err == ENOTSUP) {
      // No RENAME_EXCHANGE on this file system: the old directory goes
      // aside, the new one in. A crash in between leaves no ckpt-<step>
      // for a moment; RecoverCheckpoints (the next commit, the
      // coordinator's start) puts the old one back.
      old = dir + kOutgoingSuffix;
      std::filesystem::remove_all(old, ec);
      std::filesystem::rename(dir, old, ec);
      if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("cannot rename ", dir, " to"), old);
      SyncDirectory(parent);
      AfterStep("moved aside");
      std::filesystem::rename(incoming, dir, ec);
      if (ec) {
        absl::Status s = ErrnoToStatus(ec.value(), absl::StrCat("cannot rename ", incoming, " to"), dir);
        std::filesystem::rename(old, dir, ec);  // the old one stays
        return s;
      }
      SyncDirectory(parent);
      AfterStep("renamed");
    } else {
      return ErrnoToStatus(err, absl::StrCat("cannot swap ", incoming, " with"), dir);
    }
    std::filesystem::remove_all(old, ec);
    AfterStep("removed old");
  }
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
  const size_t kept = std::min(all.size(), static_cast<size_t>(std::max(keep, 1)));
  // The checkpoints a kept one's embeddings are incremental on stay too;
  // where a manifest cannot be read (even for a passing reason), nothing
  // goes this time: a base deleted would make a kept checkpoint useless.
  std::set<std::string> needed;
  bool known = true;
  for (size_t i = all.size() - kept; i < all.size() && known; ++i) {
    auto m = ReadManifest(all[i].second.string());
    for (int depth = 0; m.ok() && !m->embeddings_base.empty() && depth <= kMaxEmbeddingChain; ++depth) {
      if (!needed.insert(m->embeddings_base).second) break;
      m = ReadManifest(absl::StrCat(parent, "/", m->embeddings_base));
    }
    known = m.ok();
  }
  for (size_t i = 0; known && i + kept < all.size(); ++i) {
    if (needed.count(all[i].second.filename().string()) == 0) std::filesystem::remove_all(all[i].second, ec);
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
