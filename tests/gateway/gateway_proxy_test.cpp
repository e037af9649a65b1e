// The gateway end to end on loopback, in process: stub upstreams that fail on
// demand, the gateway behind its HTTP server, and a client (upstream_client).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "gateway/gateway.h"
#include "gateway/stub_upstream.h"
#include "gateway/upstream_client.h"

namespace serval::gateway {
namespace {

using json = nlohmann::json;

struct Resp {
  int status = 0;
  HeaderList headers;
  std::string body;
  CallResult::Kind kind = CallResult::Kind::ok;
  std::string header(const std::string& n) const {
    for (const auto& [k, v] : headers)
      if (k == n) return v;
    return "";
  }
};

struct Harness {
  std::vector<std::unique_ptr<StubUpstream>> stubs;
  std::unique_ptr<Gateway> gw;
  std::unique_ptr<http::HttpServer> server;
  std::thread thread;
  std::unique_ptr<ConnectionPool> client;

  // `toml` may use {0}, {1}, ... for the stubs' URLs and {port0}, ... for their ports.
  void start(int n_stubs, std::string toml) {
    for (int i = 0; i < n_stubs; ++i) {
      auto s = StubUpstream::start("127.0.0.1", 0, "stub" + std::to_string(i));
      ASSERT_TRUE(s.ok()) << s.status().message();
      stubs.push_back(std::move(*s));
    }
    for (int i = 0; i < n_stubs; ++i) {
      const std::string ph = "{" + std::to_string(i) + "}", pp = "{port" + std::to_string(i) + "}";
      for (size_t p; (p = toml.find(ph)) != std::string::npos;) toml.replace(p, ph.size(), stubs[i]->url());
      for (size_t p; (p = toml.find(pp)) != std::string::npos;) toml.replace(p, pp.size(), std::to_string(stubs[i]->port()));
    }
    auto cfg = parse_gateway_config(toml, "test.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    auto g = Gateway::create(*cfg);
    ASSERT_TRUE(g.ok()) << g.status().message();
    gw = std::move(*g);
    http::HttpServerConfig hc;
    hc.port = 0;
    Gateway* raw = gw.get();
    auto s = http::HttpServer::create(
        hc, [raw](http::HttpRequest r, std::shared_ptr<http::ResponseChannel> c) { raw->handle(std::move(r), std::move(c)); },
        [](int st, const std::string& m) { return Gateway::error_body(st, m); });
    ASSERT_TRUE(s.ok());
    server = std::move(*s);
    gw->start();
    thread = std::thread([this] { server->run(); });
    client = std::make_unique<ConnectionPool>(*parse_upstream_url("http://127.0.0.1:" + std::to_string(server->port())));
  }
  ~Harness() {
    if (server) server->stop();
    if (thread.joinable()) thread.join();
    if (gw) gw->stop();
  }
  Resp request(const std::string& method, const std::string& path, const std::string& body, const std::string& key = "") {
    Resp r;
    CallRequest req;
    req.method = method;
    req.target = path;
    req.body = body;
    if (!body.empty()) req.headers.emplace_back("content-type", "application/json");
    if (!key.empty()) req.headers.emplace_back("authorization", "Bearer " + key);
    CallTimeouts t;
    t.deadline = Clock::now() + std::chrono::seconds(20);
    auto res = call(
        *client, req, t,
        [&](int st, const HeaderList& h) {
          r.status = st;
          r.headers = h;
          return true;
        },
        [&](std::string_view c) {
          r.body.append(c);
          return true;
        });
    r.kind = res.kind;
    return r;
  }
  Resp post(const std::string& path, const json& body, const std::string& key = "") { return request("POST", path, body.dump(), key); }
  json metrics_value(const std::string& needle) {
    auto m = request("GET", "/metrics", "");
    for (size_t p = 0; (p = m.body.find(needle, p)) != std::string::npos; ++p)
      if (p == 0 || m.body[p - 1] == '\n') return std::stod(m.body.substr(m.body.find(' ', p + needle.size() - 1) + 1));
    return nullptr;
  }
};

std::string error_code(const Resp& r) {
  auto j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("error")) return "(not an error body: " + r.body + ")";
  return j["error"]["code"].is_string() ? j["error"]["code"].get<std::string>() : "";
}

const json kCompletion = {{"model", "m"}, {"prompt", "Once upon a time"}, {"max_tokens", 4}};

TEST(GatewayProxy, ProxiesStreamsAndMergesModels) {
  Harness h;
  h.start(1, "[[models]]\nname='m'\naliases=['alias']\nupstreams=['{0}']\nupstream_model='real-name'\n");
  auto r = h.post("/v1/completions", kCompletion);
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  EXPECT_EQ(j["model"], "real-name");  // the upstream saw the rewritten model name
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_FALSE(r.header("x-request-id").empty());

  json chat = {{"model", "alias"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", true}};
  r = h.post("/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_EQ(std::count(r.body.begin(), r.body.end(), '\n'), 2 * 5);  // 4 chunks + [DONE], each "data: ...\n\n"
  EXPECT_NE(r.body.find("data: [DONE]\n\n"), std::string::npos);
  // The gateway asked for usage upstream (for the ledger) but the client did not: no usage chunk.
  EXPECT_EQ(r.body.find("\"usage\""), std::string::npos);
  chat["stream_options"] = {{"include_usage", true}};
  r = h.post("/v1/chat/completions", chat);
  EXPECT_NE(r.body.find("\"usage\""), std::string::npos);

  r = h.request("GET", "/v1/models", "");
  ASSERT_EQ(r.status, 200);
  j = json::parse(r.body);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "m");
  EXPECT_EQ(j["data"][1]["id"], "alias");
  EXPECT_EQ(j["data"][1]["parent"], "m");
  EXPECT_EQ(j["data"][0]["max_model_len"], 4096);  // merged from the upstream's own /v1/models

  r = h.post("/v1/embeddings", {{"model", "m"}, {"input", "abc"}});
  EXPECT_EQ(r.status, 200);
}

TEST(GatewayProxy, BadInputGetsOpenAiErrors) {
  Harness h;
  h.start(1, "[auth]\nrequire_key = true\n[[models]]\nname='m'\nupstreams=['{0}']\n[[models]]\nname='other'\nupstreams=['{0}']\n"
             "[[keys]]\nname='k'\nsha256='" + sha256_hex("key-one") + "'\nmodels=['m']\n");
  EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 401);
  auto r = h.post("/v1/completions", kCompletion, "wrong-key");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_code(r), "invalid_api_key");
  r = h.post("/v1/completions", {{"model", "other"}, {"prompt", "x"}}, "key-one");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(error_code(r), "model_not_allowed");
  r = h.post("/v1/completions", {{"model", "nope"}, {"prompt", "x"}}, "key-one");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_code(r), "model_not_found");
  r = h.request("POST", "/v1/completions", "{not json", "key-one");
  EXPECT_EQ(r.status, 400);
  r = h.request("POST", "/v1/completions", std::string(100, '[') + std::string(100, ']'), "key-one");
  EXPECT_EQ(r.status, 400);
  r = h.post("/v1/completions", {{"model", 7}}, "key-one");
  EXPECT_EQ(r.status, 400);
  r = h.post("/v1/completions", {{"model", "m"}, {"stream", "yes"}}, "key-one");
  EXPECT_EQ(r.status, 400);
  r = h.request("GET", "/v1/nothing", "", "key-one");
  EXPECT_EQ(r.status, 404);
  r = h.request("GET", "/v1/\xff\xfe-not-utf8", "", "key-one");  // quoted in the message: still a JSON error
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_code(r), "not_found");
  EXPECT_EQ(h.post("/v1/completions", kCompletion, "key-one").status, 200);
  EXPECT_EQ(h.stubs[0]->behaviour().requests.load(), 1);  // nothing refused reached the upstream
}

