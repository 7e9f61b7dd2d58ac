// The scheduler, as a pure function: pending jobs in submission order and
// the free members in, placements and pending reasons out. No clock, no
// locks, no I/O; the coordinator applies what it returns.
//
// Policy: strict FIFO, all or nothing. The oldest pending job starts only
// when all the shards and workers it asks for are free (so two half-started
// jobs can never hold each other's members); nothing overtakes it. Members
// are taken in the order of their `order` key (drawn at random when they
// registered: no member can choose to be first in line).
//
// One exception to FIFO: a job whose owner already runs
// `max_running_per_owner` jobs is passed over (it stays pending, saying
// why) and does not hold up the jobs behind it, so one user at the limit
// cannot stall the others.
#ifndef PSTRAIN_SERVER_COORDINATOR_SCHEDULER_H_
#define PSTRAIN_SERVER_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/events.pb.h"

namespace pstrain {

struct SchedulerJob {
  std::string id;
  int shards = 0;
  int workers = 0;
  // Workers of the job's previous attempt that have not stopped yet: the
  // shards must not reload under them.
  int stopping_workers = 0;
  // The submitting user ("" without authentication).
  std::string owner;
};

struct ScheduleLimits {
  // 0: no bound.
  int max_running_per_owner = 0;
  // Jobs running now (not pending, not ended), by owner.
  std::map<std::string, int> running_by_owner;
};

// A member that is alive, holds no job and is not leaving.
struct FreeMember {
  std::string id;
  std::string name;
  MemberRole role = MEMBER_ROLE_WORKER;
  uint64_t order = 0;
};

struct Placement {
  std::string job_id;
  std::vector<std::string> shard_ids;   // member ids, index = rank
  std::vector<std::string> worker_ids;  // member ids, index = rank
};

struct SchedulePlan {
  std::vector<Placement> placements;  // in FIFO order
  // Every job that stays pending, with why (placed jobs are absent).
  std::map<std::string, std::string> pending_reasons;
};

SchedulePlan PlanSchedule(const std::vector<SchedulerJob>& fifo, std::vector<FreeMember> free,
                          const ScheduleLimits& limits = {});

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_SCHEDULER_H_
