#include "server/coordinator/job_telemetry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace pstrain {
namespace {

double Unix(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

// Ranks and shards come from the job's own size, but a report is a
// member's word: only this many get a tag of their own.
constexpr int kMaxTaggedIndex = 4096;

int ShardLimit(const JobStatus& status) { return std::min(kMaxTaggedIndex, std::max(1, status.num_shards())); }

}  // namespace

JobTelemetry::JobTelemetry(TelemetryOptions options) : options_(options) {}

JobTelemetry::~JobTelemetry() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, d] : jobs_) {
    if (d.writer) d.writer->CloseSoon();
  }
  for (auto& w : retired_) w->CloseSoon();
  // The writers' destructors wait for their last writes.
}

JobTelemetry::JobData& JobTelemetry::Data(const std::string& job) {
  JobData& d = jobs_[job];
  d.touched = ++clock_;
  if (jobs_.size() > options_.max_jobs) {
    // Forget the job least recently heard of (never the one just touched).
    auto oldest = jobs_.end();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (oldest == jobs_.end() || it->second.touched < oldest->second.touched) oldest = it;
    }
    if (oldest->second.writer) Retire(std::move(oldest->second.writer));
    jobs_.erase(oldest);
  }
  return jobs_[job];
}

void JobTelemetry::Retire(std::unique_ptr<EventWriter> writer) {
  writer->CloseSoon();
  retired_.push_back(std::move(writer));
  // Join those that are done (their destructors return at once).
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->finished()) {
      retired_dropped_ += (*it)->dropped();
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
}

void JobTelemetry::StartAttempt(const std::string& job, uint64_t attempt, const std::string& job_dir,
                                const std::string& spec_yaml) {
  if (!options_.tensorboard) return;
  absl::MutexLock lock(&mu_);
  JobData& d = Data(job);
  if (d.writer) Retire(std::move(d.writer));
  EventWriterOptions o;
  o.dir = absl::StrCat(job_dir, "/tensorboard/attempt-", attempt);
  o.flush_interval = options_.flush_interval;
  o.max_queued = options_.max_queued;
  d.writer = std::make_unique<EventWriter>(o);
  // Markdown: indented by four spaces, the YAML shows as written.
  d.writer->AddText("job/spec", 0, "    " + absl::StrReplaceAll(spec_yaml, {{"\n", "\n    "}}));
}

void JobTelemetry::EndAttempt(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.writer) Retire(std::move(it->second.writer));
}

void JobTelemetry::Append(std::vector<CurvePoint>& curve, CurvePoint p) const {
  curve.push_back(p);
  if (curve.size() <= options_.max_points) return;
  // Full: keep every other point (the whole run at half the resolution).
  const size_t last = curve.size() - 1;
  size_t out = 0;
  for (size_t i = 0; i < curve.size(); i += 2) curve[out++] = curve[i];
  if (last % 2 != 0) curve[out++] = curve[last];  // the newest point stays
  curve.resize(out);
}

