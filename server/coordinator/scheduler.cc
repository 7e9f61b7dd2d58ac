#include "server/coordinator/scheduler.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

std::string Held(int running) {
  return absl::StrCat("Held: its owner runs ", running, " jobs, the limit per user (--max_running_jobs_per_user)");
}

// The queue stops: the jobs from `first` on whose owners are at the limit
// say so, rather than that they queue behind the head.
void PassOver(const std::vector<SchedulerJob>& fifo, size_t first, const ScheduleLimits& limits,
              std::map<std::string, int>& running, std::vector<bool>& passed_over, SchedulePlan& plan) {
  if (limits.max_running_per_owner <= 0) return;
  for (size_t i = first; i < fifo.size(); ++i) {
    const int n = running[fifo[i].owner];
    if (n < limits.max_running_per_owner) continue;
    passed_over[i] = true;
    plan.pending_reasons[fifo[i].id] = Held(n);
  }
}

}  // namespace

SchedulePlan PlanSchedule(const std::vector<SchedulerJob>& fifo, std::vector<FreeMember> free,
                          const ScheduleLimits& limits) {
  std::sort(free.begin(), free.end(),
            [](const FreeMember& a, const FreeMember& b) { return std::tie(a.order, a.id) < std::tie(b.order, b.id); });
  std::vector<std::string> shards, workers;  // free member ids, in `order`
  for (const FreeMember& m : free) (m.role == MEMBER_ROLE_SHARD ? shards : workers).push_back(m.id);
  SchedulePlan plan;
  // The head of the queue cannot start: it says why, every job behind it
  // that it is in front of (not those passed over: see scheduler.h).
  std::vector<bool> passed_over(fifo.size(), false);
  auto hold = [&](size_t head, std::string why) {
    plan.pending_reasons[fifo[head].id] = std::move(why);
    for (size_t later = head + 1; later < fifo.size(); ++later) {
      if (passed_over[later]) continue;
      plan.pending_reasons[fifo[later].id] = absl::StrCat("Queued behind ", fifo[head].id);
    }
  };
  std::map<std::string, int> running = limits.running_by_owner;
  size_t next_shard = 0, next_worker = 0;
  for (size_t i = 0; i < fifo.size(); ++i) {
    const SchedulerJob& job = fifo[i];
    if (limits.max_running_per_owner > 0 && running[job.owner] >= limits.max_running_per_owner) {
      passed_over[i] = true;
      plan.pending_reasons[job.id] = Held(running[job.owner]);
      continue;
    }
    if (job.stopping_workers > 0) {
      PassOver(fifo, i + 1, limits, running, passed_over, plan);
      hold(i, absl::StrCat("Stopping the previous attempt (", job.stopping_workers, " worker(s))"));
      break;
    }
    const size_t free_shards = shards.size() - next_shard, free_workers = workers.size() - next_worker;
    if (job.shards < 0 || job.workers < 0 || free_shards < static_cast<size_t>(job.shards) ||
        free_workers < static_cast<size_t>(job.workers)) {
      PassOver(fifo, i + 1, limits, running, passed_over, plan);
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
    ++running[job.owner];
    plan.placements.push_back(std::move(p));
  }
  return plan;
}

}  // namespace pstrain
