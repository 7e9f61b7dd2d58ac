// Membership: the shards and workers registered with the coordinator, their
// leases and which job each holds. Not thread-safe: the coordinator's mutex
// guards it. Time comes from the caller (the coordinator's clock).
#ifndef PSTRAIN_SERVER_COORDINATOR_MEMBERSHIP_H_
#define PSTRAIN_SERVER_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"
#include "server/coordinator/scheduler.h"

namespace pstrain {

// Limits on the strings a registration may carry.
inline constexpr size_t kMaxNameBytes = 253;  // a DNS name, as Kubernetes pod names
inline constexpr size_t kMaxAddressBytes = 512;
inline constexpr size_t kMaxIdBytes = 300;  // job and member ids

struct Member {
  MemberStatus status;
  absl::Time last_beat;
  // The member's job was requeued: it is told to stop, and becomes free
  // once its heartbeat says it no longer runs the job (or it is lost).
  bool releasing = false;
  // It is shutting down (SIGTERM): never given a job again.
  bool leaving = false;
  // Who registered it ("<token role>:<user>"; empty with authentication
  // off): one principal holds at most max_per_principal members.
  std::string principal;
  // Its place among free members when jobs are placed: drawn at random at
  // registration, so no name (nor anything else a member chooses) puts it
  // first in line for the next jobs and every vacant rank.
  uint64_t order = 0;

  bool Holds(const std::string& job_id) const { return !job_id.empty() && status.job_id() == job_id; }
  void Free() {
    releasing = false;
    status.set_job_id("");
    status.set_rank(-1);
  }
};

class Membership {
 public:
  // Members silent for longer than `forget_after` are forgotten, as long
  // as they hold no job. One principal registers at most
  // `max_per_principal` members.
  Membership(size_t max_members, absl::Duration forget_after, size_t max_per_principal = SIZE_MAX)
      : max_members_(max_members), max_per_principal_(max_per_principal), forget_after_(forget_after) {}

  // The request's own fields (role, lengths, name characters); no state.
  static absl::Status Validate(const RegisterRequest& request);
  // Adds a validated registration by `principal`; one with the name of an
  // earlier member replaces it (a restart on either side) -- of a live one
  // only when it gives that member's id (previous_member_id), or
  // `seat_id` is not empty (the coordinator found previous_member_id to be
  // the id a running job's stored status gives this name: the member comes
  // back to its seat after a coordinator restart, keeping that id, and an
  // impostor that registered the name first is replaced), else
  // ALREADY_EXISTS. RESOURCE_EXHAUSTED when the table is full or the
  // principal holds its limit.
  absl::StatusOr<Member*> Add(const RegisterRequest& request, absl::Time now, const std::string& principal = "",
                              const std::string& seat_id = "");
  Member* Find(const std::string& member_id);
  // What a worker's loop reported doing with its heartbeat (bounded; see
  // WorkerActivity).
  void SetActivity(Member& member, const WorkerActivity& activity);
  // A sign of life; true when the member had been taken for lost.
  bool Beat(Member& member, absl::Time now);

  // Members silent for longer than `lease` are lost (one being released is
  // freed); the long-silent jobless ones are forgotten, so a stream of fake
  // or short-lived members cannot fill the table.
  void Expire(absl::Time now, absl::Duration lease);
  // The coordinator itself stalled for `d`: nobody could be heard meanwhile.
  void ExtendLeases(absl::Duration d);

  // The member called `name`, on `job_id`, stopped answering on its data
  // path while it heartbeats: it no longer counts as attached, is never
  // free again, and its heartbeats ask it to exit (`why`, bounded, says
  // what happened). A registration under its name after it has gone is a
  // new member, trusted again.
  void Quarantine(const std::string& name, const std::string& job_id, const std::string& why);
  // Whether the member called `name` is alive and on `job_id` (and not
  // quarantined).
  bool Attached(const std::string& name, const std::string& job_id) const;
  // Copies the live view (alive, last beat, id, address) of the member
  // with m's name and role that holds `job_id` into m; not alive if there
  // is none. A member that merely took the name (not scheduled into the
  // job, not re-attached with the seat's id) never changes m.
  void Refresh(MemberStatus& m, const std::string& job_id) const;
  // The job ended: all its members are free.
  void FreeAll(const std::string& job_id);
  // The member called `name`, if it holds `job_id`, loses its rank (lost,
  // drained or scaled away while the job goes on): told to stop by its
  // heartbeats, it becomes free once one says it runs nothing -- never
  // before, so a worker back from a partition cannot be given a rank while
  // its old run still reports.
  void ReleaseByName(const std::string& name, const std::string& job_id);
  // The job was requeued: its live workers are told to stop (free once
  // they have), the rest are free now.
  void Release(const std::string& job_id);
  // Workers of the job not yet stopped after a Release.
  int Stopping(const std::string& job_id) const;
  std::vector<FreeMember> FreeMembers() const;
  std::vector<MemberStatus> Statuses() const;

 private:
  const size_t max_members_;
  const size_t max_per_principal_;
  const absl::Duration forget_after_;
  std::map<std::string, Member> members_;  // by member id
  uint64_t next_id_ = 1;
  std::mt19937_64 order_{std::random_device{}()};
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_MEMBERSHIP_H_