TEST(GatewayProxy, RetriesOnAnotherReplicaAndOpensTheBreaker) {
  Harness h;
  h.start(2, "[routing]\npolicy='round_robin'\n[breaker]\nfailures=2\nopen_s=60\n[retry]\nbackoff_ms=1\n"
             "[health]\ninterval_s=3600\n[[models]]\nname='m'\nupstreams=['{0}', '{1}']\n");
  h.stubs[0]->behaviour().fail_status = 500;
  for (int i = 0; i < 6; ++i) {
    auto r = h.post("/v1/completions", kCompletion);
    EXPECT_EQ(r.status, 200) << r.body;  // every failure retried on the healthy replica
  }
  // After 2 consecutive failures the breaker opened: the failing stub gets no more.
  EXPECT_EQ(h.stubs[0]->behaviour().requests.load(), 2);
  EXPECT_EQ(h.stubs[1]->behaviour().requests.load(), 6);
  const std::string up0 = h.stubs[0]->url();
  EXPECT_EQ(h.metrics_value("serval_gateway_breaker_state{model=\"m\",upstream=\"" + up0 + "\"}"), 1);
  EXPECT_EQ(h.metrics_value("serval_gateway_retries_total{model=\"m\"}"), 2);
}

TEST(GatewayProxy, FallbackChainOnFailureAndOnContextLength) {
  Harness h;
  h.start(3, "[retry]\nattempts=2\nbackoff_ms=1\n[health]\ninterval_s=3600\n"
             "[[models]]\nname='m'\nupstreams=['{0}']\nfallback=['b', 'c']\n"
             "[[models]]\nname='b'\nupstreams=['{1}']\n[[models]]\nname='c'\nupstreams=['{2}']\n");
  h.stubs[0]->behaviour().fail_status = 503;
  h.stubs[1]->behaviour().fail_status = 429;
  auto r = h.post("/v1/completions", kCompletion);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["model"], "c");
  EXPECT_EQ(h.stubs[0]->behaviour().requests.load(), 2);  // attempts per model
  EXPECT_EQ(h.stubs[1]->behaviour().requests.load(), 2);
  EXPECT_EQ(h.metrics_value("serval_gateway_fallbacks_total{from=\"b\",to=\"c\"}"), 1);

  // Context too long for m: straight to b without a retry on m.
  h.stubs[0]->behaviour().fail_status = 0;
  h.stubs[1]->behaviour().fail_status = 0;
  h.stubs[0]->behaviour().context_chars = 10;
  const long before = h.stubs[0]->behaviour().requests.load();
  r = h.post("/v1/completions", {{"model", "m"}, {"prompt", std::string(50, 'x')}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["model"], "b");
  EXPECT_EQ(h.stubs[0]->behaviour().requests.load(), before + 1);

  // Every model failing: the client gets the last upstream's error.
  for (auto& s : h.stubs) s->behaviour().fail_status = 500;
  r = h.post("/v1/completions", kCompletion);
  EXPECT_EQ(r.status, 500);
  // A client error (4xx other than 408/429/context) is passed through, not retried.
  for (auto& s : h.stubs) s->behaviour().fail_status = 422;
  const long b0 = h.stubs[0]->behaviour().requests.load();
  r = h.post("/v1/completions", kCompletion);
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(h.stubs[0]->behaviour().requests.load(), b0 + 1);
}