void JobTelemetry::Progress(const std::string& job, int rank, const WorkerEvent::Progress& p,
                            const JobStatus& status) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  JobData& d = Data(job);
  const int64_t step = p.step();
  if (rank == 0) {
    Append(d.curves.loss, {step, Unix(now), status.loss()});
    Append(d.curves.samples_per_s, {step, Unix(now), status.samples_per_s()});
    d.curves.shards.clear();
    for (int i = 0; i < std::min(p.shards_size(), ShardLimit(status)); ++i) {
      const ShardCalls& c = p.shards(i);
      if (c.shard() >= 0 && c.shard() < ShardLimit(status)) d.curves.shards[c.shard()] = c;
    }
  }
  EventWriter* w = d.writer.get();
  if (w == nullptr || rank < 0 || rank >= kMaxTaggedIndex) return;
  const std::string r = absl::StrCat("rank_", rank, "/");
  w->AddScalar(r + "loss", step, p.loss(), now);
  w->AddScalar(r + "samples_per_s", step, p.samples_per_s(), now);
  w->AddScalar(r + "step_time_ms", step, p.step_time_s() * 1e3, now);
  w->AddScalar(r + "exchange_wait_ms", step, p.exchange_wait_s() * 1e3, now);
  w->AddScalar(r + "data_wait_ms", step, p.data_wait_s() * 1e3, now);
  // fp16: each parameter-server worker scales (and skips) on its own.
  if (p.has_loss_scale()) {
    w->AddScalar(r + "loss_scale", step, p.loss_scale(), now);
    w->AddScalar(r + "skipped_steps", step, static_cast<double>(p.skipped_steps()), now);
  }
  if (rank != 0) return;
  w->AddScalar("train/loss", step, status.loss(), now);
  w->AddScalar("train/samples_per_s", step, status.samples_per_s(), now);
  w->AddScalar("train/learning_rate", step, p.lr(), now);
  w->AddScalar("train/step_time_ms", step, p.step_time_s() * 1e3, now);
  w->AddScalar("train/exchange_wait_ms", step, p.exchange_wait_s() * 1e3, now);
  w->AddScalar("train/data_wait_ms", step, p.data_wait_s() * 1e3, now);
  if (p.has_grad_norm()) w->AddScalar("train/grad_norm", step, p.grad_norm(), now);
  if (p.has_loss_scale()) {
    w->AddScalar("train/loss_scale", step, p.loss_scale(), now);
    w->AddScalar("train/skipped_steps", step, static_cast<double>(p.skipped_steps()), now);
  }
  // A report is a member's word: at most one entry per shard of the job is
  // looked at, however many it sends.
  for (int i = 0; i < std::min(p.shards_size(), ShardLimit(status)); ++i) {
    const ShardCalls& c = p.shards(i);
    if (c.shard() < 0 || c.shard() >= ShardLimit(status)) continue;
    const std::string s = absl::StrCat("shard_", c.shard(), "/");
    w->AddScalar(s + "call_ms", step, c.mean_ms(), now);
    w->AddScalar(s + "bytes_per_s", step, c.bytes_per_s(), now);
  }
}

void JobTelemetry::Eval(const std::string& job, const WorkerEvent::Eval& e, int64_t step) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  JobData& d = Data(job);
  Append(d.curves.accuracy, {step, Unix(now), e.accuracy()});
  Append(d.curves.test_loss, {step, Unix(now), e.test_loss()});
  const bool click = e.auc() > 0;  // 0: not a click model's evaluation
  if (click) Append(d.curves.auc, {step, Unix(now), e.auc()});
  if (d.writer == nullptr) return;
  d.writer->AddScalar("eval/accuracy", step, e.accuracy(), now);
  d.writer->AddScalar("eval/test_loss", step, e.test_loss(), now);
  if (click) {
    d.writer->AddScalar("eval/auc", step, e.auc(), now);
    d.writer->AddScalar("eval/log_loss", step, e.log_loss(), now);
  }
}

JobCurves JobTelemetry::Curves(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? JobCurves{} : it->second.curves;
}

std::optional<JobTelemetry::Pace> JobTelemetry::RecentPace(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.curves.loss.size() < 2) return std::nullopt;
  const std::vector<CurvePoint>& loss = it->second.curves.loss;
  const CurvePoint& last = loss.back();
  // The oldest point of the last minute, at worst the one before the last.
  auto first = std::lower_bound(loss.begin(), loss.end() - 1, last.wall_s - 60,
                                [](const CurvePoint& p, double t) { return p.wall_s < t; });
  if (first == loss.end() - 1) --first;
  return Pace{last.step, (last.step - first->step) / std::max(1e-9, last.wall_s - first->wall_s)};
}

uint64_t JobTelemetry::dropped() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = retired_dropped_;
  for (const auto& [id, d] : jobs_) n += d.writer ? d.writer->dropped() : 0;
  for (const auto& w : retired_) n += w->dropped();
  return n;
}

}  // namespace pstrain
