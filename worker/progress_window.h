// ProgressWindow: the training loop's figures between two progress events
// (WorkerEvent.Progress): each finished step's time, waits, samples, rate
// and loss, summed until the next event reports their means.
//
// A step's loss is read one step later (or when a progress event needs
// it): by then the device computed it long ago, and reading it waits for
// nothing else the device has queued since (DeferredScalar).
//
// Not thread-safe: the training loop's thread only.
#ifndef PSTRAIN_WORKER_PROGRESS_WINDOW_H_
#define PSTRAIN_WORKER_PROGRESS_WINDOW_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "proto/events.pb.h"
#include "worker/device.h"

namespace pstrain {

class ProgressWindow {
 public:
  using Clock = std::chrono::steady_clock;
  // Told of every step once its loss is read (TrainerOptions::on_step).
  using OnStep = std::function<void(int64_t step, double loss, int64_t samples, double seconds, double wait_seconds)>;

  // One finished step, its loss still where it was computed.
  struct Step {
    int64_t step = 0;
    DeferredScalar loss;  // undefined: the step trained no batch (StepBatches.own)
    int64_t samples = 0;
    double seconds = 0, wait_seconds = 0, data_seconds = 0, lr = 0;
    double grad_norm = -1;  // -1: not computed
  };

  // The first window starts at `start`.
  ProgressWindow(OnStep on_step, Clock::time_point start) : on_step_(std::move(on_step)), start_(start) {}

  void Add(Step step) { unread_.push_back(std::move(step)); }
  // Reads the losses of the steps added (all of them when `all`, else all
  // but the latest): each goes to on_step and into the window.
  void ReadLosses(bool all);
  // The window's means into `p` (loss, samples per second, lr, step time,
  // exchange and data waits, gradient norm), then a new window from `now`.
  // Read the losses first.
  void Report(WorkerEvent::Progress* p, Clock::time_point now);
  // A progress event of rank `rank` (both training loops send them): where
  // the loop stands, the window's means (Report), the shard calls since the
  // last event, the run's elapsed time.
  WorkerEvent Event(int rank, int epoch, int epochs, int64_t step, int64_t steps, std::vector<ShardCalls> shards,
                    Clock::time_point now, double elapsed_s);

 private:
  struct Sums {
    int steps = 0, loss_steps = 0;
    int64_t samples = 0;
    double loss = 0, seconds = 0, wait = 0, data = 0, lr = 0, grad_norm = 0;
    int grad_norms = 0;
  };

  const OnStep on_step_;
  Clock::time_point start_;
  Sums sums_;
  std::deque<Step> unread_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PROGRESS_WINDOW_H_