TEST(GatewayProxy, BrokenStreamEndsWithAnErrorEvent) {
  Harness h;
  h.start(1, "[[models]]\nname='m'\nupstreams=['{0}']\n");
  h.stubs[0]->behaviour().stream_stop_after = 2;
  json body = kCompletion;
  body["stream"] = true;
  auto r = h.post("/v1/completions", body);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.kind, CallResult::Kind::ok);  // ended, not hung
  EXPECT_NE(r.body.find("upstream_stream_broken"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(h.metrics_value("serval_gateway_stream_errors_total{model=\"m\"}"), 1);
}

TEST(GatewayProxy, NoUpstreamAnswers503AndDeadUpstreamIsRetried) {
  Harness h;
  // Port 1 refuses connections: connect errors are retried, then 502/503 with a message.
  h.start(1, "[retry]\nbackoff_ms=1\n[breaker]\nfailures=100\n[health]\ninterval_s=3600\n"
             "[[models]]\nname='m'\nupstreams=['http://127.0.0.1:1', '{0}']\n");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 200);
  h.stubs[0].reset();  // its sockets close, as a killed process's do
  auto r = h.post("/v1/completions", kCompletion);
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(r.body.find("connect"), std::string::npos) << r.body;
}

TEST(GatewayProxy, KeysLimitsBudgetsAndTheLedger) {
  Harness h;
  const std::string admin = "admin-secret-0123456789";
  // Price: 1e6 per million tokens = 1 per token; the stub answers prompt 5 + completion 4 = 9 tokens.
  h.start(1, "[auth]\nadmin_key_sha256='" + sha256_hex(admin) + "'\n"
             "[[models]]\nname='m'\nupstreams=['{0}']\nprice_input_per_mtok=1e6\nprice_output_per_mtok=1e6\n"
             "[[keys]]\nname='budget'\nsha256='" + sha256_hex("budget-key") + "'\nbudget=20\nbudget_period='day'\n"
             "[[keys]]\nname='rpm'\nsha256='" + sha256_hex("rpm-key") + "'\nrpm=2\n"
             "[[keys]]\nname='tpm'\nsha256='" + sha256_hex("tpm-key") + "'\ntpm=10\n");
  const json body = {{"model", "m"}, {"prompt", "Once upon a time"}};  // 16 chars: 5 prompt tokens
  // Budget 20: the third request (spend 18 < 20) goes, the fourth (27) is refused naming the budget.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.post("/v1/completions", body, "budget-key").status, 200);
  auto r = h.post("/v1/completions", body, "budget-key");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(error_code(r), "budget_exceeded");
  EXPECT_NE(r.body.find("budget of key 'budget' exhausted: spent 27 of 20 per day"), std::string::npos) << r.body;
  EXPECT_FALSE(r.header("retry-after").empty());

  EXPECT_EQ(h.post("/v1/completions", body, "rpm-key").status, 200);
  EXPECT_EQ(h.post("/v1/completions", body, "rpm-key").status, 200);
  r = h.post("/v1/completions", body, "rpm-key");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(error_code(r), "rate_limit_rpm");
  EXPECT_GE(std::stoi(r.header("retry-after")), 1);

  EXPECT_EQ(h.post("/v1/completions", body, "tpm-key").status, 200);  // 9 of 10
  EXPECT_EQ(h.post("/v1/completions", body, "tpm-key").status, 200);  // 1 left: admitted, goes to -8
  r = h.post("/v1/completions", body, "tpm-key");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(error_code(r), "rate_limit_tpm");

  // Usage: a key sees its own; the admin sees all; the sums are what the clients were told.
  r = h.request("GET", "/v1/gateway/usage", "", "budget-key");
  ASSERT_EQ(r.status, 200) << r.body;
  auto u = json::parse(r.body);
  EXPECT_EQ(u["total"]["requests"], 3);
  EXPECT_EQ(u["total"]["prompt_tokens"], 15);
  EXPECT_EQ(u["total"]["completion_tokens"], 12);
  EXPECT_DOUBLE_EQ(u["total"]["spend"].get<double>(), 27);
  EXPECT_EQ(h.request("GET", "/v1/gateway/usage?key=rpm", "", "budget-key").status, 403);
  r = h.request("GET", "/v1/gateway/usage", "", admin);
  EXPECT_EQ(json::parse(r.body)["total"]["requests"], 7);
  EXPECT_EQ(h.request("GET", "/v1/gateway/usage?from=yesterday", "", admin).status, 400);
  EXPECT_EQ(h.metrics_value("serval_gateway_key_spend_total{key=\"budget\"}"), 27);

  // Key admin: create (the key is shown once), use, list, delete.
  EXPECT_EQ(h.request("GET", "/v1/gateway/keys", "", "budget-key").status, 401);
  r = h.post("/v1/gateway/keys", {{"name", "new"}, {"rpm", 100}, {"models", {"m"}}}, admin);
  ASSERT_EQ(r.status, 201) << r.body;
  const std::string made = json::parse(r.body)["key"];
  EXPECT_EQ(made.rfind("sk-serval-", 0), 0u);
  EXPECT_EQ(h.post("/v1/completions", body, made).status, 200);
  EXPECT_EQ(h.post("/v1/gateway/keys", {{"name", "new"}}, admin).status, 409);
  r = h.post("/v1/gateway/keys", {{"name", "bad"}, {"budget_period", "week"}}, admin);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("budget_period"), std::string::npos);
  EXPECT_EQ(h.post("/v1/gateway/keys", {{"name", "x"}, {"models", {"nope"}}}, admin).status, 400);
  EXPECT_EQ(h.post("/v1/gateway/keys", {{"name", "x"}, {"colour", 1}}, admin).status, 400);
  r = h.request("GET", "/v1/gateway/keys", "", admin);
  EXPECT_EQ(json::parse(r.body)["data"].size(), 4u);
  EXPECT_EQ(r.body.find(made), std::string::npos);  // never shown again
  EXPECT_EQ(h.request("DELETE", "/v1/gateway/keys/budget", "", admin).status, 409);  // from the config file
  EXPECT_EQ(h.request("DELETE", "/v1/gateway/keys/new", "", admin).status, 200);
  EXPECT_EQ(h.post("/v1/completions", body, made).status, 401);
}

