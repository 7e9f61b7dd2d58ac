#include "worker/data_root.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {
namespace {

bool Under(const std::string& path, const std::string& root) {
  return root == "/" || path == root || path.rfind(root + "/", 0) == 0;
}

// Closes a descriptor on every way out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

std::string TooBig(absl::string_view name, const DataRoot& root, absl::string_view what) {
  return absl::StrCat("data file ", Quote(name, 200), " ", what, " more than ", root.max_file_bytes,
                      " bytes: raise the worker's --max_data_file_bytes if it is meant to be this large");
}

absl::StatusOr<std::string> ReadPlain(int fd, uint64_t size, absl::string_view name) {
  std::string out;
  try {
    out.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory to read ", size, " bytes of ", Quote(name, 200)));
  }
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, &out[got], out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "cannot read data file", name);
    }
    if (n == 0) break;  // shrank under us: the parsers see a short file
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

// Decompresses at most root.max_file_bytes; one more byte is an error.
absl::StatusOr<std::string> ReadGzip(Fd& fd, absl::string_view name, const DataRoot& root) {
  gzFile f = gzdopen(fd.get(), "rb");
  if (f == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot open gzip file ", Quote(name, 200)));
  fd.release();  // gzclose closes it
  std::string out;
  constexpr size_t kChunk = 1 << 20;
  while (true) {
    const uint64_t room = root.max_file_bytes - out.size();  // out never exceeds the bound
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, room + 1));
    const size_t old = out.size();
    try {
      out.resize(old + want);
    } catch (const std::bad_alloc&) {
      gzclose(f);
      return absl::ResourceExhaustedError(absl::StrCat("no memory to decompress ", Quote(name, 200)));
    }
    const int n = gzread(f, &out[old], static_cast<unsigned>(want));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return absl::DataLossError(absl::StrCat(Quote(name, 200), ": corrupt gzip data (", Quote(msg, 200), ")"));
    }
    out.resize(old + static_cast<size_t>(n));
    if (out.size() > root.max_file_bytes) {
      gzclose(f);
      return absl::FailedPreconditionError(TooBig(name, root, "decompresses to"));
    }
    if (n == 0) break;
  }
  // gzclose reports a stream that ended early (a truncated .gz file).
  const int rc = gzclose(f);
  if (rc == Z_BUF_ERROR) {
    return absl::DataLossError(absl::StrCat(Quote(name, 200), ": truncated gzip file (the stream ends early)"));
  }
  if (rc != Z_OK) return absl::DataLossError(absl::StrCat(Quote(name, 200), ": cannot read (zlib error ", rc, ")"));
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadDataFile(const DataRoot& root, absl::string_view name, bool maybe_gzip) {
  if (root.dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", Quote(name, 200),
                                                      ": this worker reads no data files (start it with "
                                                      "--data_root=DIR, the directory that holds the jobs' data)"));
  }
  absl::Status checked = CheckRelativeName(name, kDataRootName);
  if (!checked.ok()) return absl::InvalidArgumentError(absl::StrCat("data file: ", checked.message()));
  std::error_code ec;
  const std::filesystem::path croot = std::filesystem::canonical(root.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("the worker's --data_root ", Quote(root.dir, 200),
                                                      " cannot be used (", ec.message(), "): point --data_root at "
                                                      "the directory that holds the jobs' data"));
  }
  const std::string root_path = croot.string();
  const std::string full = absl::StrCat(root_path == "/" ? "" : root_path, "/", name);
  // Symbolic links inside the root are followed, as long as they stay in it.
  const std::string real = std::filesystem::canonical(full, ec).string();
  if (ec) {
    if (ec.value() == ENOENT) {
      return absl::NotFoundError(absl::StrCat("data file ", Quote(name, 200), " is not under ", kDataRootName, " (",
                                              Quote(root_path, 200), ")"));
    }
    return ErrnoToStatus(ec.value(), "cannot resolve data file", name);
  }
  auto outside = [&] {
    return absl::PermissionDeniedError(absl::StrCat("data file ", Quote(name, 200), " leads (through a symbolic link) "
                                                    "outside ", kDataRootName, " (", Quote(root_path, 200), ")"));
  };
  if (!Under(real, root_path)) return outside();
  // Non-blocking: a FIFO would otherwise wait here for a writer. Never
  // following a last symbolic link: `real` has none, unless one was put there
  // since.
  Fd fd(::open(real.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "cannot open data file", name);
  // What was opened, not what the name meant a moment ago: a directory
  // swapped for a link since is caught here (where /proc is mounted).
  char link[4096];
  const ssize_t len = ::readlink(absl::StrCat("/proc/self/fd/", fd.get()).c_str(), link, sizeof(link) - 1);
  if (len > 0 && !Under(std::string(link, static_cast<size_t>(len)), root_path)) return outside();
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "cannot stat data file", name);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("data file ", Quote(name, 200), " is not a regular file (",
                                                   S_ISDIR(st.st_mode) ? "a directory" : "a device, FIFO or socket",
                                                   "): name a file under ", kDataRootName));
  }
  if (static_cast<uint64_t>(st.st_size) > root.max_file_bytes) {
    return absl::FailedPreconditionError(TooBig(name, root, absl::StrCat("has ", st.st_size, " bytes,")));
  }
  // Back to blocking reads: a regular file never blocks anyway.
  (void)::fcntl(fd.get(), F_SETFL, 0);
  unsigned char magic[2] = {0, 0};
  const bool gzip = maybe_gzip && ::pread(fd.get(), magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (gzip) return ReadGzip(fd, name, root);
  return ReadPlain(fd.get(), static_cast<uint64_t>(st.st_size), name);
}

}  // namespace pstrain
