// LimitProtobufLogs: what protobuf logs per parse of a hostile message (a
// string field that is not UTF-8, which any client can send) is bounded,
// goes to the binaries' log, and says how much was dropped.
#include "common/binary_setup.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "proto/parameter.pb.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace pstrain {
namespace {

// A PullRequest whose `job` (field 1) holds bytes that are not UTF-8.
bool ParseHostile() {
  PullRequest r;
  return r.ParseFromString(std::string("\x0a\x02\xff\xfe", 4));
}

class ProtobufLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  void TearDown() override { spdlog::set_default_logger(previous_); }
  std::vector<std::string> Lines() const {
    std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n', absl::SkipEmpty());
    return lines;
  }

  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_F(ProtobufLogTest, AFloodOfHostileParsesLogsABurstThenSaysHowManyWereDropped) {
  LimitProtobufLogs(/*burst=*/3, absl::Seconds(1));
  for (int i = 0; i < 500; ++i) ASSERT_FALSE(ParseHostile());
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 3u) << out_.str();
  for (const std::string& l : lines) {
    EXPECT_TRUE(absl::StrContains(l, "[warning] protobuf: ")) << l;
    EXPECT_TRUE(absl::StrContains(l, "pstrain.PullRequest.job")) << l;
  }
  EXPECT_FALSE(absl::StrContains(lines[2], "dropped"));
  // The next window: the first message says how many the last one dropped.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_FALSE(ParseHostile());
  lines = Lines();
  ASSERT_EQ(lines.size(), 4u) << out_.str();
  EXPECT_TRUE(absl::StrContains(lines[3], "and 497 more such messages dropped")) << lines[3];
  // Nothing dropped since: plain again.
  ASSERT_FALSE(ParseHostile());
  lines = Lines();
  ASSERT_EQ(lines.size(), 5u) << out_.str();
  EXPECT_FALSE(absl::StrContains(lines[4], "dropped")) << lines[4];
}

TEST_F(ProtobufLogTest, ManyThreadsAtOnceStayWithinTheBurst) {
  LimitProtobufLogs(/*burst=*/5, absl::Minutes(10));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) (void)ParseHostile();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(Lines().size(), 5u) << out_.str();
}

}  // namespace
}  // namespace pstrain
