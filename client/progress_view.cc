#include "client/progress_view.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace pstrain {

ProgressView::ProgressView(FILE* out, bool terminal, int workers)
    : out_(out), terminal_(terminal), workers_(workers), start_(absl::Now()) {}

void ProgressView::ClearLine() {
  if (terminal_ && bar_shown_) {
    std::fprintf(out_, "\r\033[2K");
    bar_shown_ = false;
  }
}

void ProgressView::OnEvent(const std::string& line) {
  nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (e.is_discarded() || !e.is_object() || !e.contains("event")) return;
  const std::string kind = e["event"].get<std::string>();
  if (kind == "progress") {
    RankState& r = ranks_[e.value("rank", 0)];
    r.epoch = e.value("epoch", 0);
    r.epochs = e.value("epochs", 0);
    r.step = e.value("step", int64_t{0});
    r.steps = e.value("steps", int64_t{0});
    r.loss = e.value("loss", 0.0);
    r.samples_per_s = e.value("samples_per_s", 0.0);
    Render(false);
  } else if (kind == "eval") {
    ClearLine();
    const bool final = e.value("final", false);
    std::fprintf(out_, "%s epoch %d: test accuracy %.4f, test loss %.4f\n",
                 final ? "final   " : "eval    ", e.value("epoch", 0), e.value("accuracy", 0.0),
                 e.value("test_loss", 0.0));
    if (final) {
      summary_.final_accuracy = e.value("accuracy", 0.0);
      summary_.final_loss = e.value("test_loss", 0.0);
    }
    Render(true);
  } else if (kind == "done") {
    summary_.samples += e.value("samples", int64_t{0});
    summary_.seconds = std::max(summary_.seconds, e.value("seconds", 0.0));
  } else if (kind == "weights") {
    summary_.weights_path = e.value("path", "");
  }
  std::fflush(out_);
}

void ProgressView::Render(bool force) {
  if (ranks_.empty()) return;
  // The job is as far along as its slowest worker; throughput is the sum.
  RankState slow = ranks_.begin()->second;
  double rate = 0, loss = 0;
  for (const auto& [rank, r] : ranks_) {
    if (r.step < slow.step) slow = r;
    rate += r.samples_per_s;
    loss += r.loss;
  }
  loss /= ranks_.size();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
  const double frac = slow.steps > 0 ? static_cast<double>(slow.step) / slow.steps : 0;
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  const std::string eta_s = absl::StrFormat("%d:%02d", static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  if (terminal_) {
    const int width = 28;
    const int filled = static_cast<int>(frac * width);
    std::string bar(filled, '#');
    bar += std::string(width - filled, '-');
    std::fprintf(out_, "\r\033[2Kepoch %d/%d [%s] %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                 slow.epoch, slow.epochs, bar.c_str(), static_cast<long long>(slow.step),
                 static_cast<long long>(slow.steps), loss, rate, eta_s.c_str());
    bar_shown_ = true;
  } else if (!force && (last_plain_ == absl::InfinitePast() || slow.step == slow.steps ||
                         absl::Now() - last_plain_ > absl::Seconds(2))) {
    // Plain mode (not a terminal): the first report, then every 2 s, and the
    // last step; evaluation lines speak for themselves.
    std::fprintf(out_, "epoch %d/%d  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s\n",
                 slow.epoch, slow.epochs, static_cast<long long>(slow.step),
                 static_cast<long long>(slow.steps), loss, rate, eta_s.c_str());
    last_plain_ = absl::Now();
  }
}

}  // namespace pstrain
