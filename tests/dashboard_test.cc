// The coordinator's web dashboard over real HTTP (civetweb's own client):
// pages, the JSON API, actions, and its guards -- tokens, loopback only when
// secured, users seeing only their jobs, the header a cross-site form cannot
// send, hostile paths.
#include "server/coordinator/dashboard.h"

#include <civetweb.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "rpc/local_credentials.h"
#include "rpc/token_table.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/job_store.h"

namespace pstrain {
namespace {

constexpr char kSpec[] = R"(name: dash
model: lenet
data: {format: synthetic, synthetic_train: 64, synthetic_test: 16}
workers: 1
shards: 1
epochs: 1
batch_size: 16
)";

struct Response {
  int code = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// One request to 127.0.0.1:port with `Host: <host>` (none if empty);
// `extra` are whole header lines ("Name: value\r\n").
Response FetchAs(const std::string& host, int port, const std::string& method, const std::string& path,
                 const std::string& extra = "") {
  char err[256] = {};
  const std::string host_line = host.empty() ? "" : "Host: " + host + "\r\n";
  mg_connection* conn = mg_download("127.0.0.1", port, 0, err, sizeof(err), "%s %s HTTP/1.0\r\n%s%s\r\n",
                                    method.c_str(), path.c_str(), host_line.c_str(), extra.c_str());
  Response r;
  if (conn == nullptr) {
    ADD_FAILURE() << method << " " << path << ": " << err;
    return r;
  }
  const mg_response_info* info = mg_get_response_info(conn);
  r.code = info->status_code;
  for (int i = 0; i < info->num_headers; ++i) {
    r.headers[absl::AsciiStrToLower(info->http_headers[i].name)] = info->http_headers[i].value;
  }
  char buf[8192];
  for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) r.body.append(buf, n);
  mg_close_connection(conn);
  return r;
}

// As a browser that opened http://127.0.0.1:port/.
Response Fetch(int port, const std::string& method, const std::string& path, const std::string& extra = "") {
  return FetchAs(absl::StrCat("127.0.0.1:", port), port, method, path, extra);
}

class DashboardTest : public ::testing::Test {
 protected:
  void StartCoordinator() {
    dir_ = ::testing::TempDir() + "/dashboard";
    CoordinatorOptions co;
    co.background_tick = false;
    auto root = CanonicalRoot(dir_ + "/root");
    ASSERT_TRUE(root.ok()) << root.status();
    co.checkpoint_root = *root;
    co.telemetry.tensorboard = false;
    auto store = JobStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status();
    auto c = Coordinator::Create(co, std::move(*store));
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
  }

