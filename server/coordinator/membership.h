// Membership: the shards and workers registered with the coordinator, their
// leases and which job each holds. Not thread-safe: the coordinator's mutex
// guards it. Time comes from the caller (the coordinator's clock).
#ifndef PSTRAIN_SERVER_COORDINATOR_MEMBERSHIP_H_
#define PSTRAIN_SERVER_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"
#include "server/coordinator/role.h"
#include "server/coordinator/scheduler.h"

namespace pstrain {

// Limits on the strings a registration may carry.
inline constexpr size_t kMaxNameBytes = 253;  // a DNS name, as Kubernetes pod names
inline constexpr size_t kMaxAddressBytes = 512;
inline constexpr size_t kMaxIdBytes = 300;  // job and member ids

struct Member {
  MemberStatus status;
  Role role = Role::kWorker;
  absl::Time last_beat;
  // The member's job was requeued: it is told to stop, and becomes free
  // once its heartbeat says it no longer runs the job (or it is lost).
  bool releasing = false;
  // It is shutting down (SIGTERM): never given a job again.
  bool leaving = false;

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
  // as they hold no job.
  Membership(size_t max_members, absl::Duration forget_after)
      : max_members_(max_members), forget_after_(forget_after) {}

  // The request's own fields (role, lengths, name characters); no state.
  static absl::Status Validate(const RegisterRequest& request);
  // Adds a validated registration; one with the name of an earlier member
  // replaces it (a restart on either side) -- of a live one only when it
  // gives that member's id (previous_member_id), else ALREADY_EXISTS.
  // RESOURCE_EXHAUSTED when the table is full.
  absl::StatusOr<Member*> Add(const RegisterRequest& request, absl::Time now);
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

  // Whether the member called `name` is alive and on `job_id`.
  bool Attached(const std::string& name, const std::string& job_id) const;
  // Copies the live view (alive, last beat, id, address) of the member
  // with m's name and role into m; not alive if there is none.
  void Refresh(MemberStatus& m) const;
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
  const absl::Duration forget_after_;
  std::map<std::string, Member> members_;  // by member id
  uint64_t next_id_ = 1;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_COORDINATOR_MEMBERSHIP_H_
