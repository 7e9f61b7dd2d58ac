#include "common/activity_text.h"

#include "absl/strings/str_cat.h"

namespace pstrain {

std::string ActivityText(const WorkerActivity& a) {
  switch (a.phase()) {
    case WorkerActivity::STARTING: return "starting";
    case WorkerActivity::DATA: return "waiting for data";
    case WorkerActivity::COMPUTE: return "computing";
    case WorkerActivity::SHARDS:
      return a.shard() >= 0 ? absl::StrCat("waiting on shard ", a.shard()) : "waiting on the shards";
    case WorkerActivity::COLLECTIVE: return "waiting on the collective";
    case WorkerActivity::PAUSED: return "paused for a checkpoint";
    case WorkerActivity::EVALUATING: return "evaluating";
    case WorkerActivity::FINISHING: return "finishing (waiting for the other ranks' last steps)";
    default: return "-";
  }
}

bool ActivityWaits(const WorkerActivity& a) {
  return a.phase() == WorkerActivity::DATA || a.phase() == WorkerActivity::SHARDS ||
         a.phase() == WorkerActivity::COLLECTIVE;
}

}  // namespace pstrain
