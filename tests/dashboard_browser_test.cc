// The dashboard in a real browser: Debian's Chromium, headless, loads the
// pages of a job that `pstrain local` is training and runs their script
// (the DOM is dumped after it has fetched and drawn). Checked: the job
// list links the job; the job page draws its curves and they gain points
// while it trains; each rank has a row saying what it is doing; an unknown
// job is a 404 page; a screenshot lands in the test's outputs
// (TEST_UNDECLARED_OUTPUTS_DIR/dashboard.png: docs/operations.md's).
#include <civetweb.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/child_process.h"

namespace pstrain {
namespace {

constexpr char kChromium[] = "/usr/bin/chromium";

// Why Chromium cannot be used here, or "" when it can.
std::string ChromiumProblem(const std::string& dir) {
  if (!std::filesystem::exists(kChromium)) return "chromium is not installed (make setup installs it)";
  const std::string cmd = absl::StrCat(kChromium, " --headless --no-sandbox --disable-gpu --dump-dom about:blank > ",
                                       dir, "/probe.html 2> ", dir, "/probe.err");
  if (std::system(cmd.c_str()) != 0) {
    return "chromium does not start headless here: " + ReadFile(dir + "/probe.err").value_or("").substr(0, 300);
  }
  return "";
}

// The DOM after the page's script ran for a while (virtual time: the
// fetches complete before the dump).
std::string Dom(const std::string& url, const std::string& dir) {
  const std::string out = dir + "/dom.html";
  const std::string cmd = absl::StrCat(kChromium,
                                       " --headless --no-sandbox --disable-gpu --virtual-time-budget=4000"
                                       " --dump-dom '",
                                       url, "' > ", out, " 2>/dev/null");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << url;
  return ReadFile(out).value_or("");
}

int Points(const std::string& dom, const std::string& series) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex("data-series=\"" + series + "\" data-points=\"(\\d+)\""))) return -1;
  return std::stoi(m[1]);
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

TEST(DashboardBrowserTest, ChromiumSeesTheCurvesOfARunningJobGrow) {
  const std::string dir = MakeTempDir("dashboard-browser");
  const std::string problem = ChromiumProblem(dir);
  if (!problem.empty()) GTEST_SKIP() << problem;
  // Many short epochs, so evaluations come often; the job runs until the
  // test cancels it. Fashion-MNIST where it is installed (the screenshot
  // then shows a real run), else synthetic data.
  const bool fashion = std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  const std::string spec = dir + "/job.yaml";
  ASSERT_TRUE(WriteFileAtomically(spec, std::string(R"(name: fashion-mnist-lenet
model: lenet
)") + (fashion ? "data: {format: idx, limit_train: 4096, limit_test: 1000}\n"
               : "data: {format: synthetic, synthetic_train: 4096, synthetic_test: 256}\n") +
                                            R"(
optimizer: {kind: sgd, lr: 0.02, momentum: 0.9}
consistency: async
workers: 2
shards: 1
epochs: 1000
batch_size: 32
log_every_steps: 5
threads_per_worker: 1
)").ok());
  auto run = ChildProcess::Start(
      {"client/pstrain", "local", spec, "--output_dir", dir + "/out", "--data_root", "/usr/share/datasets"},
      dir + "/local.out");
  ASSERT_TRUE(run.ok()) << run.status();
  auto address = WaitForAddressFile(dir + "/out/logs/dashboard.addr", absl::Seconds(60));
  ASSERT_TRUE(address.ok()) << address.status() << ReadFile(dir + "/local.out").value_or("");
  const std::string base = "http://" + *address;
  const std::string job_url = base + "/jobs/job-000001";

  // Until the job reports progress.
  std::string first;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline) {
    first = Dom(job_url, dir);
    if (Points(first, "loss") >= 2 && Count(first, "class=\"rank") == 2) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_GE(Points(first, "loss"), 2) << first.substr(0, 3000) << ReadFile(dir + "/local.out").value_or("");
  EXPECT_NE(first.find("fashion-mnist-lenet"), std::string::npos);
  EXPECT_EQ(Count(first, "class=\"rank"), 2) << first;
  // Each rank says what it is doing (or had no heartbeat with it yet).
  EXPECT_TRUE(std::regex_search(first, std::regex("class=\"doing\">(computing|waiting|starting|evaluating|-)")))
      << first;
  EXPECT_NE(first.find("class=\"shard\""), std::string::npos);
  EXPECT_NE(first.find("Scheduled"), std::string::npos);  // a condition

  absl::SleepFor(absl::Seconds(3));
  const std::string later = Dom(job_url, dir);
  EXPECT_GT(Points(later, "loss"), Points(first, "loss")) << later.substr(0, 3000);
  EXPECT_GT(Points(later, "samples_per_s"), 0);
  EXPECT_GE(Points(later, "accuracy"), 1) << "an evaluation per epoch of 64 steps";

  const std::string list = Dom(base + "/", dir);
  EXPECT_NE(list.find("data-job=\"job-000001\""), std::string::npos) << list;
  EXPECT_NE(list.find("href=\"/jobs/job-000001\""), std::string::npos) << list;

  const std::string missing = Dom(base + "/jobs/job-424242", dir);
  EXPECT_NE(missing.find("id=\"not-found\""), std::string::npos) << missing;

  // The screenshot, for docs/operations.md (and for a person reading a failure).
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string shot = std::string(outputs != nullptr ? outputs : dir.c_str()) + "/dashboard.png";
  const std::string cmd = absl::StrCat(kChromium,
                                       " --headless --no-sandbox --disable-gpu --hide-scrollbars"
                                       " --window-size=1280,1100 --virtual-time-budget=4000 --screenshot=",
                                       shot, " '", job_url, "' > /dev/null 2>&1");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_GT(std::filesystem::file_size(shot), 20000u) << shot;

  // The page's Cancel does this (a browser's confirm() aside; a browser
  // always names the host, which the dashboard checks).
  char err[256] = {};
  mg_connection* c = mg_download("127.0.0.1", std::stoi(address->substr(address->rfind(':') + 1)), 0, err,
                                 sizeof(err), "%s",
                                 ("POST /api/jobs/job-000001/cancel HTTP/1.0\r\nHost: " + *address +
                                  "\r\nX-Pstrain-Request: 1\r\n\r\n")
                                     .c_str());
  ASSERT_NE(c, nullptr) << err;
  EXPECT_EQ(mg_get_response_info(c)->status_code, 200);
  mg_close_connection(c);
  EXPECT_EQ((*run)->Wait(absl::Seconds(30)), 1) << "a cancelled job: exit 1\n" << ReadFile(dir + "/local.out").value_or("");
}

}  // namespace
}  // namespace pstrain
