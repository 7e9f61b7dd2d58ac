// ProgressView: turns the workers' JSON events into what a person watches.
// On a terminal, one line redrawn in place: a bar with epoch, step/total,
// loss, samples/s (all workers) and ETA. Otherwise (a log file, CI), a plain
// line every few seconds. Evaluations get their own line either way.
#ifndef PSTRAIN_CLIENT_PROGRESS_VIEW_H_
#define PSTRAIN_CLIENT_PROGRESS_VIEW_H_

#include <cstdio>
#include <map>
#include <string>

#include "absl/time/time.h"

namespace pstrain {

struct RunSummary {
  double seconds = 0;
  int64_t samples = 0;
  double final_accuracy = -1;
  double final_loss = -1;
  std::string weights_path;
};

class ProgressView {
 public:
  ProgressView(FILE* out, bool terminal, int workers);

  void OnEvent(const std::string& line);
  // Clears the bar line (before printing anything else).
  void ClearLine();
  const RunSummary& summary() const { return summary_; }

 private:
  void Render(bool force);

  FILE* out_;
  bool terminal_;
  int workers_;
  absl::Time start_;
  absl::Time last_plain_ = absl::InfinitePast();
  bool bar_shown_ = false;
  // Latest progress per rank.
  struct RankState {
    int epoch = 0, epochs = 0;
    int64_t step = 0, steps = 0;
    double loss = 0, samples_per_s = 0;
  };
  std::map<int, RankState> ranks_;
  RunSummary summary_;
};

}  // namespace pstrain

#endif  // PSTRAIN_CLIENT_PROGRESS_VIEW_H_
