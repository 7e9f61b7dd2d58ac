// RemoteShardCache: bounded (idle clients evicted after a time, a cap with
// least-recently-used eviction) and never destroying a client in use (held
// by a caller, or with a call whose done callback has not returned). A fake
// clock; no server: the targets refuse connections, which is all a client
// needs to exist and to finish a call. And GrpcRemoteShard::CancelCalls
// against a shard that hangs.
#include "rpc/grpc_remote_shard.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace pstrain {
namespace {

class RemoteShardCacheTest : public ::testing::Test {
 protected:
  RemoteShardCacheOptions Options(size_t max_clients) {
    RemoteShardCacheOptions o;
    o.idle_timeout = absl::Minutes(10);
    o.max_clients = max_clients;
    o.now = [this] {
      absl::MutexLock l(&mu_);
      return now_;
    };
    return o;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }
  static RemoteShardOptions Target(int i) {
    RemoteShardOptions o;
    o.target = absl::StrCat("127.0.0.1:", i);  // nothing listens on ports 1..: refused
    o.max_attempts = 1;
    o.default_timeout = absl::Seconds(20);
    return o;
  }

  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000000);
};

TEST_F(RemoteShardCacheTest, ManyTargetsStayBoundedDroppingTheLeastRecentlyUsed) {
  RemoteShardCache cache(Options(4));
  std::vector<std::weak_ptr<GrpcRemoteShard>> seen;
  for (int i = 1; i <= 40; ++i) {
    seen.push_back(cache.Get(Target(i)));  // dropped at once: idle
    Advance(absl::Seconds(1));
    EXPECT_LE(cache.size(), 4u);
  }
  // The last four are kept; the rest were destroyed.
  for (int i = 0; i < 36; ++i) EXPECT_TRUE(seen[i].expired()) << i;
  for (int i = 36; i < 40; ++i) EXPECT_FALSE(seen[i].expired()) << i;
  // The same key is the same client.
  EXPECT_EQ(cache.Get(Target(40)).get(), seen[39].lock().get());
}

TEST_F(RemoteShardCacheTest, AnIdleClientIsEvictedAfterTheIdleTime) {
  RemoteShardCache cache(Options(256));
  std::weak_ptr<GrpcRemoteShard> a = cache.Get(Target(1));
  Advance(absl::Minutes(9));
  cache.Get(Target(2));
  EXPECT_FALSE(a.expired());
  Advance(absl::Minutes(2));  // 11 minutes since 1 was used
  std::weak_ptr<GrpcRemoteShard> b = cache.Get(Target(3));
  EXPECT_TRUE(a.expired());
  EXPECT_EQ(cache.size(), 2u);  // 2 (used 2 minutes ago) and 3
  EXPECT_FALSE(b.expired());
}

TEST_F(RemoteShardCacheTest, AClientHeldByACallerIsNotEvicted) {
  RemoteShardCache cache(Options(1));
  std::shared_ptr<GrpcRemoteShard> held = cache.Get(Target(1));
  Advance(absl::Hours(1));
  std::weak_ptr<GrpcRemoteShard> other = cache.Get(Target(2));  // over the cap: all others in use
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Get(Target(1)), held);
}

TEST_F(RemoteShardCacheTest, AClientWithACallInFlightIsNotEvicted) {
  RemoteShardCache cache(Options(1));
  absl::Notification entered, release;
  std::weak_ptr<GrpcRemoteShard> busy;
  {
    std::shared_ptr<GrpcRemoteShard> client = cache.Get(Target(1));
    busy = client;
    StatsRequest req;
    auto resp = std::make_shared<StatsResponse>();
    // The done callback holds the call in flight until the test lets go.
    client->StatsAsync(req, resp.get(), CallOptions{}, [&, resp](absl::Status) {
      entered.Notify();
      release.WaitForNotification();
    });
  }  // the caller lets go of the client; the call has not finished
  auto in_flight = [&] {
    std::shared_ptr<GrpcRemoteShard> c = busy.lock();
    return c == nullptr ? -1 : c->in_flight();
  };
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(in_flight(), 1);
  Advance(absl::Hours(1));
  cache.Get(Target(2));  // idle time past, over the cap: still not evicted
  EXPECT_FALSE(busy.expired());
  EXPECT_EQ(cache.size(), 2u);

  release.Notify();
  // Counted out just after the callback returns (on gRPC's thread).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (in_flight() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(in_flight(), 0);
  Advance(absl::Hours(1));
  cache.Get(Target(3));
  EXPECT_TRUE(busy.expired());
  EXPECT_EQ(cache.size(), 1u);
}

// A shard that hangs (here a port whose connections the kernel takes and
// nobody answers: a stopped process's) holds a call until its deadline.
// CancelCalls (the shard was declared lost) ends it at once with CANCELLED;
// a call started after it runs as usual.
TEST(GrpcRemoteShardTest, CancelCallsEndsTheCallsToAHungShardAtOnce) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);  // never accepted
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  RemoteShardOptions o;
  o.target = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  o.max_attempts = 1;
  o.default_timeout = absl::Seconds(60);
  {
    GrpcRemoteShard client(o);
    StatsRequest req;
    StatsResponse resp, later_resp;
    absl::Notification done, later_done;
    absl::Status got, later;
    client.StatsAsync(req, &resp, CallOptions{}, [&](absl::Status s) {
      got = s;
      done.Notify();
    });
    EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(500))) << got;  // hung
    const absl::Time cancelled = absl::Now();
    client.CancelCalls();
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(got.code(), absl::StatusCode::kCancelled) << got;
    EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
    CallOptions soon;
    soon.deadline = absl::Now() + absl::Milliseconds(300);
    client.StatsAsync(req, &later_resp, soon, [&](absl::Status s) {
      later = s;
      later_done.Notify();
    });
    ASSERT_TRUE(later_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_NE(later.code(), absl::StatusCode::kCancelled) << later;
    EXPECT_NE(later.code(), absl::StatusCode::kOk) << later;
  }
  close(fd);
}

}  // namespace
}  // namespace pstrain
