// A shard whose data port is cut off while the process lives on and keeps
// heartbeating (issue 34, docs/replication.md "A shard that hangs"): its
// lease never runs out, so only the coordinator's probes of its data path
// can tell. shard-2 is reached through a relay (tests/tcp_relay.h) on
// 127.0.0.2 that the test freezes mid-run; the coordinator probes with a
// 1 s timeout. The SYNC job with `replicas: 1` goes on without a restart
// and ends with the very parameters of the same job run without
// interruption; the quarantined shard is asked to exit and does (75,
// EX_TEMPFAIL, for its supervisor to start it afresh).
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/replication_testing.h"
#include "tests/tcp_relay.h"

namespace pstrain {
namespace {

class UnresponsiveShardTest : public ReplicationTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("unresponsive");
    missed_heartbeats_ = 5;  // a lease of 0.5 s
    coordinator_flags_ = {"--shard_probe_timeout_ms=1000"};
    StartCoordinator(0);
    StartPool(1, 2);                     // shard-0, worker-0, worker-1
    StartPool(1, 0, /*first_shard=*/1);  // shard-1
    // shard-2 listens on 127.0.0.1:P and is reached at 127.0.0.2:P, the
    // relay's address, which it advertises.
    const int port = TcpRelay::FreePort("127.0.0.1");
    ASSERT_GT(port, 0);
    std::string why;
    relay_ = TcpRelay::Start("127.0.0.2", port, "127.0.0.1", port, &why);
    ASSERT_NE(relay_, nullptr) << why;
    pool_.push_back(Start("shard-2", {"server/ps/pstrain-ps", "--host=127.0.0.1", "--port=" + std::to_string(port),
                                      "--advertise_host=127.0.0.2", "--coordinator=" + coordinator_,
                                      "--name=shard-2", "--checkpoint_root=" + dir_}));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Cli({"cluster"}).out.find("127.0.0.2:" + std::to_string(port)) == std::string::npos) {
      ASSERT_LT(absl::Now(), deadline) << Cli({"cluster"}).out << Logs();
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  static constexpr size_t kRelayedShard = 4;  // pool_'s order
  std::unique_ptr<TcpRelay> relay_;
};

TEST_F(UnresponsiveShardTest, AShardCutOffFromItsClientsIsLostThoughItHeartbeats) {
  const std::string yaml = ReplicatedYaml("sync", "sync", 1200);
  const NamedTensors uninterrupted = Uninterrupted(yaml);
  ASSERT_FALSE(uninterrupted.empty());

  const std::string job = Submit(WriteSpec("cut", yaml));
  WaitForStep(job, 100);
  const int64_t before = Step(job);
  relay_->Freeze();
  // Its heartbeats go on: the lease (0.5 s) never runs out. The probes'
  // timeout (1 s) declares it lost; the workers then cancel their calls to
  // it and go to the new primaries.
  const double seconds = SecondsUntilPast(job, before);
  std::printf("sync, a shard's port cut off: 5 more steps %.2f s later (probe timeout 1 s, lease 0.5 s)\n",
              seconds);
  EXPECT_LT(seconds, 20) << JsonStatus(job) << Logs();
  ASSERT_TRUE(AwaitReason(job, "ShardLost", absl::Seconds(30))) << JsonStatus(job) << Logs();
  EXPECT_NE(JsonStatus(job).find("answered no probe for"), std::string::npos) << JsonStatus(job);
  // Quarantined (until it is forgotten, 20 leases after its last beat).
  auto metrics_addr = WaitForAddressFile(dir_ + "/metrics.addr", absl::Seconds(10));
  ASSERT_TRUE(metrics_addr.ok()) << metrics_addr.status();
  const std::string metrics = Scrape(*metrics_addr);
  EXPECT_NE(metrics.find("pstrain_member_quarantined{role=\"shard\",name=\"shard-2\"} 1"), std::string::npos)
      << metrics;
  // Asked to exit by its next heartbeat, it does.
  EXPECT_EQ(pool_[kRelayedShard]->Wait(absl::Seconds(30)), 75) << Logs();
  ExpectSucceededWithoutARestart(job);
  ExpectAllClose(uninterrupted, job);
}

}  // namespace
}  // namespace pstrain
