#include "tensorboard/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tensorboard/crc32c.h"

namespace pstrain {
namespace {

void PutFixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

double WallSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

std::string EncodeRecord(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xffu));
  PutFixed32(out, MaskCrc32c(Crc32c(out.data(), 8)));
  out.append(data.data(), data.size());
  PutFixed32(out, MaskCrc32c(Crc32c(data.data(), data.size())));
  return out;
}

EventWriter::EventWriter(EventWriterOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

EventWriter::~EventWriter() { Close(); }

void EventWriter::Add(tensorboard::Event event) {
  absl::MutexLock lock(&mu_);
  if (closing_ || !status_.ok() || queue_.size() >= options_.max_queued) {
    dropped_.fetch_add(1);
    return;
  }
  queue_.push_back(std::move(event));
}

void EventWriter::AddScalar(absl::string_view tag, int64_t step, double value, absl::Time wall) {
  tensorboard::Event e;
  e.set_wall_time(WallSeconds(wall));
  e.set_step(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  Add(std::move(e));
}

void EventWriter::AddText(absl::string_view tag, int64_t step, absl::string_view text, absl::Time wall) {
  tensorboard::Event e;
  e.set_wall_time(WallSeconds(wall));
  e.set_step(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape();  // a scalar: no dimensions
  t->add_string_val(std::string(text));
  Add(std::move(e));
}

void EventWriter::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t want = ++flush_requested_;
  auto done = [this, want]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return flushed_ >= want || thread_done_; };
  mu_.Await(absl::Condition(&done));
}

void EventWriter::CloseSoon() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
}

bool EventWriter::finished() const {
  absl::MutexLock lock(&mu_);
  return thread_done_;
}

void EventWriter::Close() {
  CloseSoon();
  if (thread_.joinable()) thread_.join();
}

std::string EventWriter::path() const {
  absl::MutexLock lock(&mu_);
  return path_;
}

absl::Status EventWriter::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status EventWriter::Open() {
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("creating ", options_.dir, ": ", ec.message()));
  // TensorBoard finds files by "tfevents" in the name; the time, host and
  // process make it unique, the counter covers two writers in one second.
  static std::atomic<int> counter{0};
  const std::string path =
      absl::StrCat(options_.dir, "/events.out.tfevents.", absl::ToUnixSeconds(absl::Now()), ".", HostName(), ".",
                   getpid(), ".", counter.fetch_add(1));
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) return ErrnoToStatus(errno, "creating", path);
  SyncDirectory(options_.dir);
  {
    absl::MutexLock lock(&mu_);
    path_ = path;
  }
  std::deque<tensorboard::Event> first(1);
  first.front().set_wall_time(WallSeconds(absl::Now()));
  first.front().set_file_version("brain.Event:2");
  return WriteOut(first);
}

absl::Status EventWriter::WriteOut(std::deque<tensorboard::Event>& events) {
  std::string bytes;
  for (const tensorboard::Event& e : events) bytes += EncodeRecord(e.SerializeAsString());
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = write(fd_, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "writing", path());
    off += static_cast<size_t>(n);
  }
  if (fsync(fd_) != 0) return ErrnoToStatus(errno, "syncing", path());
  written_.fetch_add(events.size());
  return absl::OkStatus();
}

void EventWriter::Run() {
  absl::MutexLock io(&io_mu_);
  absl::Status s = Open();
  for (;;) {
    std::deque<tensorboard::Event> batch;
    uint64_t flush_target;
    bool closing;
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closing_ || flush_requested_ > flushed_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), options_.flush_interval);
      batch.swap(queue_);
      flush_target = flush_requested_;
      closing = closing_;
      if (!status_.ok()) {
        dropped_.fetch_add(batch.size());
        batch.clear();
      }
    }
    if (!batch.empty()) s = WriteOut(batch);
    if (!s.ok()) dropped_.fetch_add(batch.size());
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      flushed_ = flush_target;
      if (closing && queue_.empty()) {
        thread_done_ = true;
        break;
      }
    }
  }
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace pstrain
