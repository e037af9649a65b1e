// Tests of `serval bench http` (tools/bench_http.*): URL and SSE parsing, and
// whole runs against a fake OpenAI-compatible SSE server on 127.0.0.1 (random
// port) whose timing, token counts and failures are known.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "../../tools/bench_http.h"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using namespace serval::cli::bench_http;

// ---------------------------------------------------------------- fake server

struct FakeConfig {
  int chunk_interval_ms = 10;    // sleep before each content chunk
  int stall_ms = 0;              // extra sleep before the first chunk
  bool send_usage = true;        // final chunk with usage
  bool close_each = false;       // "Connection: close" on every response
  bool drop_after_response = false;  // say keep-alive, then close the socket anyway
  bool chunked = true;           // false: SSE body delimited by closing the connection
  int fail_every = 0;            // every k-th completion request (after the 429s) -> 503
  int rate_limit_first = 0;      // the first r completion requests -> 429, Retry-After: 0
  std::string require_key;       // non-empty: 401 unless "Authorization: Bearer <key>"
  bool has_tokenize = true;
  int tokens_per_word = 2;       // what /tokenize and usage.prompt_tokens claim
  int stream_fault = 0;          // 1: an error event after the first chunk; 2: no [DONE];
                                 // 3: [DONE], then 1.5 s before the body ends
};

