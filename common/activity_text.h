// A worker's activity (proto/events.proto WorkerActivity) in words, the same
// for `pstrain status` and the web dashboard: "waiting on shard 1",
// "waiting on the collective", "waiting for data", ...
#ifndef PSTRAIN_COMMON_ACTIVITY_TEXT_H_
#define PSTRAIN_COMMON_ACTIVITY_TEXT_H_

#include <string>

#include "proto/events.pb.h"

namespace pstrain {

std::string ActivityText(const WorkerActivity& a);
// True for a phase where the rank waits on something else (shards, the
// collective, data): the ones that make a slow or stuck rank.
bool ActivityWaits(const WorkerActivity& a);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_ACTIVITY_TEXT_H_
