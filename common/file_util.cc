#include "common/file_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/quote.h"

namespace pstrain {

absl::Status ErrnoToStatus(int err, absl::string_view what, absl::string_view path) {
  const std::string msg = absl::StrCat(what, " ", Quote(path, 256), ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(msg);
    case ENOTDIR:
    case EISDIR:
    case ELOOP:
    case ENAMETOOLONG:
    case EINVAL:
    case ENXIO:
      return absl::InvalidArgumentError(msg);
    case EINTR:
    case EAGAIN:
    case EBUSY:
    case ETIMEDOUT:
      return absl::UnavailableError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  // Unique per process and call: two writers of one target never share a
  // temporary file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "cannot create", tmp);
  auto fail = [&](const char* what) {
    absl::Status s = ErrnoToStatus(errno, what, tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  const char* p = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("cannot fsync");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoToStatus(errno, "cannot rename to", path);
    ::unlink(tmp.c_str());
    return s;
  }
  const size_t slash = path.rfind('/');
  SyncDirectory(slash == std::string::npos ? "." : path.substr(0, slash + 1));
  return absl::OkStatus();
}

void SyncDirectory(const std::string& dir) {
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoToStatus(errno == 0 ? ENOENT : errno, "cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("a file name must not contain a NUL byte");
  }
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoToStatus(errno, "cannot stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(Quote(path, 256), " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(Quote(path, 256), " has ", st.st_size,
                                                      " bytes, more than the ", max_bytes, " expected"));
  }
  std::string out;
  try {
    out.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("no memory to read ", st.st_size, " bytes of ", Quote(path, 256)));
  }
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, &out[got], out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoToStatus(errno, "cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;  // shrank under us: reported by the caller's size check
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

absl::StatusOr<std::string> CanonicalRoot(const std::string& dir) {
  if (dir.empty() || dir.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("the root directory name is empty or holds a NUL");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "cannot create", dir);
  const std::filesystem::path canonical = std::filesystem::canonical(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "cannot resolve", dir);
  return canonical.string();
}

absl::Status CheckRelativeName(absl::string_view name, absl::string_view root_name) {
  constexpr size_t kMaxName = 1024;
  if (name.empty()) return absl::InvalidArgumentError("the file name is empty");
  if (name.size() > kMaxName) {
    return absl::InvalidArgumentError(absl::StrCat("the file name ", Quote(name), " is longer than ", kMaxName, " bytes"));
  }
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("the file name ", Quote(name),
                                                     " holds a NUL or control character"));
    }
  }
  if (name.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("the file name ", Quote(name),
                                                   " is absolute: give it relative to ", root_name));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == ".." || part == ".") {
      return absl::InvalidArgumentError(absl::StrCat("the file name ", Quote(name), " has a '", part,
                                                     "' component: give it relative to ", root_name,
                                                     ", inside it"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveUnderRoot(const std::string& root, absl::string_view name,
                                             absl::string_view root_name) {
  absl::Status checked = CheckRelativeName(name, root_name);
  if (!checked.ok()) return checked;
  const std::string full = root == "/" ? absl::StrCat("/", name) : absl::StrCat(root, "/", name);
  // The longest existing prefix must resolve inside root: a symbolic link
  // planted in the tree cannot lead out of it.
  std::filesystem::path existing = std::filesystem::path(full).parent_path();
  std::error_code ec;
  while (!existing.empty() && !std::filesystem::exists(existing, ec)) existing = existing.parent_path();
  const std::filesystem::path resolved = std::filesystem::canonical(existing, ec);
  if (ec) return ErrnoToStatus(ec.value(), "cannot resolve", existing.string());
  const std::string r = resolved.string();
  if (root != "/" && r != root && r.rfind(root + "/", 0) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("the file name ", Quote(name),
                                                    " leads (through a symbolic link) outside ", root_name));
  }
  return full;
}

}  // namespace pstrain
