#include "server/coordinator/membership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace pstrain {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const absl::Duration kLease = absl::Seconds(5);

RegisterRequest Req(MemberRole role, const std::string& name) {
  RegisterRequest r;
  r.set_role(role);
  r.set_name(name);
  if (role == MEMBER_ROLE_SHARD) r.set_address("10.0.0.1:7001");
  return r;
}

TEST(MembershipTest, ValidateRefusesBadRegistrations) {
  EXPECT_TRUE(Membership::Validate(Req(MEMBER_ROLE_WORKER, "w")).ok());
  EXPECT_EQ(Membership::Validate(Req(MEMBER_ROLE_UNSPECIFIED, "w")).code(), absl::StatusCode::kInvalidArgument);
  // A role number from a newer (or a hostile) peer that this build lacks.
  EXPECT_EQ(Membership::Validate(Req(static_cast<MemberRole>(7), "w")).code(), absl::StatusCode::kInvalidArgument);
  RegisterRequest shard = Req(MEMBER_ROLE_SHARD, "s");
  shard.clear_address();
  EXPECT_EQ(Membership::Validate(shard).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Membership::Validate(Req(MEMBER_ROLE_WORKER, "a b")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Membership::Validate(Req(MEMBER_ROLE_WORKER, "a#1")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Membership::Validate(Req(MEMBER_ROLE_WORKER, std::string(kMaxNameBytes + 1, 'w'))).code(),
            absl::StatusCode::kInvalidArgument);
  RegisterRequest long_previous = Req(MEMBER_ROLE_WORKER, "w");
  long_previous.set_previous_member_id(std::string(kMaxIdBytes + 1, 'x'));
  EXPECT_EQ(Membership::Validate(long_previous).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MembershipTest, LeasesExpireAndTheLongDeadAreForgotten) {
  Membership m(10, absl::Seconds(60));
  Member* w = *m.Add(Req(MEMBER_ROLE_WORKER, "w"), kT0);
  Member* s = *m.Add(Req(MEMBER_ROLE_SHARD, "s"), kT0);
  const std::string wid = w->status.member_id(), sid = s->status.member_id();
  s->status.set_job_id("job-1");
  m.Expire(kT0 + kLease, kLease);  // exactly one lease: still alive
  EXPECT_TRUE(m.Find(wid)->status.alive());
  m.Beat(*m.Find(wid), kT0 + absl::Seconds(4));
  m.Expire(kT0 + absl::Seconds(6), kLease);
  EXPECT_TRUE(m.Find(wid)->status.alive());
  EXPECT_FALSE(m.Find(sid)->status.alive());
  EXPECT_FALSE(m.Attached("s", "job-1"));
  EXPECT_TRUE(m.Beat(*m.Find(sid), kT0 + absl::Seconds(7)));  // back
  EXPECT_TRUE(m.Attached("s", "job-1"));
  // Long silent: the jobless worker is forgotten, the shard holding a job
  // is kept (its job must learn it was lost).
  m.Expire(kT0 + absl::Seconds(100), kLease);
  EXPECT_EQ(m.Find(wid), nullptr);
  ASSERT_NE(m.Find(sid), nullptr);
  EXPECT_FALSE(m.Find(sid)->status.alive());
}

TEST(MembershipTest, ExtendLeasesForgivesTheCoordinatorsOwnPause) {
  Membership m(10, absl::Seconds(60));
  const std::string id = (*m.Add(Req(MEMBER_ROLE_WORKER, "w"), kT0))->status.member_id();
  m.ExtendLeases(absl::Seconds(30));
  m.Expire(kT0 + absl::Seconds(31), kLease);
  EXPECT_TRUE(m.Find(id)->status.alive());
}

TEST(MembershipTest, ReRegisteringReplacesAndTheTableIsBounded) {
  Membership m(2, absl::Seconds(60));
  const std::string first = (*m.Add(Req(MEMBER_ROLE_WORKER, "w"), kT0))->status.member_id();
  // Unguessable ids: the name, then 128 random bits.
  EXPECT_EQ(first.size(), std::string("w#").size() + 32) << first;
  // A live member's name: not to a stranger, only to the holder of its id.
  EXPECT_EQ(m.Add(Req(MEMBER_ROLE_WORKER, "w"), kT0).status().code(), absl::StatusCode::kAlreadyExists);
  RegisterRequest holder = Req(MEMBER_ROLE_WORKER, "w");
  holder.set_previous_member_id(first);
  const std::string again = (*m.Add(holder, kT0))->status.member_id();
  EXPECT_NE(first, again);
  EXPECT_EQ(m.Find(first), nullptr);
  // Once lost, the name is free for anyone (the pod restarted elsewhere).
  m.Find(again)->status.set_alive(false);
  const std::string third = (*m.Add(Req(MEMBER_ROLE_WORKER, "w"), kT0))->status.member_id();
  ASSERT_TRUE(m.Add(Req(MEMBER_ROLE_WORKER, ""), kT0).ok());  // named for it: worker-<n>
  EXPECT_EQ(m.Add(Req(MEMBER_ROLE_WORKER, "x"), kT0).status().code(), absl::StatusCode::kResourceExhausted);
  holder.set_previous_member_id(third);
  EXPECT_TRUE(m.Add(holder, kT0).ok());  // a replacement still fits
  EXPECT_EQ(m.Statuses().size(), 2u);
}

// One principal (a worker token shared by a pool, or a compromised pod's)
// cannot fill the table: it holds at most max_per_principal members;
// re-registering a name it holds still fits; other principals are not
// counted against it.
TEST(MembershipTest, APrincipalHoldsABoundedNumberOfMembers) {
  Membership m(100, absl::Seconds(60), /*max_per_principal=*/2);
  ASSERT_TRUE(m.Add(Req(MEMBER_ROLE_WORKER, "a"), kT0, "worker:pool").ok());
  ASSERT_TRUE(m.Add(Req(MEMBER_ROLE_WORKER, "b"), kT0, "worker:pool").ok());
  absl::Status third = m.Add(Req(MEMBER_ROLE_WORKER, "c"), kT0, "worker:pool").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("--max_members_per_principal"), std::string::npos) << third;
  EXPECT_TRUE(m.Add(Req(MEMBER_ROLE_WORKER, "d"), kT0, "worker:other").ok());
  // Its own name again (a restarted process, the old one lost): fits.
  for (const MemberStatus& st : m.Statuses()) {
    if (st.name() == "b") m.Find(st.member_id())->status.set_alive(false);
  }
  EXPECT_TRUE(m.Add(Req(MEMBER_ROLE_WORKER, "b"), kT0, "worker:pool").ok());
  // Without authentication (no principal), no per-principal bound.
  Membership open(100, absl::Seconds(60), 2);
  for (const char* name : {"x", "y", "z"}) EXPECT_TRUE(open.Add(Req(MEMBER_ROLE_WORKER, name), kT0).ok());
}

// Names do not steer placement: free members come in the random order
// drawn when they registered, not in name order ("!" sorted first).
TEST(MembershipTest, FreeMembersAreOrderedByAKeyDrawnAtRandomNotByName) {
  Membership m(100, absl::Seconds(60));
  std::vector<std::string> names;
  for (char c = 'a'; c <= 'z'; ++c) names.push_back(std::string(1, c));
  names.push_back("!");
  for (const std::string& name : names) ASSERT_TRUE(m.Add(Req(MEMBER_ROLE_WORKER, name), kT0).ok());
  std::vector<FreeMember> free = m.FreeMembers();
  std::sort(free.begin(), free.end(), [](const FreeMember& a, const FreeMember& b) { return a.order < b.order; });
  std::vector<std::string> placed;
  for (const FreeMember& f : free) placed.push_back(f.name);
  std::vector<std::string> by_name = names;
  std::sort(by_name.begin(), by_name.end());
  // 27! orders: one is name order.
  EXPECT_NE(placed, by_name);
  EXPECT_EQ(std::set<std::string>(placed.begin(), placed.end()).size(), names.size());
}

// The job's view of a member comes only from the member that holds the
// job: one that merely took the name (after a coordinator restart, before
// the real one came back) never puts its address into the job's status.
TEST(MembershipTest, RefreshReadsOnlyTheMemberThatHoldsTheJob) {
  Membership m(100, absl::Seconds(60));
  RegisterRequest impostor = Req(MEMBER_ROLE_SHARD, "s0");
  impostor.set_address("10.0.0.66:1");
  ASSERT_TRUE(m.Add(impostor, kT0).ok());
  MemberStatus seat;
  seat.set_name("s0");
  seat.set_role(MEMBER_ROLE_SHARD);
  seat.set_address("10.0.0.1:1");
  seat.set_alive(true);
  m.Refresh(seat, "job-1");
  EXPECT_EQ(seat.address(), "10.0.0.1:1");
  EXPECT_FALSE(seat.alive());  // its holder is not back
  // The real one, back in its seat (re-attached: it holds the job).
  RegisterRequest real = Req(MEMBER_ROLE_SHARD, "s0");
  real.set_address("10.0.0.1:1");
  Member* back = *m.Add(real, kT0, "", "s0#seat");
  back->status.set_job_id("job-1");
  m.Refresh(seat, "job-1");
  EXPECT_TRUE(seat.alive());
  EXPECT_EQ(seat.member_id(), "s0#seat");
  EXPECT_EQ(seat.address(), "10.0.0.1:1");
}

TEST(MembershipTest, ReleaseStopsLiveWorkersAndFreesTheRest) {
  Membership m(10, absl::Seconds(60));
  Member* w0 = *m.Add(Req(MEMBER_ROLE_WORKER, "w0"), kT0);
  Member* w1 = *m.Add(Req(MEMBER_ROLE_WORKER, "w1"), kT0);
  Member* s0 = *m.Add(Req(MEMBER_ROLE_SHARD, "s0"), kT0);
  *m.Add(Req(MEMBER_ROLE_WORKER, "w2"), kT0);
  for (Member* x : {w0, w1, s0}) x->status.set_job_id("job-1");
  w1->status.set_alive(false);
  m.Release("job-1");
  EXPECT_EQ(m.Stopping("job-1"), 1);  // w0 must stop first
  EXPECT_TRUE(w0->releasing);
  EXPECT_EQ(w1->status.job_id(), "");
  EXPECT_EQ(s0->status.job_id(), "");
  std::vector<std::string> free;
  for (const FreeMember& f : m.FreeMembers()) free.push_back(f.name);
  std::sort(free.begin(), free.end());
  EXPECT_EQ(free, (std::vector<std::string>{"s0", "w2"}));  // not w1 (dead), not w0 (stopping)
  m.FreeAll("job-1");
  EXPECT_EQ(m.Stopping("job-1"), 0);
  EXPECT_EQ(m.FreeMembers().size(), 3u);
}

TEST(MembershipTest, AReleasedWorkerIsNotFreeUntilItHasStopped) {
  Membership m(10, absl::Seconds(60));
  Member* w = *m.Add(Req(MEMBER_ROLE_WORKER, "w"), kT0);
  w->status.set_job_id("job-1");
  w->status.set_alive(false);  // lost, its rank given away
  m.ReleaseByName("w", "job-1");
  m.Beat(*w, kT0 + absl::Seconds(1));  // back, maybe still running the job
  EXPECT_TRUE(m.FreeMembers().empty());
  EXPECT_EQ(m.Stopping("job-1"), 1);
  w->Free();  // its heartbeat said it runs nothing (the coordinator's part)
  EXPECT_EQ(m.FreeMembers().size(), 1u);
  // A released member that never comes back is forgotten all the same.
  Member* gone = *m.Add(Req(MEMBER_ROLE_WORKER, "gone"), kT0);
  gone->status.set_job_id("job-1");
  gone->status.set_alive(false);
  m.ReleaseByName("gone", "job-1");
  m.Expire(kT0 + absl::Seconds(120), kLease);
  for (const MemberStatus& s : m.Statuses()) EXPECT_NE(s.name(), "gone");
}

}  // namespace
}  // namespace pstrain
