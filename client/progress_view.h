// ProgressView: turns a job's status updates (JobStatus, as WatchJob streams
// them) into what a person watches. On a terminal, one line redrawn in
// place: a bar with epoch, step/total, loss, samples/s (all workers) and
// ETA. Otherwise (a log file, CI), a plain line at the first report, every
// 2 s and at the last step. Each evaluation gets its own line either way.
#ifndef PSTRAIN_CLIENT_PROGRESS_VIEW_H_
#define PSTRAIN_CLIENT_PROGRESS_VIEW_H_

#include <cstdio>
#include <string>

#include "absl/time/time.h"
#include "proto/control.pb.h"

namespace pstrain {

class ProgressView {
 public:
  ProgressView(FILE* out, bool terminal);

  void OnStatus(const JobStatus& status);
  // Clears the bar line (before printing anything else).
  void ClearLine();

 private:
  void Render(const JobStatus& status);

  FILE* out_;
  bool terminal_;
  absl::Time start_;
  absl::Time last_plain_ = absl::InfinitePast();
  int64_t last_plain_step_ = -1;
  bool bar_shown_ = false;
  int evals_printed_ = 0;
  JobState last_state_ = JOB_STATE_UNSPECIFIED;
};

// One line for a finished job: "done: 9.7 s, 18587 samples/s, final test
// accuracy 0.8885" (or why it did not succeed).
std::string SummaryLine(const JobStatus& status);

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_PROGRESS_VIEW_H_
