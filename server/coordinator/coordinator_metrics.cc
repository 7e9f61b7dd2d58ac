#include "server/coordinator/coordinator_metrics.h"

#include <prometheus/metric_family.h>

#include <map>

#include "common/member_role.h"

namespace pstrain {
namespace {

prometheus::MetricFamily Gauge(const std::string& name, const std::string& help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

void Add(prometheus::MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels, double v) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  f.metric.push_back(std::move(m));
}

}  // namespace

std::vector<prometheus::MetricFamily> CoordinatorMetrics::Collect() const {
  auto jobs = Gauge("pstrain_jobs", "Jobs known to the coordinator, by state.");
  auto step = Gauge("pstrain_job_step", "Step of the slowest worker of a running job.");
  auto loss = Gauge("pstrain_job_loss", "Mean training loss of a running job's workers.");
  auto rate = Gauge("pstrain_job_samples_per_second", "Training samples per second of a running job, all workers.");
  auto accuracy = Gauge("pstrain_job_final_accuracy", "Final test accuracy of a finished job.");
  auto restarts = Gauge("pstrain_job_restarts", "Times a job resumed from its checkpoint after losing a member.");
  auto workers = Gauge("pstrain_job_workers",
                       "Workers of a running job, by state: active (training), vacant (lost, not yet replaced).");
  auto replacements = Gauge("pstrain_job_replacements",
                            "Workers that took over a lost worker's rank in the job's current attempt.");
  std::map<JobState, int> by_state;
  for (JobState s : {PENDING, RUNNING, CHECKPOINTING, SUCCEEDED, FAILED, CANCELLED}) by_state[s] = 0;
  for (const JobStatus& j : coordinator_->ListJobs()) {
    ++by_state[j.state()];
    const std::vector<prometheus::ClientMetric::Label> labels = {{"job", j.job_id()}, {"name", j.name()}};
    if (j.state() == RUNNING) {
      Add(step, labels, static_cast<double>(j.step()));
      Add(loss, labels, j.loss());
      Add(rate, labels, j.samples_per_s());
      auto with = [&](const char* state) {
        auto l = labels;
        l.push_back({"state", state});
        return l;
      };
      Add(workers, with("active"), j.num_workers() - j.vacant_ranks_size());
      Add(workers, with("vacant"), j.vacant_ranks_size());
      Add(replacements, labels, j.replacements());
    }
    if (j.final_accuracy() >= 0) Add(accuracy, labels, j.final_accuracy());
    Add(restarts, labels, j.restarts());
  }
  for (const auto& [state, n] : by_state) Add(jobs, {{"state", JobStateName(state)}}, n);

  auto up = Gauge("pstrain_member_up", "1 if a registered shard or worker is alive, 0 if lost.");
  auto quarantined = Gauge("pstrain_member_quarantined",
                           "1 if a shard's table service answered no probe while it heartbeated: it gets no job "
                           "until a fresh process registers its name.");
  for (const MemberStatus& m : coordinator_->Members()) {
    Add(up, {{"role", RoleName(m.role())}, {"name", m.name()}}, m.alive() ? 1 : 0);
    if (!m.unresponsive().empty()) Add(quarantined, {{"role", RoleName(m.role())}, {"name", m.name()}}, 1);
  }
  auto dropped = Gauge("pstrain_tensorboard_events_dropped",
                       "TensorBoard events not written (a writer's queue full, or its disk failing).");
  Add(dropped, {}, static_cast<double>(coordinator_->TelemetryDropped()));
  return {jobs, step, loss, rate, accuracy, restarts, workers, replacements, up, quarantined, dropped};
}

}  // namespace pstrain
