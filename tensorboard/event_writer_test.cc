// The event writer against RFC 3720's CRC-32C vectors and, for the files it
// writes, against an independent reader (read_events.py: Python, Debian's
// python3-crc32c, classes generated from the .proto).
#include "tensorboard/event_writer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tensorboard/crc32c.h"

namespace pstrain {
namespace {

bool ReaderAvailable() {
  return std::system("/usr/bin/python3 -c 'import crc32c, google.protobuf' 2>/dev/null") == 0;
}

// Runs the independent reader on `files`.
nlohmann::json ReadEvents(const std::vector<std::string>& files) {
  const std::string out = ::testing::TempDir() + "/read_events.json";
  std::string cmd = "/usr/bin/python3 tensorboard/read_events.py .";
  for (const auto& f : files) cmd += " '" + f + "'";
  cmd += " > '" + out + "'";
  const int rc = std::system(cmd.c_str());
  const std::string text = ReadFile(out).value_or("");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << text;
  EXPECT_EQ(rc, 0) << text;
  return j;
}

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(ascending.data(), ascending.size()), 0x46dd794eu);
}

TEST(EventWriterTest, RecordLayout) {
  const std::string r = EncodeRecord("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(static_cast<unsigned char>(r[0]), 3);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(r[i], 0);
  EXPECT_EQ(r.substr(12, 3), "abc");
  uint32_t crc = 0;
  for (int i = 0; i < 4; ++i) crc |= static_cast<uint32_t>(static_cast<unsigned char>(r[15 + i])) << (8 * i);
  EXPECT_EQ(crc, MaskCrc32c(Crc32c("abc", 3)));
}

TEST(EventWriterTest, TheIndependentReaderReadsWhatWasWritten) {
  if (!ReaderAvailable()) GTEST_SKIP() << "python3-crc32c or python3-protobuf is missing (make setup installs them)";
  const std::string dir = FreshDir("tb_roundtrip");
  std::string path;
  {
    EventWriter w({dir});
    for (int s = 1; s <= 50; ++s) w.AddScalar("train/loss", s, 1.0 / s, absl::FromUnixSeconds(1700000000 + s));
    w.AddText("job/spec", 0, "model: lenet\nepochs: 2");
    w.Flush();
    EXPECT_TRUE(w.status().ok()) << w.status();
    EXPECT_EQ(w.written(), 52u);
    EXPECT_EQ(w.dropped(), 0u);
    path = w.path();
  }
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos) << path;
  const nlohmann::json j = ReadEvents({path});
  const auto& events = j["files"][0]["events"];
  ASSERT_EQ(events.size(), 52u) << j.dump();
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  for (int s = 1; s <= 50; ++s) {
    EXPECT_EQ(events[s]["step"], s);
    EXPECT_FLOAT_EQ(events[s]["scalars"]["train/loss"].get<float>(), static_cast<float>(1.0 / s));
    EXPECT_DOUBLE_EQ(events[s]["wall_time"].get<double>(), 1700000000.0 + s);
  }
  EXPECT_EQ(events[51]["text"]["job/spec"], "model: lenet\nepochs: 2");
  EXPECT_EQ(j["files"][0]["partial_tail_bytes"], 0);
}

// A crash can stop the file anywhere: every prefix of it reads as the
// complete records it holds, no CRC error, the rest counted as a partial
// tail.
TEST(EventWriterTest, EveryPrefixOfAFileIsReadable) {
  if (!ReaderAvailable()) GTEST_SKIP() << "python3-crc32c or python3-protobuf is missing (make setup installs them)";
  const std::string dir = FreshDir("tb_prefix");
  std::string path;
  {
    EventWriter w({dir});
    for (int s = 1; s <= 6; ++s) w.AddScalar("x", s, s);
    w.AddText("t", 0, "hello");
    w.Close();
    path = w.path();
  }
  const std::string bytes = ReadFile(path).value();
  // Record boundaries, from the lengths in the file.
  std::vector<size_t> ends;
  for (size_t off = 0; off < bytes.size();) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[off + i])) << (8 * i);
    off += 12 + n + 4;
    ends.push_back(off);
  }
  ASSERT_EQ(ends.size(), 8u);
  ASSERT_EQ(ends.back(), bytes.size());
  std::vector<std::string> cuts;
  for (size_t len = 0; len <= bytes.size(); ++len) {
    cuts.push_back(absl::StrCat(dir, "/cut.", len));
    std::ofstream(cuts.back(), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(len));
  }
  const nlohmann::json j = ReadEvents(cuts);
  ASSERT_EQ(j["files"].size(), bytes.size() + 1);
  for (size_t len = 0; len <= bytes.size(); ++len) {
    size_t complete = 0;
    while (complete < ends.size() && ends[complete] <= len) ++complete;
    const auto& f = j["files"][len];
    EXPECT_EQ(f["records"], complete) << "cut at " << len;
    EXPECT_EQ(f["partial_tail_bytes"], len - (complete == 0 ? 0 : ends[complete - 1])) << "cut at " << len;
  }
}

TEST(EventWriterTest, AFullQueueDropsAndCounts) {
  const std::string dir = FreshDir("tb_full");
  EventWriterOptions o{dir};
  o.max_queued = 5;
  o.flush_interval = absl::Hours(1);  // nothing written until Flush
  EventWriter w(o);
  for (int s = 0; s < 100; ++s) w.AddScalar("x", s, s);
  EXPECT_EQ(w.dropped(), 95u);
  w.Flush();
  EXPECT_EQ(w.written(), 6u);  // the file version and the five queued
  w.AddScalar("x", 100, 1);
  w.Flush();
  EXPECT_EQ(w.written(), 7u);
}

TEST(EventWriterTest, WritesWithinTheFlushIntervalWithoutBeingAsked) {
  const std::string dir = FreshDir("tb_interval");
  EventWriterOptions o{dir};
  o.flush_interval = absl::Milliseconds(100);
  EventWriter w(o);
  w.AddScalar("x", 1, 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w.written() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(w.written(), 2u);
}

TEST(EventWriterTest, AnUnwritableDirectoryFailsWithoutBlocking) {
  const std::string base = FreshDir("tb_bad");
  std::filesystem::create_directories(base);
  std::ofstream(base + "/file") << "x";
  EventWriter w({base + "/file/sub"});
  w.Flush();
  w.AddScalar("x", 1, 1);
  EXPECT_FALSE(w.status().ok());
  EXPECT_NE(std::string(w.status().message()).find(base + "/file/sub"), std::string::npos) << w.status();
  EXPECT_EQ(w.dropped(), 1u);
  EXPECT_EQ(w.path(), "");
}

}  // namespace
}  // namespace pstrain
