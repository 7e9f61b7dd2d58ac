#include "server/coordinator/scheduler.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pstrain {

SchedulePlan PlanSchedule(const std::vector<SchedulerJob>& fifo, std::vector<FreeMember> free) {
  std::sort(free.begin(), free.end(),
            [](const FreeMember& a, const FreeMember& b) { return std::tie(a.order, a.id) < std::tie(b.order, b.id); });
  std::vector<std::string> shards, workers;  // free member ids, in `order`
  for (const FreeMember& m : free) (m.role == Role::kShard ? shards : workers).push_back(m.id);
  SchedulePlan plan;
  // The head of the queue cannot start: it says why, every job behind it
  // that it is in front of.
  auto hold = [&](size_t head, std::string why) {
    plan.pending_reasons[fifo[head].id] = std::move(why);
    for (size_t later = head + 1; later < fifo.size(); ++later) {
      plan.pending_reasons[fifo[later].id] = absl::StrCat("Queued behind ", fifo[head].id);
    }
  };
  size_t next_shard = 0, next_worker = 0;
  for (size_t i = 0; i < fifo.size(); ++i) {
    const SchedulerJob& job = fifo[i];
    if (job.stopping_workers > 0) {
      hold(i, absl::StrCat("Stopping the previous attempt (", job.stopping_workers, " worker(s))"));
      break;
    }
    const size_t free_shards = shards.size() - next_shard, free_workers = workers.size() - next_worker;
    if (job.shards < 0 || job.workers < 0 || free_shards < static_cast<size_t>(job.shards) ||
        free_workers < static_cast<size_t>(job.workers)) {
      hold(i, absl::StrCat("Unschedulable: needs ", job.shards, " shard(s) and ", job.workers,
                           " worker(s); free now: ", free_shards, " shard(s), ", free_workers, " worker(s)"));
      break;
    }
    Placement p;
    p.job_id = job.id;
    p.shard_ids.assign(shards.begin() + next_shard, shards.begin() + next_shard + job.shards);
    p.worker_ids.assign(workers.begin() + next_worker, workers.begin() + next_worker + job.workers);
    next_shard += job.shards;
    next_worker += job.workers;
    plan.placements.push_back(std::move(p));
  }
  return plan;
}

}  // namespace pstrain
