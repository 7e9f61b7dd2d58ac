#include "client/progress_view.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/eval_text.h"

namespace pstrain {

ProgressView::ProgressView(FILE* out, bool terminal) : out_(out), terminal_(terminal), start_(absl::Now()) {}

void ProgressView::ClearLine() {
  if (terminal_ && bar_shown_) {
    std::fprintf(out_, "\r\033[2K");
    bar_shown_ = false;
  }
}

void ProgressView::OnStatus(const JobStatus& st) {
  if (st.state() != last_state_ && !st.conditions().empty()) {
    const JobCondition& c = *st.conditions().rbegin();
    if (st.state() == RUNNING || st.state() == PENDING) {
      ClearLine();
      std::fprintf(out_, "%-8s %s: %s\n", st.state() == RUNNING ? "running" : "pending", c.reason().c_str(),
                   c.message().c_str());
    }
    last_state_ = st.state();
  }
  for (; evals_printed_ < st.evals_size(); ++evals_printed_) {
    const EpochEval& e = st.evals(evals_printed_);
    const bool last = evals_printed_ == st.evals_size() - 1;
    const bool final = last && ((st.final_accuracy() >= 0 && e.accuracy() == st.final_accuracy()) ||
                                (st.final_auc() > 0 && e.auc() == st.final_auc()));
    ClearLine();
    std::fprintf(out_, "%s epoch %d: %s\n", final ? "final   " : "eval    ", e.epoch(), EvalText(e).c_str());
  }
  if (st.state() == RUNNING && st.steps() > 0) Render(st);
  std::fflush(out_);
}

void ProgressView::Render(const JobStatus& st) {
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
  const double frac = static_cast<double>(st.step()) / st.steps();
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  const std::string eta_s = absl::StrFormat("%d:%02d", static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  if (terminal_) {
    const int width = 28;
    const int filled = std::clamp(static_cast<int>(frac * width), 0, width);
    std::string bar(filled, '#');
    bar += std::string(width - filled, '-');
    std::fprintf(out_, "\r\033[2Kepoch %d [%s] %lld/%lld  loss %.4f  %.0f samples/s  ETA %s", st.epoch(), bar.c_str(),
                 static_cast<long long>(st.step()), static_cast<long long>(st.steps()), st.loss(), st.samples_per_s(),
                 eta_s.c_str());
    bar_shown_ = true;
  } else if (st.step() != last_plain_step_ && (last_plain_ == absl::InfinitePast() || st.step() == st.steps() ||
                                               absl::Now() - last_plain_ > absl::Seconds(2))) {
    std::fprintf(out_, "epoch %d  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s\n", st.epoch(),
                 static_cast<long long>(st.step()), static_cast<long long>(st.steps()), st.loss(), st.samples_per_s(),
                 eta_s.c_str());
    last_plain_ = absl::Now();
    last_plain_step_ = st.step();
  }
}

std::string SummaryLine(const JobStatus& st) {
  if (st.state() != SUCCEEDED) {
    const std::string why = st.conditions().empty() ? "" : st.conditions().rbegin()->message();
    return absl::StrFormat("%s: %s", st.state() == CANCELLED ? "cancelled" : "failed", why);
  }
  std::string line = absl::StrFormat("done: %.1f s, %.0f samples/s", st.train_seconds(),
                                     st.train_seconds() > 0 ? st.samples() / st.train_seconds() : 0.0);
  if (st.final_accuracy() >= 0) line += absl::StrFormat(", final test accuracy %.4f", st.final_accuracy());
  if (st.final_auc() > 0) line += absl::StrFormat(", final test AUC %.4f", st.final_auc());
  if (!st.weights_path().empty()) line += "\nweights: " + st.weights_path();
  return line;
}

}  // namespace pstrain