TEST(GatewayProxy, StreamUsageIsRecordedOnceAcrossRetries) {
  Harness h;
  const std::string admin = "admin-secret-0123456789";
  h.start(2, "[auth]\nadmin_key_sha256='" + sha256_hex(admin) + "'\n[routing]\npolicy='round_robin'\n[retry]\nbackoff_ms=1\n"
             "[breaker]\nfailures=1000\n[health]\ninterval_s=3600\n"
             "[[models]]\nname='m'\nupstreams=['{0}', '{1}']\nprice_output_per_mtok=1e6\n");
  h.stubs[0]->behaviour().fail_status = 502;
  int64_t seen_completion = 0;
  for (int i = 0; i < 6; ++i) {
    json body = kCompletion;
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto r = h.post("/v1/completions", body);
    ASSERT_EQ(r.status, 200);
    const size_t p = r.body.find("\"completion_tokens\":");
    ASSERT_NE(p, std::string::npos);
    seen_completion += std::stoll(r.body.substr(p + 20));
  }
  EXPECT_GE(h.stubs[0]->behaviour().requests.load(), 3);  // retried attempts happened
  auto u = json::parse(h.request("GET", "/v1/gateway/usage", "", admin).body);
  EXPECT_EQ(u["total"]["requests"], 6);
  EXPECT_EQ(u["total"]["completion_tokens"], seen_completion);
  EXPECT_DOUBLE_EQ(u["total"]["spend"].get<double>(), (double)seen_completion);
}