  std::string Submit(const Caller& caller = Caller{}) {
    SubmitJobRequest req;
    req.set_spec_yaml(kSpec);
    req.set_output_dir(dir_ + "/root/out");
    auto id = coordinator_->SubmitJob(req, caller);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  void TearDown() override {
    dashboard_.reset();
    if (coordinator_) coordinator_->Shutdown();
  }

  std::string dir_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Dashboard> dashboard_;
};

TEST_F(DashboardTest, PagesAssetsAndTheJsonApi) {
  StartCoordinator();
  auto d = Dashboard::Start(coordinator_.get(), DashboardOptions{});
  ASSERT_TRUE(d.ok()) << d.status();
  dashboard_ = std::move(*d);
  const int port = dashboard_->port();
  EXPECT_EQ(dashboard_->url(), absl::StrCat("http://127.0.0.1:", port, "/"));

  Response index = Fetch(port, "GET", "/");
  EXPECT_EQ(index.code, 200);
  EXPECT_NE(index.body.find("/static/app.js"), std::string::npos);
  EXPECT_NE(index.headers["content-security-policy"].find("default-src 'self'"), std::string::npos);
  EXPECT_EQ(index.headers["x-frame-options"], "DENY");
  // Every asset from the binary: nothing the page loads is from elsewhere.
  for (const char* asset : {"/static/app.js", "/static/app.css"}) {
    Response a = Fetch(port, "GET", asset);
    EXPECT_EQ(a.code, 200) << asset;
    EXPECT_GT(a.body.size(), 1000u) << asset;
    // (The SVG namespace is a name, not a location.)
    const std::string body = absl::StrReplaceAll(a.body, {{"http://www.w3.org/2000/svg", ""}});
    EXPECT_EQ(body.find("http://"), std::string::npos) << asset;
    EXPECT_EQ(body.find("https://"), std::string::npos) << asset;
    EXPECT_EQ(body.find("url("), std::string::npos) << asset;
  }

  const std::string job = Submit();
  Response list = Fetch(port, "GET", "/api/jobs");
  ASSERT_EQ(list.code, 200) << list.body;
  ASSERT_EQ(list.json()["jobs"].size(), 1u);
  EXPECT_EQ(list.json()["jobs"][0]["job_id"], job);
  EXPECT_EQ(list.json()["jobs"][0]["state"], "PENDING");

  Response page = Fetch(port, "GET", "/jobs/" + job);
  EXPECT_EQ(page.code, 200);
  Response detail = Fetch(port, "GET", "/api/jobs/" + job);
  ASSERT_EQ(detail.code, 200) << detail.body;
  const nlohmann::json j = detail.json();
  EXPECT_EQ(j["name"], "dash");
  EXPECT_TRUE(j["curves"]["loss"].is_array());
  EXPECT_TRUE(j["ranks"].is_array());
  EXPECT_EQ(j["conditions"][0]["reason"], "Submitted");
  EXPECT_EQ(detail.body.find("job_secret"), std::string::npos);
  EXPECT_EQ(detail.body.find("member_id"), std::string::npos);

  // Unknown jobs and paths: 404s, as a page or as JSON.
  Response missing = Fetch(port, "GET", "/jobs/job-999999");
  EXPECT_EQ(missing.code, 404);
  EXPECT_NE(missing.body.find("not-found"), std::string::npos);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs/job-999999").code, 404);
  EXPECT_EQ(Fetch(port, "GET", "/nothing/here").code, 404);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs/" + job + "/a/b").code, 404);
  EXPECT_EQ(Fetch(port, "GET", "/jobs/" + std::string(5000, 'x')).code, 404);
  EXPECT_EQ(Fetch(port, "GET", "/jobs/..%2f..%2fetc%2fpasswd").code, 404);
  EXPECT_EQ(Fetch(port, "GET", "/jobs/%3Cscript%3E").code, 404);
  // A request line beyond the bound is refused, and the server goes on.
  Fetch(port, "GET", "/" + std::string(40000, 'a'));
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs").code, 200);

  // Actions: POST with the marker header only.
  EXPECT_EQ(Fetch(port, "POST", "/api/jobs/" + job + "/cancel").code, 400);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs/" + job + "/cancel", "X-Pstrain-Request: 1\r\n").code, 400);
  EXPECT_EQ(coordinator_->GetJob(job)->state(), PENDING);
  EXPECT_EQ(Fetch(port, "POST", "/api/jobs/" + job + "/explode", "X-Pstrain-Request: 1\r\n").code, 404);
  Response cancel = Fetch(port, "POST", "/api/jobs/" + job + "/cancel", "X-Pstrain-Request: 1\r\n");
  EXPECT_EQ(cancel.code, 200) << cancel.body;
  EXPECT_EQ(cancel.json()["state"], "CANCELLED");
  EXPECT_EQ(coordinator_->GetJob(job)->state(), CANCELLED);
  // A checkpoint of a job that is not running: a conflict, said in words.
  Response ckpt = Fetch(port, "POST", "/api/jobs/" + job + "/checkpoint", "X-Pstrain-Request: 1\r\n");
  EXPECT_EQ(ckpt.code, 409) << ckpt.body;
  EXPECT_FALSE(ckpt.json()["error"].get<std::string>().empty());
}

// DNS rebinding: a web page whose name then resolves to the dashboard is
// same-origin with it, but its requests carry its own name as Host.
TEST_F(DashboardTest, ARequestForAnotherHostIsRefusedAndChangesNothing) {
  StartCoordinator();
  DashboardOptions o;  // unsecured, on 127.0.0.1
  o.allowed_hosts = {"Dash.Example.com"};
  auto d = Dashboard::Start(coordinator_.get(), o);
  ASSERT_TRUE(d.ok()) << d.status();
  dashboard_ = std::move(*d);
  const int port = dashboard_->port();
  const std::string job = Submit();
  const std::string p = absl::StrCat(":", port);

  for (const std::string& host : std::vector<std::string>{"evil.example" + p, "evil.example", std::string(), "127.evil.example" + p,
                                  "localhost.evil.example" + p, "localhost" + p + ".evil.example",
                                  "dash.example.com" + p, "[::1" + p, "localhost:", "127.0.0.1:8x"}) {
    for (const char* path : {"/", "/api/jobs", "/static/app.js"}) {
      Response r = FetchAs(host, port, "GET", path);
      EXPECT_EQ(r.code, 421) << host << " " << path;
      EXPECT_EQ(r.body.find(job), std::string::npos) << host;
    }
    Response cancel = FetchAs(host, port, "POST", "/api/jobs/" + job + "/cancel", "X-Pstrain-Request: 1\r\n");
    EXPECT_EQ(cancel.code, 421) << host;
    EXPECT_NE(cancel.body.find("--dashboard_allowed_hosts"), std::string::npos) << cancel.body;
  }
  EXPECT_EQ(coordinator_->GetJob(job)->state(), PENDING);

  // Its own names: the bind address, loopback names (any port: a
  // port-forward's), and the allowed list (case-insensitive).
  for (const std::string& host : std::vector<std::string>{"127.0.0.1" + p, "localhost" + p, "LocalHost" + p, "[::1]" + p, "localhost:9999",
                                  "127.0.0.1", "dash.example.com"}) {
    Response r = FetchAs(host, port, "GET", "/api/jobs");
    EXPECT_EQ(r.code, 200) << host << " " << r.body;
  }
  Response cancel = FetchAs("localhost" + p, port, "POST", "/api/jobs/" + job + "/cancel", "X-Pstrain-Request: 1\r\n");
  EXPECT_EQ(cancel.code, 200) << cancel.body;
  EXPECT_EQ(coordinator_->GetJob(job)->state(), CANCELLED);

  // A list entry that is not a host: refused at start.
  o.allowed_hosts = {"http://dash.example.com/"};
  auto bad = Dashboard::Start(coordinator_.get(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// On 0.0.0.0 the dashboard is reachable by this machine's addresses and
// hostname too; other names are still refused.
TEST_F(DashboardTest, AWildcardBindServesThisMachinesNames) {
  StartCoordinator();
  DashboardOptions o;
  o.host = "0.0.0.0";
  auto d = Dashboard::Start(coordinator_.get(), o);
  ASSERT_TRUE(d.ok()) << d.status();
  dashboard_ = std::move(*d);
  const int port = dashboard_->port();
  char hostname[256] = {};
  ASSERT_EQ(gethostname(hostname, sizeof(hostname) - 1), 0);
  for (const std::string& host : {absl::StrCat(hostname, ":", port), absl::StrCat("127.0.0.1:", port),
                                  absl::StrCat("0.0.0.0:", port)}) {
    EXPECT_EQ(FetchAs(host, port, "GET", "/api/jobs").code, 200) << host;
  }
  EXPECT_EQ(FetchAs(absl::StrCat("evil.example:", port), port, "GET", "/api/jobs").code, 421);
}

// The dashboard is plain HTTP (see dashboard.h): a secured coordinator
// serves it on loopback only.
TEST_F(DashboardTest, ASecuredDashboardListensOnLoopbackOnly) {
  StartCoordinator();
  auto creds = WriteLocalCredentials(::testing::TempDir() + "/dashboard-creds-plain");
  ASSERT_TRUE(creds.ok()) << creds.status();
  for (bool with_tokens : {true, false}) {
    DashboardOptions o;
    o.host = "0.0.0.0";
    if (with_tokens) o.tokens = *TokenTable::Load(creds->token_auth_file);
    o.secured = !with_tokens;
    auto d = Dashboard::Start(coordinator_.get(), o);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(d.status().message().find("--http_host=127.0.0.1"), std::string::npos) << d.status();
  }
}

TEST_F(DashboardTest, WithTokensUsersSeeAndChangeOnlyTheirOwnJobs) {
  StartCoordinator();
  LocalCredentialsOptions alice;
  alice.user = "alice";
  auto creds = WriteLocalCredentials(::testing::TempDir() + "/dashboard-creds", alice);
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto tokens = TokenTable::Load(creds->token_auth_file);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  DashboardOptions o;
  o.tokens = *tokens;
  o.secured = true;
  auto d = Dashboard::Start(coordinator_.get(), o);
  ASSERT_TRUE(d.ok()) << d.status();
  dashboard_ = std::move(*d);
  const int port = dashboard_->port();
  auto bearer = [](const std::string& file) {
    return "Authorization: Bearer " + std::string(absl::StripAsciiWhitespace(*ReadFile(file))) + "\r\n";
  };
  const std::string alices = Submit(Caller{CallerRole::kUser, "alice"});
  const std::string admins = Submit(Caller{CallerRole::kAdmin, "admin"});

  // The page itself holds no data and is served to anyone (it asks for a
  // token); the API is not.
  EXPECT_EQ(Fetch(port, "GET", "/").code, 200);
  EXPECT_EQ(Fetch(port, "GET", "/jobs/job-999999").code, 200);  // existence is the API's to tell
  Response anonymous = Fetch(port, "GET", "/api/jobs");
  EXPECT_EQ(anonymous.code, 401);
  EXPECT_EQ(anonymous.body.find(alices), std::string::npos);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs", "Authorization: Bearer not-a-token-at-all\r\n").code, 401);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs", bearer(creds->cluster_token_file)).code, 403);

  Response mine = Fetch(port, "GET", "/api/jobs", bearer(creds->user_token_file));
  ASSERT_EQ(mine.code, 200) << mine.body;
  ASSERT_EQ(mine.json()["jobs"].size(), 1u);
  EXPECT_EQ(mine.json()["jobs"][0]["job_id"], alices);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs/" + admins, bearer(creds->user_token_file)).code, 403);
  EXPECT_EQ(Fetch(port, "POST", "/api/jobs/" + admins + "/cancel",
                  bearer(creds->user_token_file) + "X-Pstrain-Request: 1\r\n").code,
            403);
  EXPECT_EQ(coordinator_->GetJob(admins)->state(), PENDING);
  EXPECT_EQ(Fetch(port, "GET", "/api/jobs", bearer(creds->admin_token_file)).json()["jobs"].size(), 2u);
  EXPECT_EQ(Fetch(port, "POST", "/api/jobs/" + alices + "/cancel",
                  bearer(creds->user_token_file) + "X-Pstrain-Request: 1\r\n").code,
            200);
  EXPECT_EQ(coordinator_->GetJob(alices)->state(), CANCELLED);
}

}  // namespace
}  // namespace pstrain
