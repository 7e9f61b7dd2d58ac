#include "client/embedding_export_command.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "common/file_util.h"
#include "common/subprocess.h"

namespace pstrain {

absl::StatusOr<int64_t> ExportCheckpointEmbeddings(const std::string& checkpoint_dir, const std::string& out,
                                                   const std::string& tool, absl::Duration timeout) {
  auto manifest = ReadManifest(checkpoint_dir);
  if (!manifest.ok()) return manifest.status();
  if (manifest->embeddings.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", checkpoint_dir,
                                                      " holds no embedding tables (its job has none, or it was "
                                                      "written before checkpoints held them)"));
  }
  // An incremental checkpoint's bases first, oldest first.
  auto chain = EmbeddingChain(checkpoint_dir, *manifest);
  if (!chain.ok()) return chain.status();
  SpawnOptions o;
  o.argv = {tool, std::filesystem::absolute(out).string()};
  for (size_t k = 0; k < chain->size(); ++k) {
    if (k > 0) o.argv.push_back("--");
    for (const std::string& f : (*chain)[k].files) o.argv.push_back(f);
  }
  o.log_path = (std::filesystem::temp_directory_path() / absl::StrCat("pstrain-export-", getpid(), ".log")).string();
  auto pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  const absl::Time deadline = absl::Now() + timeout;
  std::optional<int> code;
  while (!(code = PollExit(*pid)).has_value()) {
    if (absl::Now() > deadline) {
      kill(*pid, SIGKILL);
      while (!PollExit(*pid).has_value()) absl::SleepFor(absl::Milliseconds(10));
      std::filesystem::remove(o.log_path);
      return absl::DeadlineExceededError(
          absl::StrCat("exporting ", checkpoint_dir, "'s embeddings took over ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string log = ReadFile(o.log_path).value_or("");
  std::filesystem::remove(o.log_path);
  if (*code != 0) {
    return absl::InternalError(
        absl::StrCat(tool, " exited with ", *code, ": ", log.size() > 2048 ? log.substr(log.size() - 2048) : log));
  }
  return manifest->step;
}

}  // namespace pstrain