TEST(GatewayProxy, TraceContextReachesTheUpstream) {
  Harness h;
  h.start(1, "[[models]]\nname='m'\nupstreams=['{0}']\n");
  CallRequest req;
  req.target = "/v1/completions";
  req.body = kCompletion.dump();
  req.headers = {{"content-type", "application/json"},
                 {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}};
  CallTimeouts t;
  t.deadline = Clock::now() + std::chrono::seconds(10);
  int st = 0;
  auto res = call(*h.client, req, t, [&](int s, const HeaderList&) { st = s; return true; }, [](std::string_view) { return true; });
  EXPECT_EQ(res.kind, CallResult::Kind::ok);
  EXPECT_EQ(st, 200);
  const std::string tp = h.stubs[0]->last_traceparent();
  ASSERT_EQ(tp.size(), 55u) << tp;
  EXPECT_EQ(tp.substr(0, 36), "00-0af7651916cd43dd8448eb211c80319c-");  // same trace
  EXPECT_NE(tp.substr(36, 16), "b7ad6b7169203331");                      // a span of its own
  EXPECT_EQ(tp.substr(53), "01");
  // Without one, the gateway starts a trace.
  EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 200);
  EXPECT_EQ(h.stubs[0]->last_traceparent().size(), 55u);
}

// A port nothing listens on now (bound, then released).
uint16_t free_port() {
  auto s = StubUpstream::start("127.0.0.1", 0, "probe");
  const uint16_t p = (*s)->port();
  (*s)->stop();
  return p;
}