class FakeServer {
 public:
  explicit FakeServer(FakeConfig cfg) : cfg_(std::move(cfg)), acceptor_(ioc_) {
    tcp::endpoint ep(net::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~FakeServer() {
    stop_ = true;
    {  // wake accept()
      net::io_context ioc;
      tcp::socket s(ioc);
      beast::error_code ec;
      s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
    }
    accept_thread_.join();
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : conn_threads_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<json> bodies() {
    std::lock_guard<std::mutex> lk(mu_);
    return bodies_;
  }
  int connections() const { return connections_; }

 private:
  void accept_loop() {
    for (;;) {
      auto sock = std::make_shared<tcp::socket>(ioc_);
      beast::error_code ec;
      acceptor_.accept(*sock, ec);
      if (stop_) return;
      if (ec) continue;
      ++connections_;
      sock->set_option(tcp::no_delay(true), ec);  // else Nagle + delayed ACK add ~40 ms to TTFT
      std::lock_guard<std::mutex> lk(mu_);
      fds_.push_back(sock->native_handle());
      conn_threads_.emplace_back([this, sock] { serve(*sock); });
    }
  }

  static bool send(tcp::socket& s, const std::string& bytes) {
    beast::error_code ec;
    net::write(s, net::buffer(bytes), ec);
    return !ec;
  }
  static std::string chunk(const std::string& data) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%zx", data.size());
    return std::string(hex) + "\r\n" + data + "\r\n";
  }
  static std::string simple(int status, const std::string& body, bool close, const std::string& extra = "") {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n" + extra + (close ? "Connection: close\r\n" : "") + "\r\n" + body;
  }

  void serve(tcp::socket& s) {
    beast::flat_buffer buf;
    for (;;) {
      http::request<http::string_body> req;
      beast::error_code ec;
      http::read(s, buf, req, ec);
      if (ec) return;
      const bool close = cfg_.close_each;
      const std::string target(req.target());
      if (!cfg_.require_key.empty() && req[http::field::authorization] != "Bearer " + cfg_.require_key) {
        if (!send(s, simple(401, R"({"error":{"message":"bad key"}})", close)) || close) return;
        continue;
      }
      if (target == "/v1/models") {
        if (!send(s, simple(200, R"({"object":"list","data":[{"id":"fake-model"},{"id":"other"}]})", close)) || close)
          return;
        continue;
      }
      if (target == "/tokenize") {
        json j = json::parse(req.body(), nullptr, false);
        if (!cfg_.has_tokenize || !j.is_object() || !j.contains("prompt")) {
          if (!send(s, simple(404, "{}", close)) || close) return;
          continue;
        }
        const int n = words(j["prompt"].get<std::string>()) * cfg_.tokens_per_word;
        if (!send(s, simple(200, json{{"tokens", std::vector<int>((size_t)n, 7)}, {"count", n}}.dump(), close)) ||
            close)
          return;
        continue;
      }
      const bool chat = target == "/v1/chat/completions";
      if (!chat && target != "/v1/completions") {
        if (!send(s, simple(404, "{}", close)) || close) return;
        continue;
      }
      json body = json::parse(req.body(), nullptr, false);
      int n;
      {
        std::lock_guard<std::mutex> lk(mu_);
        bodies_.push_back(body);
        n = (int)bodies_.size();
      }
      if (n <= cfg_.rate_limit_first) {
        if (!send(s, simple(429, R"({"error":"slow down"})", close, "Retry-After: 0\r\n")) || close) return;
        continue;
      }
      if (cfg_.fail_every && (n - cfg_.rate_limit_first) % cfg_.fail_every == 0) {
        if (!send(s, simple(503, R"({"error":"busy"})", close)) || close) return;
        continue;
      }
      const int g = body.value("max_tokens", 1);
      const std::string prompt =
          chat ? body["messages"][0]["content"].get<std::string>() : body["prompt"].get<std::string>();
      const bool conn_close = close || !cfg_.chunked;
      std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";
      head += cfg_.chunked ? "Transfer-Encoding: chunked\r\n" : "";
      head += conn_close ? "Connection: close\r\n\r\n" : "\r\n";
      if (!send(s, head)) return;
      auto event = [&](const std::string& data) {
        const std::string e = "data: " + data + "\n\n";
        return send(s, cfg_.chunked ? chunk(e) : e);
      };
      if (chat && !event(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})")) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg_.stall_ms));
      for (int i = 0; i < g; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(cfg_.chunk_interval_ms));
        const std::string piece = " w" + std::to_string(i);
        json c = chat ? json{{"choices", {{{"index", 0}, {"delta", {{"content", piece}}}}}}}
                      : json{{"choices", {{{"index", 0}, {"text", piece}}}}};
        if (cfg_.send_usage) c["usage"] = nullptr;
        if (!event(c.dump())) return;
        if (cfg_.stream_fault == 1 && !event(R"({"error":{"message":"engine died"}})")) return;
      }
      if (cfg_.send_usage) {
        json u = {{"choices", json::array()},
                  {"usage", {{"prompt_tokens", words(prompt) * cfg_.tokens_per_word}, {"completion_tokens", g}}}};
        if (!event(u.dump())) return;
      }
      if (cfg_.stream_fault != 2 && !event("[DONE]")) return;
      if (cfg_.stream_fault == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      if (cfg_.chunked && !send(s, "0\r\n\r\n")) return;
      if (conn_close || cfg_.drop_after_response) return;
    }
  }

  static int words(const std::string& s) {
    int n = 0;
    bool in = false;
    for (char c : s) {
      if (c != ' ' && !in) ++n;
      in = c != ' ';
    }
    return n;
  }

  FakeConfig cfg_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> conn_threads_;
  std::vector<int> fds_;
  std::vector<json> bodies_;
};

Options base_options(const std::string& url) {
  Options o;
  o.url = url;
  o.requests = 8;
  o.prompt_len = 40;
  o.gen_len = 8;
  o.timeout_s = 10;
  return o;
}

// Runs run_cli() with the given arguments; returns the status and what it printed.
std::pair<int, std::string> run_main(std::vector<std::string> args) {
  args.insert(args.begin(), "serval bench http");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::FILE* f = std::tmpfile();
  const int rc = serval::cli::bench_http::run_cli((int)args.size(), argv.data(), f);
  std::rewind(f);
  std::string out;
  char b[4096];
  size_t n;
  while ((n = std::fread(b, 1, sizeof b, f)) > 0) out.append(b, n);
  std::fclose(f);
  return {rc, out};
}

// A loopback port with nothing listening.
unsigned short closed_port() {
  net::io_context ioc;
  tcp::acceptor a(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

// ---------------------------------------------------------------- parsing

TEST(BenchHttpUrl, Accepts) {
  auto t = parse_url("http://127.0.0.1:8080");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, "8080");
  EXPECT_EQ(t->base, "");
  EXPECT_EQ(t->host_header, "127.0.0.1:8080");
  t = parse_url("HTTP://localhost");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->port, "80");
  t = parse_url("http://[::1]:9000/v1/");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->host, "::1");
  EXPECT_EQ(t->base, "");
  EXPECT_EQ(t->host_header, "[::1]:9000");
  t = parse_url("http://my-host.example:1/prefix/");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->base, "/prefix");
}

