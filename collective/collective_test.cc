// Collectives among 2 and 3 ranks (threads of this process, talking over
// real TCP sockets on 127.0.0.1) against reference results.
#include "collective/collective.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

// Runs fn(rank, collective) on `n` ranks at once.
void RunGroup(int n, const std::function<void(int, Collective&)>& fn, absl::Duration timeout = absl::Seconds(30)) {
  auto store = NewInMemoryStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CollectiveOptions o;
      o.rank = r;
      o.size = n;
      o.store = store;
      o.prefix = "test/";
      o.hostname = "127.0.0.1";
      o.timeout = timeout;
      auto c = CreateCollective(Collective::Backend::kGloo, o);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (auto& t : threads) t.join();
}

// Pseudo-random values that differ by rank (no global generator: ranks are
// threads).
at::Tensor Input(int rank, int64_t numel, at::ScalarType dtype) {
  at::Tensor i = at::arange(numel, at::kLong);
  at::Tensor v = i.mul(7919 + 104729 * rank).add(31 * rank).remainder(2001).sub(1000);
  if (at::isIntegralType(dtype, false)) return v.to(dtype);
  return v.to(dtype).div(37.0);
}

class CollectiveSizes : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveSizes, AllReduceBroadcastAllGatherEqualTheReference) {
  const int n = GetParam();
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kLong, at::kInt}) {
    for (int64_t numel : {1, 1000, 1 << 20}) {
      at::Tensor sum = at::zeros({numel}, at::TensorOptions(dtype));
      at::Tensor max = Input(0, numel, dtype);
      for (int r = 0; r < n; ++r) {
        sum += Input(r, numel, dtype);
        max = at::maximum(max, Input(r, numel, dtype));
      }
      RunGroup(n, [&](int rank, Collective& c) {
        at::Tensor t = Input(rank, numel, dtype);
        ASSERT_TRUE(c.AllReduce(t)->Wait().ok());
        if (at::isIntegralType(dtype, false)) {
          EXPECT_TRUE(at::equal(t, sum)) << c10::toString(dtype) << " " << numel;
        } else {
          EXPECT_TRUE(at::allclose(t, sum, 1e-5, 1e-5)) << c10::toString(dtype) << " " << numel;
        }
        at::Tensor m = Input(rank, numel, dtype);
        ASSERT_TRUE(c.AllReduce(m, ReduceOp::kMax)->Wait().ok());
        EXPECT_TRUE(at::equal(m, max));

        at::Tensor b = Input(rank, numel, dtype);
        ASSERT_TRUE(c.Broadcast(b, n - 1)->Wait().ok());
        EXPECT_TRUE(at::equal(b, Input(n - 1, numel, dtype)));

        std::vector<at::Tensor> outs;
        for (int r = 0; r < n; ++r) outs.push_back(at::zeros({numel}, at::TensorOptions(dtype)));
        ASSERT_TRUE(c.AllGather(outs, Input(rank, numel, dtype))->Wait().ok());
        for (int r = 0; r < n; ++r) EXPECT_TRUE(at::equal(outs[r], Input(r, numel, dtype))) << r;
        EXPECT_TRUE(c.Barrier()->Wait().ok());
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveSizes, ::testing::Values(2, 3));

TEST(Collective, ManyReductionsInFlightCompleteInOrder) {
  RunGroup(2, [](int rank, Collective& c) {
    std::vector<at::Tensor> ts;
    std::vector<std::unique_ptr<CollectiveWork>> works;
    for (int i = 0; i < 16; ++i) {
      ts.push_back(at::full({4096}, static_cast<double>(i + rank), at::kFloat));
      works.push_back(c.AllReduce(ts.back()));
    }
    for (int i = 0; i < 16; ++i) {
      ASSERT_TRUE(works[i]->Wait().ok());
      EXPECT_TRUE(at::equal(ts[i], at::full({4096}, static_cast<double>(2 * i + 1), at::kFloat))) << i;
    }
  });
}

// Tensors of 8 MiB and more go as concurrent parts; the result is the same.
TEST(Collective, LargeTensorsReducedInPartsEqualTheReference) {
  const int64_t numel = 1031 * 3053;  // 12 MiB of float32, not a multiple of the part count
  at::Tensor sum = Input(0, numel, at::kFloat).add(Input(1, numel, at::kFloat));
  RunGroup(2, [&](int rank, Collective& c) {
    at::Tensor t = Input(rank, numel, at::kFloat).view({1031, -1});  // not 1-D either
    ASSERT_TRUE(c.AllReduce(t)->Wait().ok());
    EXPECT_TRUE(at::allclose(t.view({-1}), sum, 1e-5, 1e-5));
  });
}

TEST(Collective, BadArgumentsAreRefused) {
  RunGroup(2, [](int rank, Collective& c) {
    // The caller's mistakes are INVALID_ARGUMENT (the job's fault, final);
    // a broken group is UNAVAILABLE (see below).
    std::vector<at::Tensor> wrong_count = {at::zeros({4})};
    absl::Status s = c.AllGather(wrong_count, at::zeros({4}))->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(c.AllReduce(at::zeros({4, 4}).t())->Wait().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.AllReduce(at::zeros({4}, at::kBool))->Wait().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(at::Tensor(), 0)->Wait().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(c.Barrier()->Wait().ok());  // the group still works
  });
  CollectiveOptions o;
  o.rank = 2;
  o.size = 2;
  o.store = NewInMemoryStore();
  EXPECT_EQ(CreateCollective(Collective::Backend::kGloo, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// A rank that goes away fails the others' pending operation quickly, with
// an error, instead of hanging.
TEST(Collective, APeerThatLeavesFailsTheOthersFast) {
  const absl::Duration timeout = absl::Seconds(5);
  RunGroup(
      2,
      [&](int rank, Collective& c) {
        ASSERT_TRUE(c.Barrier()->Wait().ok());
        if (rank == 1) return;  // leaves: its collective (and sockets) are destroyed
        absl::SleepFor(absl::Milliseconds(200));
        const absl::Time start = absl::Now();
        at::Tensor t = at::zeros({1 << 16});
        absl::Status s = c.AllReduce(t)->Wait();
        EXPECT_FALSE(s.ok());
        EXPECT_LE(absl::Now() - start, timeout + absl::Seconds(2));
        EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
        // Later operations on the broken group are the peer's loss too (a
        // job that may resume elsewhere), never the caller's mistake.
        for (int i = 0; i < 2; ++i) {
          s = c.AllReduce(t)->Wait();
          EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
        }
      },
      timeout);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// torchrun's rendezvous: rank 0 serves a TCPStore at MASTER_ADDR:MASTER_PORT.
TEST(Collective, TcpStoreRendezvous) {
  const int port = FreePort();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([r, port] {
      auto store = ConnectTcpStore("127.0.0.1", port, r == 0, 2, absl::Seconds(30));
      ASSERT_TRUE(store.ok()) << store.status();
      CollectiveOptions o;
      o.rank = r;
      o.size = 2;
      o.store = *store;
      o.hostname = "127.0.0.1";
      auto c = CreateCollective(Collective::Backend::kGloo, o);
      ASSERT_TRUE(c.ok()) << c.status();
      at::Tensor t = at::full({10}, r + 1.0);
      ASSERT_TRUE((*c)->AllReduce(t)->Wait().ok());
      EXPECT_TRUE(at::equal(t, at::full({10}, 3.0)));
    });
  }
  for (auto& t : threads) t.join();
}

// A build with CUDA and NCCL (here: @cuda found /usr/local/cuda) has the
// plugin among the test's runfiles; it must load without a GPU, or every
// GPU job would find "no NCCL backend". It once did not: a non-inline
// virtual in Collective left the plugin an undefined typeinfo.
TEST(Collective, ABuiltNcclPluginLoadsWithoutAGpu) {
  if (!std::filesystem::exists("collective/libpstrain_nccl.so")) {
    GTEST_SKIP() << "this build has no NCCL plugin (no CUDA toolkit with NCCL found)";
  }
  EXPECT_TRUE(NcclBuilt()) << CudaDeviceCount().status();
}

TEST(Collective, NcclNeedsAGpu) {
  auto devices = CudaDeviceCount();
  if (!NcclBuilt() || !devices.ok() || *devices < 1) {
    GTEST_SKIP() << "no CUDA device here (" << (NcclBuilt() ? devices.status().ToString() : "NCCL not built")
                 << "): the NCCL backend is compiled but not run";
  }
  // With a device: CPU tensors are refused with a clear error.
  CollectiveOptions o;
  o.store = NewInMemoryStore();
  auto c = CreateCollective(Collective::Backend::kNccl, o);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status s = (*c)->AllReduce(at::zeros({4}))->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace pstrain