TEST(GatewayProxy, HoldsRequestsUntilAReplicaComesUp) {
  const uint16_t port = free_port();
  Harness h;
  h.start(0, "[routing]\nqueue_timeout_s=20\n[health]\ninterval_s=0.1\n[[models]]\nname='m'\nupstreams=['http://127.0.0.1:" +
                 std::to_string(port) + "']\n");
  EXPECT_EQ(h.request("GET", "/ready", "").status, 503);  // no replica up
  Resp r;
  std::thread client([&] { r = h.post("/v1/completions", kCompletion); });
  // The request waits, counted as queued (the scale-from-zero signal).
  for (int i = 0; i < 200 && h.metrics_value("serval_gateway_requests_queued{model=\"m\"}") != json(1); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(h.metrics_value("serval_gateway_requests_queued{model=\"m\"}"), 1);
  auto stub = StubUpstream::start("127.0.0.1", port, "late");
  ASSERT_TRUE(stub.ok()) << stub.status().message();
  client.join();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ((*stub)->behaviour().requests.load(), 1);
  EXPECT_EQ(h.metrics_value("serval_gateway_requests_queued{model=\"m\"}"), 0);
}

TEST(GatewayProxy, QueueTimeoutAnswers503) {
  const uint16_t port = free_port();
  Harness h;
  h.start(0, "[routing]\nqueue_timeout_s=0.3\n[health]\ninterval_s=0.1\n[[models]]\nname='m'\nupstreams=['http://127.0.0.1:" +
                 std::to_string(port) + "']\n");
  const auto t0 = Clock::now();
  auto r = h.post("/v1/completions", kCompletion);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(error_code(r), "no_upstream");
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - t0).count(), 0.3);
  EXPECT_EQ(r.header("retry-after"), "1");
}

TEST(GatewayProxy, DnsDiscoveryFollowsTheNamesAddresses) {
  Harness h;
  // localhost: 127.0.0.1 (where the stub listens) and perhaps ::1 (unhealthy: nothing there).
  h.start(1, "[health]\ninterval_s=0.1\n[[models]]\nname='m'\ndiscovery='dns'\nupstreams=['http://localhost:{port0}']\n");
  EXPECT_GE(h.metrics_value("serval_gateway_replicas{model=\"m\"}").get<double>(), 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 200);
  EXPECT_EQ(h.stubs[0]->behaviour().requests.load(), 4);
}

TEST(GatewayProxy, DnsDiscoveryOfAMissingNameIsAnEmptyPool) {
  Harness h;
  h.start(0, "[health]\ninterval_s=0.1\n[[models]]\nname='m'\ndiscovery='dns'\nupstreams=['http://no-such-host.invalid:8080']\n");
  EXPECT_EQ(h.metrics_value("serval_gateway_replicas{model=\"m\"}"), 0);
  EXPECT_EQ(h.post("/v1/completions", kCompletion).status, 503);
}

}  // namespace
}  // namespace serval::gateway
