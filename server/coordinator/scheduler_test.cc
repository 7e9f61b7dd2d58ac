#include "server/coordinator/scheduler.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace pstrain {
namespace {

std::vector<FreeMember> Members(int shards, int workers) {
  std::vector<FreeMember> out;
  // Listed in name order, their order keys (drawn at random by the
  // coordinator) the other way round: the scheduler goes by the keys.
  for (int i = 0; i < workers; ++i) {
    out.push_back({"w" + std::to_string(i) + "#1", "worker-" + std::to_string(i), MEMBER_ROLE_WORKER,
                   uint64_t(100 - i)});
  }
  for (int i = 0; i < shards; ++i) {
    out.push_back({"s" + std::to_string(i) + "#1", "shard-" + std::to_string(i), MEMBER_ROLE_SHARD,
                   uint64_t(100 - i)});
  }
  return out;
}

struct Case {
  const char* name;
  std::vector<SchedulerJob> fifo;
  int free_shards, free_workers;
  std::vector<std::string> placed;                    // job ids, in order
  std::map<std::string, std::string> pending_reasons;  // exact
};

TEST(SchedulerTest, FifoAllOrNothing) {
  const std::vector<Case> cases = {
      {"nothing pending", {}, 2, 2, {}, {}},
      {"one fits", {{"a", 1, 2, 0}}, 1, 2, {"a"}, {}},
      {"two fit side by side", {{"a", 1, 1, 0}, {"b", 1, 1, 0}}, 2, 2, {"a", "b"}, {}},
      {"all or nothing: too few workers",
       {{"a", 1, 3, 0}},
       1,
       2,
       {},
       {{"a", "Unschedulable: needs 1 shard(s) and 3 worker(s); free now: 1 shard(s), 2 worker(s)"}}},
      {"strict FIFO: a small job does not overtake a big one",
       {{"big", 1, 3, 0}, {"small", 1, 1, 0}},
       1,
       2,
       {},
       {{"big", "Unschedulable: needs 1 shard(s) and 3 worker(s); free now: 1 shard(s), 2 worker(s)"},
        {"small", "Queued behind big"}}},
      {"the second job finds what the first left",
       {{"a", 1, 1, 0}, {"b", 1, 2, 0}, {"c", 0, 1, 0}},
       2,
       2,
       {"a"},
       {{"b", "Unschedulable: needs 1 shard(s) and 2 worker(s); free now: 1 shard(s), 1 worker(s)"},
        {"c", "Queued behind b"}}},
      {"a previous attempt still stopping holds the queue",
       {{"a", 1, 1, 2}, {"b", 1, 1, 0}},
       2,
       2,
       {},
       {{"a", "Stopping the previous attempt (2 worker(s))"}, {"b", "Queued behind a"}}},
      {"all-reduce jobs need no shards", {{"ar", 0, 2, 0}}, 0, 2, {"ar"}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const SchedulePlan plan = PlanSchedule(c.fifo, Members(c.free_shards, c.free_workers));
    std::vector<std::string> placed;
    for (const Placement& p : plan.placements) placed.push_back(p.job_id);
    EXPECT_EQ(placed, c.placed);
    EXPECT_EQ(plan.pending_reasons, c.pending_reasons);
  }
}

// Names do not steer placement ("!" sorts first): ranks follow the
// members' order keys.
TEST(SchedulerTest, RanksFollowTheOrderKeysNotNamesAndNoMemberIsGivenTwice) {
  std::vector<FreeMember> members = Members(3, 3);
  members.push_back({"bang#1", "!", MEMBER_ROLE_WORKER, 1000});
  const SchedulePlan plan = PlanSchedule({{"a", 2, 2, 0}, {"b", 1, 1, 0}}, members);
  ASSERT_EQ(plan.placements.size(), 2u);
  EXPECT_EQ(plan.placements[0].shard_ids, (std::vector<std::string>{"s2#1", "s1#1"}));
  EXPECT_EQ(plan.placements[0].worker_ids, (std::vector<std::string>{"w2#1", "w1#1"}));
  EXPECT_EQ(plan.placements[1].shard_ids, (std::vector<std::string>{"s0#1"}));
  EXPECT_EQ(plan.placements[1].worker_ids, (std::vector<std::string>{"w0#1"}));
  EXPECT_TRUE(plan.pending_reasons.empty());
}

TEST(SchedulerTest, NegativeCountsAreHeldNotPlaced) {
  // The spec parser refuses these; the scheduler does not trust it.
  const SchedulePlan plan = PlanSchedule({{"bad", -1, 1, 0}}, Members(1, 1));
  EXPECT_TRUE(plan.placements.empty());
  EXPECT_EQ(plan.pending_reasons.count("bad"), 1u);
}

// A user at --max_running_jobs_per_user is passed over: their next job
// waits, saying why, and other users' jobs behind it start.
TEST(SchedulerTest, AnOwnerAtTheRunningLimitIsPassedOver) {
  ScheduleLimits limits;
  limits.max_running_per_owner = 2;
  limits.running_by_owner = {{"alice", 1}};
  std::vector<SchedulerJob> fifo = {{"a1", 0, 1, 0, "alice"}, {"a2", 0, 1, 0, "alice"}, {"b1", 0, 1, 0, "bob"},
                                    {"big", 0, 9, 0, "bob"}, {"a3", 0, 1, 0, "alice"}, {"b2", 0, 1, 0, "bob"}};
  const SchedulePlan plan = PlanSchedule(fifo, Members(0, 4), limits);
  std::vector<std::string> placed;
  for (const Placement& p : plan.placements) placed.push_back(p.job_id);
  EXPECT_EQ(placed, (std::vector<std::string>{"a1", "b1"}));
  const std::string held = "Held: its owner runs 2 jobs, the limit per user (--max_running_jobs_per_user)";
  EXPECT_EQ(plan.pending_reasons.at("a2"), held);
  EXPECT_EQ(plan.pending_reasons.at("a3"), held);  // behind the head, but held for its own reason
  EXPECT_EQ(plan.pending_reasons.at("b2"), "Queued behind big");
  // No limit: plain FIFO.
  const SchedulePlan fifo_plan = PlanSchedule(fifo, Members(0, 4));
  ASSERT_EQ(fifo_plan.placements.size(), 3u);
  EXPECT_EQ(fifo_plan.placements[1].job_id, "a2");
}

}  // namespace
}  // namespace pstrain
