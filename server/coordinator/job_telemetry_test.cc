// The coordinator's event files, read back by the independent reader
// (tensorboard/read_events.py), and the dashboard's curves.
#include "server/coordinator/job_telemetry.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_util.h"

namespace pstrain {
namespace {

std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

nlohmann::json ReadEvents(const std::string& file) {
  const std::string out = ::testing::TempDir() + "/telemetry_events.json";
  const std::string cmd = "/usr/bin/python3 tensorboard/read_events.py . '" + file + "' > '" + out + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return nlohmann::json::parse(ReadFile(out).value_or("{}"));
}

// Options for the tests of the dashboard's curves alone: no event files.
TelemetryOptions CurvesOnly() {
  TelemetryOptions o;
  o.tensorboard = false;
  return o;
}

WorkerEvent::Progress Progress(int64_t step, double loss, double lr) {
  WorkerEvent::Progress p;
  p.set_step(step);
  p.set_loss(loss);
  p.set_samples_per_s(100);
  p.set_lr(lr);
  p.set_step_time_s(0.01);
  p.set_exchange_wait_s(0.002);
  p.set_data_wait_s(0.001);
  ShardCalls* c = p.add_shards();
  c->set_shard(1);
  c->set_calls(10);
  c->set_mean_ms(1.5);
  c->set_bytes_per_s(1e6);
  ShardCalls* bad = p.add_shards();  // a shard the job does not have
  bad->set_shard(77);
  bad->set_mean_ms(9);
  return p;
}

TEST(JobTelemetryTest, OneRunPerAttemptWithTheRanksTheJobAndTheShards) {
  if (std::system("/usr/bin/python3 -c 'import crc32c, google.protobuf' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-crc32c or python3-protobuf is missing (make setup installs them)";
  }
  const std::string dir = ::testing::TempDir() + "/telemetry_job";
  std::filesystem::remove_all(dir);
  JobStatus st;
  st.set_num_shards(2);
  {
    JobTelemetry t(TelemetryOptions{});
    t.StartAttempt("job-1", 1, dir, "model: lenet\nepochs: 2\n");
    st.set_loss(0.5);
    st.set_samples_per_s(200);
    t.Progress("job-1", 1, Progress(10, 0.6, 0.1), st);
    WorkerEvent::Progress fp16 = Progress(10, 0.4, 0.1);
    fp16.set_loss_scale(32768);
    fp16.set_skipped_steps(3);
    t.Progress("job-1", 0, fp16, st);
    WorkerEvent::Eval e;
    e.set_accuracy(0.75);
    e.set_test_loss(0.7);
    t.Eval("job-1", e, 10);
    e.set_auc(0.8125);  // a click model's evaluation
    e.set_log_loss(0.4375);
    t.Eval("job-1", e, 11);
    t.EndAttempt("job-1");
    t.StartAttempt("job-1", 2, dir, "model: lenet\n");
    t.Progress("job-1", 0, Progress(20, 0.3, 0.05), st);
    t.EndAttempt("job-1");
    const JobCurves c = t.Curves("job-1");
    ASSERT_EQ(c.loss.size(), 2u);  // rank 0's reports, both attempts
    EXPECT_EQ(c.loss[1].step, 20);
    EXPECT_DOUBLE_EQ(c.loss[0].value, 0.5);
    ASSERT_EQ(c.accuracy.size(), 2u);
    EXPECT_DOUBLE_EQ(c.accuracy[0].value, 0.75);
    ASSERT_EQ(c.auc.size(), 1u);  // the first evaluation had none
    EXPECT_EQ(c.auc[0].step, 11);
    EXPECT_DOUBLE_EQ(c.auc[0].value, 0.8125);
    EXPECT_TRUE(t.Curves("job-2").loss.empty());
  }  // the writers finish
  const auto first = EventFiles(dir + "/tensorboard/attempt-1");
  const auto second = EventFiles(dir + "/tensorboard/attempt-2");
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  const nlohmann::json j = ReadEvents(first[0]);
  std::map<std::string, double> scalars;
  std::string spec;
  for (const auto& e : j["files"][0]["events"]) {
    if (e.contains("scalars")) {
      for (auto& [tag, v] : e["scalars"].items()) scalars[tag] = v.get<double>();
    }
    if (e.contains("text")) spec = e["text"]["job/spec"];
  }
  EXPECT_EQ(spec, "    model: lenet\n    epochs: 2\n    ");
  EXPECT_FLOAT_EQ(scalars["rank_1/loss"], 0.6f);
  EXPECT_FLOAT_EQ(scalars["rank_0/loss"], 0.4f);
  EXPECT_FLOAT_EQ(scalars["train/loss"], 0.5f);  // the job's mean, from the status
  EXPECT_FLOAT_EQ(scalars["train/samples_per_s"], 200);
  EXPECT_FLOAT_EQ(scalars["train/learning_rate"], 0.1f);
  EXPECT_FLOAT_EQ(scalars["train/step_time_ms"], 10);
  EXPECT_FLOAT_EQ(scalars["train/exchange_wait_ms"], 2);
  EXPECT_FLOAT_EQ(scalars["shard_1/call_ms"], 1.5f);
  EXPECT_FLOAT_EQ(scalars["shard_1/bytes_per_s"], 1e6f);
  EXPECT_FLOAT_EQ(scalars["eval/accuracy"], 0.75f);
  EXPECT_FLOAT_EQ(scalars["eval/auc"], 0.8125f);
  EXPECT_FLOAT_EQ(scalars["eval/log_loss"], 0.4375f);
  EXPECT_EQ(scalars.count("shard_77/call_ms"), 0u);
  EXPECT_EQ(scalars.count("train/grad_norm"), 0u);  // not computed, not written
  EXPECT_EQ(scalars.count("rank_1/samples_per_s"), 1u);
  EXPECT_FLOAT_EQ(scalars["train/loss_scale"], 32768);  // fp16 (rank 0)
  EXPECT_FLOAT_EQ(scalars["train/skipped_steps"], 3);
  EXPECT_FLOAT_EQ(scalars["rank_0/skipped_steps"], 3);
  EXPECT_EQ(scalars.count("rank_1/loss_scale"), 0u);  // not fp16: not written
}

// A member's report with far more shard entries than the job has shards:
// only the first num_shards are looked at.
TEST(JobTelemetryTest, AFloodOfShardEntriesIsCut) {
  JobTelemetry t(CurvesOnly());
  JobStatus st;
  st.set_num_shards(2);
  WorkerEvent::Progress p = Progress(1, 0, 0);
  p.clear_shards();
  for (int i = 0; i < 100000; ++i) {
    ShardCalls* c = p.add_shards();
    c->set_shard(i < 2 ? i : 1);
    c->set_mean_ms(i);
  }
  t.Progress("j", 0, p, st);
  const JobCurves c = t.Curves("j");
  ASSERT_EQ(c.shards.size(), 2u);
  EXPECT_EQ(c.shards.at(1).mean_ms(), 1);  // the first entries, not the flood's last
}

TEST(JobTelemetryTest, CurvesAreThinnedNotCut) {
  TelemetryOptions o = CurvesOnly();
  o.max_points = 100;
  JobTelemetry t(o);
  JobStatus st;
  for (int s = 1; s <= 1000; ++s) {
    st.set_loss(1.0 / s);
    t.Progress("j", 0, Progress(s, 0, 0), st);
  }
  const JobCurves c = t.Curves("j");
  EXPECT_LE(c.loss.size(), 100u);
  EXPECT_GE(c.loss.size(), 50u);
  EXPECT_EQ(c.loss.front().step, 1);
  EXPECT_EQ(c.loss.back().step, 1000);
  for (size_t i = 1; i < c.loss.size(); ++i) EXPECT_LT(c.loss[i - 1].step, c.loss[i].step);
}

// The dashboard's ETA: rank 0's steps per second over its last minute.
TEST(JobTelemetryTest, PaceIsOverTheLastMinute) {
  JobTelemetry t(CurvesOnly());
  JobStatus st;
  EXPECT_FALSE(t.RecentPace("j").has_value());
  t.Progress("j", 0, Progress(10, 0, 0), st);
  EXPECT_FALSE(t.RecentPace("j").has_value());  // one report: no pace yet
  absl::SleepFor(absl::Milliseconds(200));
  t.Progress("j", 1, Progress(30, 0, 0), st);  // not rank 0: not counted
  t.Progress("j", 0, Progress(50, 0, 0), st);
  auto pace = t.RecentPace("j");
  ASSERT_TRUE(pace.has_value());
  EXPECT_EQ(pace->step, 50);
  EXPECT_GT(pace->steps_per_s, 40 / 1.0);   // 40 steps in a little over 0.2 s
  EXPECT_LT(pace->steps_per_s, 40 / 0.19);
}

TEST(JobTelemetryTest, OnlyTheNewestJobsAreKept) {
  TelemetryOptions o = CurvesOnly();
  o.max_jobs = 3;
  JobTelemetry t(o);
  JobStatus st;
  for (int j = 0; j < 10; ++j) t.Progress("job-" + std::to_string(j), 0, Progress(1, 0, 0), st);
  EXPECT_TRUE(t.Curves("job-0").loss.empty());
  EXPECT_FALSE(t.Curves("job-9").loss.empty());
  EXPECT_FALSE(t.Curves("job-7").loss.empty());
}

}  // namespace
}  // namespace pstrain
