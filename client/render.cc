#include "client/render.h"

#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/eval_text.h"
#include "common/activity_text.h"
#include "common/member_role.h"

const char* StateName(pstrain::JobState s) {
  switch (s) {
    case pstrain::PENDING:
      return "Pending";
    case pstrain::RUNNING:
      return "Running";
    case pstrain::CHECKPOINTING:
      return "Checkpointing";
    case pstrain::SUCCEEDED:
      return "Succeeded";
    case pstrain::FAILED:
      return "Failed";
    case pstrain::CANCELLED:
      return "Cancelled";
    default:
      return "Unknown";
  }
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Ago(int64_t unix_ms) {
  const int64_t s = (absl::ToUnixMillis(absl::Now()) - unix_ms) / 1000;
  if (s < 120) return absl::StrFormat("%ds", s);
  if (s < 7200) return absl::StrFormat("%dm", s / 60);
  return absl::StrFormat("%dh", s / 3600);
}

void PrintJobTable(const pstrain::JobStatus& st) {
  std::printf("job:        %s (%s)\n", st.job_id().c_str(), st.name().c_str());
  std::printf("state:      %s\n", StateName(st.state()));
  if (!st.pending_reason().empty()) std::printf("waiting:    %s\n", st.pending_reason().c_str());
  if (!st.last_checkpoint().empty()) std::printf("checkpoint: %s\n", st.last_checkpoint().c_str());
  if (st.restarts() > 0) std::printf("restarts:   %d (from checkpoints, after losing a member)\n", st.restarts());
  if (st.vacant_ranks_size() > 0 || st.replacements() > 0) {
    std::string vacant;
    for (int r : st.vacant_ranks()) vacant += absl::StrCat(vacant.empty() ? "" : ", ", r);
    std::printf("workers:    %d of %d training%s; %d replaced while running\n",
                st.num_workers() - st.vacant_ranks_size(), st.num_workers(),
                vacant.empty() ? "" : absl::StrCat(" (vacant: rank ", vacant, ")").c_str(), st.replacements());
  }
  std::printf("progress:   epoch %d, step %lld/%lld, loss %.4f, %.0f samples/s\n", st.epoch(),
              static_cast<long long>(st.step()), static_cast<long long>(st.steps()), st.loss(), st.samples_per_s());
  if (st.workers_size() > 0) {
    // Per rank: its last progress, and what its last heartbeat said it was
    // doing (a slow or stuck rank waits on something for long).
    std::map<int, const pstrain::MemberStatus*> by_rank;
    for (const auto& m : st.members()) {
      if (m.role() == pstrain::MEMBER_ROLE_WORKER) by_rank[m.rank()] = &m;
    }
    // A pipelined job's ranks: their stage, and the share of their step
    // spent waiting for the neighbouring stages.
    const bool staged = std::any_of(st.workers().begin(), st.workers().end(),
                                    [](const pstrain::WorkerProgress& w) { return w.has_stage(); });
    std::printf("  %-5s %s%-6s %-15s %-8s %-10s %s\n", "RANK", staged ? "STAGE BUBBLE " : "", "EPOCH", "STEP", "LOSS",
                "SAMPLES/S", "NOW");
    for (const auto& w : st.workers()) {
      auto it = by_rank.find(w.rank());
      std::string now = "-";
      if (it != by_rank.end() && it->second->has_activity()) {
        const pstrain::WorkerActivity& a = it->second->activity();
        now = absl::StrFormat("%s, %.1fs (step %d)", pstrain::ActivityText(a), a.for_s(), a.step());
      }
      const std::string stage =
          staged ? absl::StrFormat("%-5s %-6s ", absl::StrCat(w.stage(), "/", w.stages()),
                                   absl::StrFormat("%.0f%%", 100 * w.bubble()))
                 : "";
      std::printf("  %-5d %s%-6d %-15s %-8.4f %-10.0f %s\n", w.rank(), stage.c_str(), w.epoch(),
                  absl::StrFormat("%d/%d", w.step(), w.steps()).c_str(), w.loss(), w.samples_per_s(), now.c_str());
    }
  }
  for (const auto& e : st.evals()) {
    std::printf("eval:       epoch %d: %s\n", e.epoch(), pstrain::EvalText(e).c_str());
  }
  if (st.final_accuracy() >= 0) std::printf("final:      test accuracy %.4f\n", st.final_accuracy());
  if (st.final_auc() > 0) std::printf("final:      test AUC %.4f\n", st.final_auc());
  if (!st.weights_path().empty()) std::printf("weights:    %s\n", st.weights_path().c_str());
  std::printf("members:\n");
  for (const auto& m : st.members()) {
    std::printf("  %-6s %-3d %-16s %-22s %s\n", pstrain::RoleName(m.role()), m.rank(), m.name().c_str(),
                m.address().c_str(), !m.unresponsive().empty() ? "HUNG" : m.alive() ? "alive" : "LOST");
  }
  std::printf("conditions:\n");
  for (const auto& c : st.conditions()) {
    std::printf("  %-6s ago  %-13s %-16s %s\n", Ago(c.time_unix_ms()).c_str(), StateName(c.state()), c.reason().c_str(),
                c.message().c_str());
  }
}

void PrintJobList(const pstrain::ListJobsResponse& resp) {
  std::printf("%-12s %-24s %-13s %-13s %-8s %-9s %s\n", "JOB", "NAME", "STATE", "STEP", "LOSS", "ACCURACY", "AGE");
  for (const auto& j : resp.jobs()) {
    std::printf("%-12s %-24s %-13s %-13s %-8.4f %-9s %s\n", j.job_id().c_str(), j.name().c_str(), StateName(j.state()),
                absl::StrFormat("%d/%d", j.step(), j.steps()).c_str(), j.loss(),
                j.final_accuracy() >= 0 ? absl::StrFormat("%.4f", j.final_accuracy()).c_str()
                : j.final_auc() > 0     ? absl::StrFormat("AUC %.4f", j.final_auc()).c_str()
                                        : "-",
                Ago(j.created_unix_ms()).c_str());
  }
}

void PrintMembers(const pstrain::ListMembersResponse& resp) {
  std::printf("%-7s %-18s %-22s %-7s %-12s %-5s %s\n", "ROLE", "NAME", "ADDRESS", "HEALTH", "JOB", "RANK", "LAST BEAT");
  for (const auto& m : resp.members()) {
    std::printf("%-7s %-18s %-22s %-7s %-12s %-5s %s ago\n", pstrain::RoleName(m.role()), m.name().c_str(),
                m.address().empty() ? "-" : m.address().c_str(),
                !m.unresponsive().empty() ? "HUNG" : m.alive() ? "alive" : "LOST",
                m.job_id().empty() ? "-" : m.job_id().c_str(),
                m.job_id().empty() ? "-" : std::to_string(m.rank()).c_str(), Ago(m.last_heartbeat_unix_ms()).c_str());
  }
}