TEST(BenchHttpUrl, Rejects) {
  for (const char* u : {"", "127.0.0.1:8080", "https://h", "ftp://h", "http://", "http://:80", "http://h:0",
                        "http://h:65536", "http://h:80x", "http://h:", "http://u@h", "http://h/?q=1", "http://h/#x",
                        "http://h p", "http://[::1", "http://[zz]:80", "http://h\x01"}) {
    auto t = parse_url(u);
    EXPECT_FALSE(t.ok()) << u;
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), serval::StatusCode::invalid_argument) << u;
    }
  }
  EXPECT_NE(parse_url("https://h").status().message().find("plain http"), std::string::npos);
}

TEST(BenchHttpSse, SplitsEventsAcrossFeeds) {
  const std::string stream =
      ": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata:line2\n\nid: 3\n\ndata: [DONE]\n\n";
  for (size_t step : {size_t(1), size_t(3), size_t(7), stream.size()}) {
    SseParser p;
    std::vector<std::string> got;
    for (size_t i = 0; i < stream.size(); i += step)
      ASSERT_TRUE(p.feed(std::string_view(stream).substr(i, step), [&](std::string_view d) { got.emplace_back(d); }));
    ASSERT_EQ(got.size(), 3u) << "step " << step;
    EXPECT_EQ(got[0], "{\"a\":1}");
    EXPECT_EQ(got[1], "line1\nline2");
    EXPECT_EQ(got[2], "[DONE]");
  }
  SseParser small(16);
  EXPECT_FALSE(small.feed("data: 0123456789abcdefXYZ", [](std::string_view) {}));
}

TEST(BenchHttpStats, Percentile) {
  EXPECT_EQ(percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 90), 4.6);
  EXPECT_DOUBLE_EQ(percentile({1, 2}, 100), 2);
}

// ---------------------------------------------------------------- whole runs

TEST(BenchHttpRun, MeasuresTimingAndTokens) {
  FakeServer srv(FakeConfig{});
  Options o = base_options(srv.url());
  o.shared_prefix = 10;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->model, "fake-model");
  EXPECT_TRUE(plan->calibrated);
  EXPECT_DOUBLE_EQ(plan->tokens_per_word, 2.0);
  EXPECT_EQ(plan->prompt_words, 20);
  EXPECT_EQ(plan->prefix_words, 5);
  auto r = run_load(o, *plan, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->completed, 8);
  EXPECT_EQ(r->failed, 0) << r->last_error;
  EXPECT_EQ(r->gen_tokens, 8 * 8);
  EXPECT_EQ(r->prompt_tokens, 8 * 40);
  EXPECT_EQ(r->short_generations, 0);
  EXPECT_TRUE(r->status_errors.empty());
  EXPECT_EQ(r->connection_errors + r->timeouts + r->stream_errors, 0);
  ASSERT_EQ(r->ttft.size(), 8u);
  ASSERT_EQ(r->itl.size(), 8u * 7);
  // Chunks 10 ms apart (generous bounds: a busy CI machine).
  EXPECT_GE(percentile(r->itl, 50), 0.008);
  EXPECT_LE(percentile(r->itl, 50), 0.04);
  EXPECT_GE(percentile(r->ttft, 50), 0.008);
  EXPECT_LE(percentile(r->ttft, 50), 0.1);
  EXPECT_GE(percentile(r->e2e, 50), 0.07);
  // 8 requests of ~80 ms on 2 clients: about 0.32 s.
  EXPECT_GE(r->wall_s, 0.25);
  EXPECT_LE(r->wall_s, 2.0);
  // One connection for the plan, one per client: keep-alive reused.
  EXPECT_EQ(srv.connections(), 3);

  auto bodies = srv.bodies();
  ASSERT_EQ(bodies.size(), 8u);
  std::set<std::string> prompts;
  for (const auto& b : bodies) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["max_tokens"], 8);
    EXPECT_EQ(b["temperature"], 0);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    const std::string p = b["prompt"];
    EXPECT_EQ(std::count(p.begin(), p.end(), ' '), 19) << p;
    prompts.insert(p);
    // The shared prefix: the first 5 words are the same in every prompt.
    EXPECT_EQ(p.substr(0, 20), bodies[0]["prompt"].get<std::string>().substr(0, 20));
  }
  EXPECT_EQ(prompts.size(), 8u);
  // A second run gets different prompts (no prefix-cache hits across runs).
  ASSERT_TRUE(run_load(o, *plan, 1).ok());
  EXPECT_NE(srv.bodies()[8]["prompt"], bodies[0]["prompt"]);
}

