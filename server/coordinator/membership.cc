#include "server/coordinator/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/member_role.h"
#include "common/quote.h"
#include "common/random_hex.h"
#include "spdlog/spdlog.h"

namespace pstrain {

absl::Status Membership::Validate(const RegisterRequest& request) {
  if (request.role() != MEMBER_ROLE_SHARD && request.role() != MEMBER_ROLE_WORKER) {
    return absl::InvalidArgumentError("role must be shard or worker");
  }
  if (request.role() == MEMBER_ROLE_SHARD && request.address().empty()) {
    return absl::InvalidArgumentError("a shard must give the address of its ParameterService");
  }
  if (request.name().size() > kMaxNameBytes || request.address().size() > kMaxAddressBytes ||
      request.job_id().size() > kMaxIdBytes || request.previous_member_id().size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name (", Quote(request.name()), ") longer than ", kMaxNameBytes,
                                                   " bytes, address longer than ", kMaxAddressBytes,
                                                   " or job or member id longer than ", kMaxIdBytes));
  }
  for (char ch : request.name()) {
    if (static_cast<unsigned char>(ch) < 0x21 || ch == 0x7f || ch == '#') {
      return absl::InvalidArgumentError(absl::StrCat("member name '", Quote(request.name()),
                                                     "' holds a space, a control character or '#'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Member*> Membership::Add(const RegisterRequest& request, absl::Time now, const std::string& principal,
                                        const std::string& seat_id) {
  const std::string name =
      request.name().empty() ? absl::StrCat(RoleName(request.role()), "-", next_id_) : request.name();
  size_t principals = 0;
  bool replaces = false;
  for (const auto& [id, m] : members_) {
    replaces = replaces || m.status.name() == name;
    principals += !principal.empty() && m.principal == principal && m.status.name() != name ? 1 : 0;
  }
  if (members_.size() >= max_members_ && !replaces) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator already has ", members_.size(),
                                                     " members, its limit; dead ones are forgotten after ",
                                                     absl::FormatDuration(forget_after_), " without a heartbeat"));
  }
  if (principals >= max_per_principal_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Quote(principal, 64), " already has ", principals, " members registered, the limit for one principal "
        "(pstrain-coordinator --max_members_per_principal); dead ones are forgotten after ",
        absl::FormatDuration(forget_after_), " without a heartbeat"));
  }
  // A live member's name goes only to the holder of its member id (the same
  // process registering again) or of its seat in a running job; anyone else
  // waits until its lease ends.
  for (const auto& [id, m] : members_) {
    if (m.status.name() == name && m.status.alive() && id != request.previous_member_id() && seat_id.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "member name ", Quote(name), " is held by a live member: another process cannot take it over; it is "
          "free once that member misses its heartbeats"));
    }
  }
  for (auto it = members_.begin(); it != members_.end();) {
    it = it->second.status.name() == name ? members_.erase(it) : std::next(it);
  }
  Member m;
  m.principal = principal;
  m.order = order_();
  // Unguessable: the id is the member's credential for its later calls. A
  // member back in its seat keeps the id the job's stored status names.
  const std::string id = seat_id.empty() ? absl::StrCat(name, "#", RandomHex(16)) : seat_id;
  ++next_id_;
  m.status.set_member_id(id);
  m.status.set_role(request.role());
  m.status.set_name(name);
  m.status.set_address(request.address());
  m.status.set_alive(true);
  m.status.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  m.status.set_rank(-1);
  m.last_beat = now;
  return &(members_[id] = std::move(m));
}

Member* Membership::Find(const std::string& member_id) {
  auto it = members_.find(member_id);
  return it == members_.end() ? nullptr : &it->second;
}

bool Membership::Beat(Member& member, absl::Time now) {
  member.last_beat = now;
  member.status.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
  if (member.status.alive()) return false;
  member.status.set_alive(true);
  return true;
}

