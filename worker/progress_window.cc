#include "worker/progress_window.h"

#include <algorithm>

namespace pstrain {

void ProgressWindow::ReadLosses(bool all) {
  while (unread_.size() > (all ? 0u : 1u)) {
    const Step& u = unread_.front();
    const double loss = u.loss.defined() ? u.loss.Value() : 0.0;
    if (on_step_) on_step_(u.step, loss, u.samples, u.seconds, u.wait_seconds);
    if (u.loss.defined()) {
      sums_.loss += loss;
      ++sums_.loss_steps;
    }
    ++sums_.steps;
    sums_.samples += u.samples;
    sums_.seconds += u.seconds;
    sums_.wait += u.wait_seconds;
    sums_.data += u.data_seconds;
    sums_.lr += u.lr;
    if (u.grad_norm >= 0) {
      sums_.grad_norm += u.grad_norm;
      ++sums_.grad_norms;
    }
    unread_.pop_front();
  }
}

void ProgressWindow::Report(WorkerEvent::Progress* p, Clock::time_point now) {
  const double steps = std::max(1, sums_.steps);
  const double seconds = std::chrono::duration<double>(now - start_).count();
  p->set_loss(sums_.loss / std::max(1, sums_.loss_steps));
  p->set_samples_per_s(sums_.samples / std::max(1e-9, seconds));
  p->set_lr(sums_.lr / steps);
  p->set_step_time_s(sums_.seconds / steps);
  p->set_exchange_wait_s(sums_.wait / steps);
  p->set_data_wait_s(sums_.data / steps);
  if (sums_.grad_norms > 0) p->set_grad_norm(sums_.grad_norm / sums_.grad_norms);
  start_ = now;
  sums_ = Sums{};
}

WorkerEvent ProgressWindow::Event(int rank, int epoch, int epochs, int64_t step, int64_t steps,
                                  std::vector<ShardCalls> shards, Clock::time_point now, double elapsed_s) {
  WorkerEvent e;
  e.set_rank(rank);
  WorkerEvent::Progress* p = e.mutable_progress();
  p->set_epoch(epoch + 1);
  p->set_epochs(epochs);
  p->set_step(step);
  p->set_steps(steps);
  Report(p, now);
  for (ShardCalls& c : shards) *p->add_shards() = std::move(c);
  p->set_elapsed_s(elapsed_s);
  return e;
}

}  // namespace pstrain