// Open loop: requests start at the planner's Poisson arrival times, whatever
// is in flight, and latency counts from the arrival.
TEST(BenchHttpRun, OpenLoopFollowsTheArrivals) {
  const std::vector<double> a = poisson_arrivals(2000, 50.0, 7);
  ASSERT_EQ(a.size(), 2000u);
  EXPECT_EQ(a[0], 0.0);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GT(a[i], a[i - 1]);
  EXPECT_NEAR(a.back() / 1999.0, 1.0 / 50.0, 0.1 / 50.0);  // mean gap 1/rate (2000 draws: +-10 %)
  EXPECT_EQ(poisson_arrivals(2000, 50.0, 7), a);            // seeded
  EXPECT_NE(poisson_arrivals(2000, 50.0, 8), a);

  // 6 requests at 4/s: the arrivals span longer than a closed loop of one
  // client needs (6 x ~80 ms), so the run's length shows they were honoured.
  FakeServer srv(FakeConfig{});
  Options o = base_options(srv.url());
  o.requests = 6;
  o.rate = 4;
  o.seed = 3;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::vector<double> arr = poisson_arrivals(6, 4, 3);
  ASSERT_GT(arr.back(), 0.7);  // (seeded) the closed loop would be done by ~0.5 s
  auto r = run_load(o, *plan, 1);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->completed, 6);
  EXPECT_GE(r->wall_s, arr.back() + 0.07);  // the last request starts at its arrival and takes ~80 ms
  EXPECT_LE(r->wall_s, arr.back() + 1.0);
  ASSERT_EQ(r->e2e.size(), 6u);
  for (double x : r->e2e) EXPECT_GE(x, 0.07);

  // One client per request: each starts within a few ms of its arrival.
  auto r2 = run_load(o, *plan, 6);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->completed, 6);
  EXPECT_LE(r2->max_start_lag_s, 0.05);
  EXPECT_LE(percentile(r2->ttft, 50), 0.1);
}

TEST(BenchHttpRun, CountsErrorsAndHonoursRetryAfter) {
  FakeConfig c;
  c.chunk_interval_ms = 1;
  c.fail_every = 3;
  c.rate_limit_first = 2;
  c.close_each = true;
  FakeServer srv(c);
  Options o = base_options(srv.url());
  o.requests = 9;
  o.gen_len = 3;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  auto r = run_load(o, *plan, 3);
  ASSERT_TRUE(r.ok());
  // 11 attempts: #1-2 are 429 (retried), then #5, #8, #11 are 503.
  EXPECT_EQ(r->completed, 6);
  EXPECT_EQ(r->failed, 3);
  EXPECT_EQ(r->gen_tokens, 18);
  EXPECT_EQ(r->retries_429, 2);
  EXPECT_EQ(r->status_errors, (std::map<int, int64_t>{{429, 2}, {503, 3}}));
  EXPECT_EQ(r->connection_errors, 0);
  EXPECT_NE(r->last_error.find("503"), std::string::npos) << r->last_error;
  EXPECT_EQ(srv.bodies().size(), 11u);
}

TEST(BenchHttpRun, RetriesOnceOnAStaleKeepAliveConnection) {
  FakeConfig c;
  c.chunk_interval_ms = 1;
  c.drop_after_response = true;
  FakeServer srv(c);
  Options o = base_options(srv.url());
  o.requests = 6;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->calibrated);  // POST /tokenize went over a fresh connection
  auto r = run_load(o, *plan, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->completed, 6) << r->last_error;
  EXPECT_EQ(r->connection_errors, 0);
}

TEST(BenchHttpRun, DoesNotWaitLongAfterDone) {
  FakeConfig c;
  c.chunk_interval_ms = 1;
  c.stream_fault = 3;
  FakeServer srv(c);
  Options o = base_options(srv.url());
  o.requests = 1;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok());
  auto r = run_load(o, *plan, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->completed, 1) << r->last_error;
  EXPECT_LT(r->wall_s, 1.4);
  ASSERT_EQ(r->e2e.size(), 1u);
  EXPECT_LT(r->e2e[0], 0.5);
}