void Membership::SetActivity(Member& member, const WorkerActivity& activity) {
  WorkerActivity& a = *member.status.mutable_activity();
  a = activity;
  // Sent by the member: an unknown phase reads as unspecified, the numbers
  // are clamped to what they can mean.
  if (!WorkerActivity::Phase_IsValid(a.phase())) a.set_phase(WorkerActivity::PHASE_UNSPECIFIED);
  if (!(a.for_s() >= 0 && a.for_s() < 1e9)) a.set_for_s(0);
  a.set_step(std::max<int64_t>(0, a.step()));
  a.set_shard(std::max(-1, a.shard()));
}

void Membership::Expire(absl::Time now, absl::Duration lease) {
  for (auto& [id, m] : members_) {
    if (m.status.alive() && now - m.last_beat > lease) {
      m.status.set_alive(false);
      if (m.releasing) m.Free();
      spdlog::warn("coordinator: {} {} lost (no heartbeat for {})", RoleName(m.status.role()), m.status.name(),
                   absl::FormatDuration(now - m.last_beat));
    }
  }
  for (auto it = members_.begin(); it != members_.end();) {
    const Member& m = it->second;
    const bool forget =
        !m.status.alive() && (m.status.job_id().empty() || m.releasing) && now - m.last_beat > forget_after_;
    it = forget ? members_.erase(it) : std::next(it);
  }
}

void Membership::ExtendLeases(absl::Duration d) {
  for (auto& [id, m] : members_) m.last_beat += d;
}

bool Membership::Attached(const std::string& name, const std::string& job_id) const {
  for (const auto& [id, m] : members_) {
    if (m.status.name() == name && m.status.alive() && m.Holds(job_id) && m.status.unresponsive().empty()) {
      return true;
    }
  }
  return false;
}

void Membership::Refresh(MemberStatus& m, const std::string& job_id) const {
  bool found = false;
  for (const auto& [id, member] : members_) {
    if (member.status.name() == m.name() && member.status.role() == m.role() && member.Holds(job_id)) {
      m.set_alive(member.status.alive());
      m.set_last_heartbeat_unix_ms(member.status.last_heartbeat_unix_ms());
      *m.mutable_activity() = member.status.activity();
      m.set_member_id(id);
      m.set_address(member.status.address());
      m.set_unresponsive(member.status.unresponsive());
      found = true;
    }
  }
  if (!found) m.set_alive(false);
}

void Membership::FreeAll(const std::string& job_id) {
  for (auto& [id, m] : members_) {
    if (m.Holds(job_id)) m.Free();
  }
}

void Membership::Quarantine(const std::string& name, const std::string& job_id, const std::string& why) {
  for (auto& [id, m] : members_) {
    if (m.status.name() == name && m.Holds(job_id)) m.status.set_unresponsive(why.substr(0, 512));
  }
}

void Membership::ReleaseByName(const std::string& name, const std::string& job_id) {
  for (auto& [id, m] : members_) {
    if (m.status.name() == name && m.Holds(job_id)) m.releasing = true;
  }
}

void Membership::Release(const std::string& job_id) {
  for (auto& [id, m] : members_) {
    if (!m.Holds(job_id)) continue;
    if (m.status.role() == MEMBER_ROLE_WORKER && m.status.alive()) {
      m.releasing = true;  // free once it has stopped
    } else {
      m.Free();
    }
  }
}

int Membership::Stopping(const std::string& job_id) const {
  int n = 0;
  for (const auto& [id, m] : members_) n += m.releasing && m.Holds(job_id) ? 1 : 0;
  return n;
}

std::vector<FreeMember> Membership::FreeMembers() const {
  std::vector<FreeMember> out;
  for (const auto& [id, m] : members_) {
    if (m.status.alive() && m.status.job_id().empty() && !m.leaving && m.status.unresponsive().empty()) {
      out.push_back({id, m.status.name(), m.status.role(), m.order});
    }
  }
  return out;
}

std::vector<MemberStatus> Membership::Statuses() const {
  std::vector<MemberStatus> out;
  for (const auto& [id, m] : members_) out.push_back(m.status);
  return out;
}

}  // namespace pstrain
