// EventWriter: one TensorBoard event file, written by one background thread.
//
// The file is TensorBoard's record format: per record, the data's length
// (uint64, little-endian), the masked CRC-32C of those 8 bytes, the data
// (a serialized tensorboard.Event), the masked CRC-32C of the data. The
// first event names the format ("brain.Event:2"). Records are only ever
// appended, so a crash at any moment leaves a file whose every complete
// record is valid and at most one partial record at the end, which readers
// (TensorBoard's and tests/read_events.py) stop at. That is why this file,
// unlike the project's other files, is not written to a temporary name and
// renamed: an event log is read while it grows.
//
// Add* never block on the disk: events go to a bounded queue (beyond
// max_queued they are dropped and counted) and the thread writes them, then
// fsyncs, every flush_interval, on Flush(), and at Close(). The thread also
// creates the directory and the file, so a caller may hold its own locks
// while it opens one. A write error stops the writer (status() says why);
// later events are dropped.
#ifndef PSTRAIN_TENSORBOARD_EVENT_WRITER_H_
#define PSTRAIN_TENSORBOARD_EVENT_WRITER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tensorboard.pb.h"

namespace pstrain {

struct EventWriterOptions {
  std::string dir;  // created (with parents) if missing
  absl::Duration flush_interval = absl::Seconds(2);
  size_t max_queued = 10000;
};

// One record of the format around `data`.
std::string EncodeRecord(absl::string_view data);

class EventWriter {
 public:
  explicit EventWriter(EventWriterOptions options);
  ~EventWriter();  // Close()
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // A scalar (TensorBoard's scalars plugin, `simple_value`).
  void AddScalar(absl::string_view tag, int64_t step, double value, absl::Time wall = absl::Now());
  // Markdown text (TensorBoard's text plugin: a string tensor).
  void AddText(absl::string_view tag, int64_t step, absl::string_view text, absl::Time wall = absl::Now());
  void Add(tensorboard::Event event);
  // Waits until everything added so far is written and synced (or the
  // writer failed).
  void Flush();
  // Writes what is queued and closes the file; later events are dropped.
  void Close();
  // Close without waiting: the thread finishes on its own (finished()
  // says when); the destructor waits for it.
  void CloseSoon();
  bool finished() const;

  // The file's path, once the thread has opened it ("" before, or if it
  // could not).
  std::string path() const;
  absl::Status status() const;
  uint64_t written() const { return written_.load(); }
  uint64_t dropped() const { return dropped_.load(); }

 private:
  void Run();
  absl::Status Open() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status WriteOut(std::deque<tensorboard::Event>& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);

  const EventWriterOptions options_;
  mutable absl::Mutex mu_;
  std::deque<tensorboard::Event> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t flush_requested_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flushed_ ABSL_GUARDED_BY(mu_) = 0;
  bool thread_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::string path_ ABSL_GUARDED_BY(mu_);
  // Only the thread touches the file.
  absl::Mutex io_mu_;
  int fd_ ABSL_GUARDED_BY(io_mu_) = -1;
  std::atomic<uint64_t> written_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace pstrain

#endif  // PSTRAIN_TENSORBOARD_EVENT_WRITER_H_