TEST(BenchHttpRun, ChatWithoutUsageCountsChunks) {
  FakeConfig c;
  c.chunk_interval_ms = 2;
  c.send_usage = false;
  c.require_key = "sekret";
  c.chunked = false;  // body ends when the server closes
  FakeServer srv(c);
  Options o = base_options(srv.url());
  o.endpoint = Endpoint::chat;
  o.api_key = "sekret";
  o.model = "given";
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->model, "given");
  auto r = run_load(o, *plan, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->completed, 8) << r->last_error;
  EXPECT_EQ(r->gen_tokens, 64);                // one per content chunk (the role chunk is not content)
  EXPECT_EQ(r->prompt_tokens, 8 * 40);         // no usage: --prompt-len per request
  EXPECT_EQ(r->itl.size(), 8u * 7);
  for (const auto& b : srv.bodies()) {
    EXPECT_EQ(b["model"], "given");
    EXPECT_EQ(b["messages"][0]["role"], "user");
  }

  o.api_key = "wrong";
  auto bad = run_load(o, *plan, 2);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->completed, 0);
  EXPECT_EQ(bad->status_errors, (std::map<int, int64_t>{{401, 8}}));
}

TEST(BenchHttpRun, TimesOutAStalledStream) {
  FakeConfig c;
  c.stall_ms = 600;
  c.has_tokenize = false;
  FakeServer srv(c);
  Options o = base_options(srv.url());
  o.requests = 2;
  o.timeout_s = 0.15;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_FALSE(plan->calibrated);
  EXPECT_DOUBLE_EQ(plan->tokens_per_word, 1.3);
  EXPECT_EQ(plan->prompt_words, 31);  // 40 / 1.3
  auto r = run_load(o, *plan, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->timeouts, 2);
  EXPECT_EQ(r->failed, 2);
  EXPECT_LT(r->wall_s, 0.6);
}

TEST(BenchHttpRun, CountsBadStreams) {
  for (int fault : {1, 2}) {
    FakeConfig c;
    c.chunk_interval_ms = 1;
    c.stream_fault = fault;
    FakeServer srv(c);
    Options o = base_options(srv.url());
    o.requests = 3;
    auto plan = make_plan(o);
    ASSERT_TRUE(plan.ok());
    auto r = run_load(o, *plan, 2);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->stream_errors, 3) << fault;
    EXPECT_EQ(r->failed, 3) << fault;
    EXPECT_EQ(r->connection_errors, 0) << fault;
    EXPECT_NE(r->last_error.find(fault == 1 ? "engine died" : "[DONE]"), std::string::npos) << r->last_error;
  }
}

TEST(BenchHttpRun, ManyClients) {
  FakeConfig c;
  c.chunk_interval_ms = 5;
  FakeServer srv(c);
  Options o = base_options(srv.url());
  o.requests = 128;
  o.gen_len = 4;
  auto plan = make_plan(o);
  ASSERT_TRUE(plan.ok());
  auto r = run_load(o, *plan, 64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->completed, 128) << r->last_error;
  EXPECT_EQ(r->gen_tokens, 128 * 4);
  EXPECT_EQ(srv.connections(), 1 + 64);
  EXPECT_GE(r->wall_s, 0.04);  // two rounds of 4 chunks 5 ms apart
}

// ---------------------------------------------------------------- CLI

TEST(BenchHttpCli, UsageErrorsExit2) {
  EXPECT_EQ(run_main({"--help"}).first, 0);
  const std::string ok = "http://127.0.0.1:1";
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {},
           {"--url", "127.0.0.1:8080"},
           {"--url", "https://127.0.0.1"},
           {"--url", ok, "--concurrency", "0"},
           {"--url", ok, "--concurrency", "1,,4"},
           {"--url", ok, "--concurrency", "2000"},
           {"--url", ok, "--concurrency", "4,"},
           {"--url", ok, "--requests", "0"},
           {"--url", ok, "--gen-len", "-1"},
           {"--url", ok, "--timeout", "nan"},
           {"--url", ok, "--timeout", "0"},
           {"--url", ok, "--prompt-len", "8", "--shared-prefix", "9"},
           {"--url", ok, "--endpoint", "embeddings"},
           {"--url", ok, "--api-key", "a\nb"},
           {"--url", ok, "-o", "xml"},
       })
    EXPECT_EQ(run_main(args).first, 2) << (args.size() > 1 ? args[1] + " " + args.back() : "");
}

