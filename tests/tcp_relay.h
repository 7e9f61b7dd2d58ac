// A TCP relay for tests: it listens on host:port and relays each
// connection to a target. Freeze() stops the relaying: connections stay
// open and what is sent waits in the kernel's buffers, unanswered, as with
// a network partition (or a network policy) that cuts one port of a
// process whose other connections, its heartbeats, still get through.
#ifndef PSTRAIN_TESTS_TCP_RELAY_H_
#define PSTRAIN_TESTS_TCP_RELAY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace pstrain {

class TcpRelay {
 public:
  // Null when `host`:`port` cannot be bound (the error in *why).
  static std::unique_ptr<TcpRelay> Start(const std::string& host, int port, const std::string& target_host,
                                         int target_port, std::string* why) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr = Address(host, port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
      *why = "cannot listen on " + host + ":" + std::to_string(port) + ": " + strerror(errno);
      close(fd);
      return nullptr;
    }
    return std::unique_ptr<TcpRelay>(new TcpRelay(fd, Address(target_host, target_port)));
  }
  ~TcpRelay() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
    for (const Pair& p : pairs_) {
      close(p.a);
      close(p.b);
    }
  }
  void Freeze() { frozen_ = true; }

  // A free port on `host` (bound, then released: for a process the test
  // starts next).
  static int FreePort(const std::string& host) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Address(host, 0);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    close(fd);
    return port;
  }

 private:
  struct Pair {
    int a, b;  // the accepted connection, the one to the target
  };

  TcpRelay(int listen_fd, sockaddr_in target) : listen_fd_(listen_fd), target_(target) {
    thread_ = std::thread([this] { Loop(); });
  }

  static sockaddr_in Address(const std::string& host, int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    return addr;
  }

  // One thread, poll(): accepts, and copies whatever is readable on one
  // side of a pair to the other; a side that closes closes the pair.
  // Frozen: accepts (the kernel would anyway) but reads nothing.
  void Loop() {
    while (!stop_) {
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}};
      if (!frozen_) {
        for (const Pair& p : pairs_) {
          fds.push_back({p.a, POLLIN, 0});
          fds.push_back({p.b, POLLIN, 0});
        }
      }
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) Accept();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Pair& p = pairs_[(i - 1) / 2];
        const bool from_a = (i - 1) % 2 == 0;
        if (!Copy(from_a ? p.a : p.b, from_a ? p.b : p.a)) {
          close(p.a);
          close(p.b);
          p.a = p.b = -1;
        }
      }
      std::vector<Pair> open;
      for (const Pair& p : pairs_) {
        if (p.a >= 0) open.push_back(p);
      }
      pairs_.swap(open);
    }
  }

  void Accept() {
    const int a = accept(listen_fd_, nullptr, nullptr);
    if (a < 0) return;
    const int b = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(b, reinterpret_cast<const sockaddr*>(&target_), sizeof(target_)) != 0) {
      close(a);
      close(b);
      return;
    }
    pairs_.push_back({a, b});
  }

  static bool Copy(int from, int to) {
    if (from < 0 || to < 0) return false;
    char buf[1 << 16];
    const ssize_t n = read(from, buf, sizeof(buf));
    if (n <= 0) return false;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = send(to, buf + done, n - done, MSG_NOSIGNAL);
      if (w <= 0) return false;
      done += w;
    }
    return true;
  }

  const int listen_fd_;
  const sockaddr_in target_;
  std::atomic<bool> stop_{false}, frozen_{false};
  std::vector<Pair> pairs_;  // the relay thread's
  std::thread thread_;
};

}  // namespace pstrain

#endif  // PSTRAIN_TESTS_TCP_RELAY_H_