TEST(BenchHttpCli, UnreachableServerExits1) {
  auto [rc, out] = run_main({"--url", "http://127.0.0.1:" + std::to_string(closed_port()), "--requests", "1"});
  EXPECT_EQ(rc, 1);
  EXPECT_TRUE(out.empty());
}

TEST(BenchHttpCli, JsonReportForAConcurrencyList) {
  FakeConfig c;
  c.chunk_interval_ms = 2;
  FakeServer srv(c);
  auto [rc, out] = run_main({"--url", srv.url() + "/v1", "--concurrency", "1,2", "--requests", "4", "--prompt-len",
                             "16", "--gen-len", "5", "-o", "json", "--warmup", "1"});
  ASSERT_EQ(rc, 0) << out;
  json j = json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["concurrency"], 1);
  EXPECT_EQ(j["runs"][1]["concurrency"], 2);
  for (const auto& r : j["runs"]) {
    for (const char* k : {"requests_per_s", "gen_tok_s", "prompt_tok_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                          "itl_p50_s", "itl_p90_s", "itl_p99_s", "e2e_p50_s"})
      EXPECT_TRUE(r[k].is_number()) << k;
    EXPECT_EQ(r["errors"], json::object());
    EXPECT_EQ(r["completed"], 4);
    EXPECT_EQ(r["gen_tokens"], 20);
    EXPECT_EQ(r["model"], "fake-model");
    EXPECT_EQ(r["prompt_len"], 16);
    EXPECT_EQ(r["gen_len"], 5);
    EXPECT_EQ(r["requests"], 4);
    EXPECT_GT(r["gen_tok_s"].get<double>(), 0);
  }
  EXPECT_EQ(srv.bodies().size(), 2u * (4 + 1));  // each run: 1 warmup + 4

  auto [rc2, text] = run_main({"--url", srv.url(), "--requests", "2", "--gen-len", "2"});
  ASSERT_EQ(rc2, 0);
  EXPECT_NE(text.find("concurrency 1: 2/2 requests ok"), std::string::npos) << text;
  EXPECT_NE(text.find("errors: none"), std::string::npos) << text;
}

// Two invocations with the same seed send other prompts (a fresh salt each:
// a second benchmark against the same server must not be answered from its
// prefix cache); the printed salt, given back, sends the same prompts again.
TEST(BenchHttpCli, EachInvocationSendsFreshPromptsUnlessTheSaltIsGiven) {
  FakeConfig c;
  FakeServer srv(c);
  const std::vector<std::string> base = {"--url", srv.url(), "--requests", "2", "--gen-len", "2", "--prompt-len",
                                         "16", "--no-calibrate", "-o", "json"};
  auto prompts_of = [&](size_t from) {
    std::vector<std::string> p;
    for (size_t k = from; k < srv.bodies().size(); ++k) p.push_back(srv.bodies()[k]["prompt"]);
    return p;
  };
  auto [rc1, out1] = run_main(base);
  ASSERT_EQ(rc1, 0) << out1;
  const auto first = prompts_of(0);
  ASSERT_EQ(first.size(), 2u);
  json j1 = json::parse(out1, nullptr, false);
  ASSERT_FALSE(j1.is_discarded()) << out1;
  const uint64_t salt = j1["prompt_salt"].get<uint64_t>();  // one concurrency level: the run object itself

  auto [rc2, out2] = run_main(base);
  ASSERT_EQ(rc2, 0) << out2;
  const auto second = prompts_of(2);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_NE(second[0], first[0]);
  EXPECT_NE(second[1], first[1]);

  std::vector<std::string> again = base;
  again.insert(again.end(), {"--prompt-salt", std::to_string(salt)});
  auto [rc3, out3] = run_main(again);
  ASSERT_EQ(rc3, 0) << out3;
  EXPECT_EQ(prompts_of(4), first);
  EXPECT_EQ(json::parse(out3)["prompt_salt"].get<uint64_t>(), salt);
}

}  // namespace
