// serval gateway: the router in front of replicas (src/gateway), and its helpers:
//   serval gateway --config gateway.toml [--host H] [--port P] [--check]
//   serval gateway hash-key KEY|-          SHA-256 of an API key, for the config file
//   serval gateway stub [--port P]         a fast OpenAI-compatible stub upstream (benchmarks)
//   serval gateway bench --url U ...       small non-streaming requests: latency and requests/s
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "common/stats.h"
#include "gateway/gateway.h"
#include "gateway/stub_upstream.h"
#include "gateway/upstream_client.h"

namespace serval::cli {

namespace {

int cmd_hash_key(int argc, char** argv) {
  const std::string cmd = "serval gateway hash-key";
  CLI::App app{"Prints the SHA-256 of an API key (for admin_key_sha256 and [[keys]] sha256 in gateway.toml)", cmd};
  std::string key;
  app.add_option("key", key, "the key, or - to read one line from stdin")->required();
  if (auto rc = parse(app, argc, argv)) return *rc;
  if (key == "-" && !std::getline(std::cin, key)) return fail(cmd, "no key on stdin");
  if (key.empty()) return fail(cmd, "the key is empty");
  std::printf("%s\n", gateway::sha256_hex(key).c_str());
  return 0;
}

int cmd_stub(int argc, char** argv) {
  const std::string cmd = "serval gateway stub";
  CLI::App app{"A fast OpenAI-compatible stub upstream with fixed short answers (for measuring the gateway)", cmd};
  std::string host = "127.0.0.1", model = "stub";
  int port = 8081, threads = 1, tokens = 4;
  app.add_option("--host", host, "address to listen on");
  app.add_option("--port", port, "port (0: any free one)")->check(CLI::Range(0, 65535));
  app.add_option("--model", model, "model id it reports");
  app.add_option("--threads", threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  app.add_option("--tokens", tokens, "completion tokens per answer")->check(CLI::Range(0, 100000));
  if (auto rc = parse(app, argc, argv)) return *rc;
  sigset_t sigs = block_stop_signals();
  auto stub = gateway::StubUpstream::start(host, (uint16_t)port, model, threads);
  if (!stub) return fail(cmd, stub.status().message(), 1);
  (*stub)->behaviour().completion_tokens = tokens;
  std::fprintf(stderr, "serval gateway stub: listening on %s\n", (*stub)->url().c_str());
  std::fflush(stderr);
  int sig = 0;
  sigwait(&sigs, &sig);
  (*stub)->stop();
  return 0;
}

int cmd_gateway_bench(int argc, char** argv) {
  const std::string cmd = "serval gateway bench";
  CLI::App app{"Sends small non-streaming completion requests and reports latency percentiles and requests/s", cmd};
  std::string url, model = "stub", key;
  int requests = 20000, concurrency = 16, warmup = 200;
  bool as_json = false;
  app.add_option("--url", url, "base URL (http://host:port)")->required();
  app.add_option("--model", model, "model name to send");
  app.add_option("--api-key", key, "Bearer key to send");
  app.add_option("-n,--requests", requests, "requests to send (after the warm-up)")->check(CLI::Range(1, 100000000));
  app.add_option("-c,--concurrency", concurrency, "client threads, each with its keep-alive connection")->check(CLI::Range(1, 4096));
  app.add_option("--warmup", warmup, "requests before measuring")->check(CLI::Range(0, 1000000));
  app.add_flag("--json", as_json, "one JSON object instead of the table");
  if (auto rc = parse(app, argc, argv)) return *rc;
  auto u = gateway::parse_upstream_url(url);
  if (!u) return fail(cmd, "--url: " + u.status().message());
  std::signal(SIGPIPE, SIG_IGN);
  gateway::ConnectionPool pool(*u, (size_t)concurrency);
  gateway::CallRequest req;
  req.target = "/v1/completions";
  req.headers = {{"content-type", "application/json"}};
  if (!key.empty()) req.headers.emplace_back("authorization", "Bearer " + key);
  req.body = nlohmann::json{{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 4}}.dump();

  std::atomic<int> next{0}, errors{0};
  const int total = warmup + requests;
  std::vector<std::vector<double>> lat(concurrency);
  std::atomic<int64_t> t_start_ns{0};
  auto worker = [&](int w) {
    std::string sink;
    for (;;) {
      const int i = next.fetch_add(1);
      if (i >= total) return;
      if (i == warmup) t_start_ns = std::chrono::steady_clock::now().time_since_epoch().count();
      gateway::CallTimeouts t;
      t.deadline = gateway::Clock::now() + std::chrono::seconds(30);
      const auto t0 = std::chrono::steady_clock::now();
      sink.clear();
      auto r = gateway::call(pool, req, t, [](int, const gateway::HeaderList&) { return true; },
                             [&](std::string_view c) { sink.append(c); return true; });
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r.kind != gateway::CallResult::Kind::ok || r.status != 200) {
        if (errors.fetch_add(1) < 3) std::fprintf(stderr, "%s: request failed: %s (status %d)\n", cmd.c_str(), r.error.c_str(), r.status);
        continue;
      }
      if (i >= warmup) lat[w].push_back(dt);
    }
  };
  std::vector<std::thread> ts;
  for (int w = 0; w < concurrency; ++w) ts.emplace_back(worker, w);
  for (auto& t : ts) t.join();
  const double wall = (std::chrono::steady_clock::now().time_since_epoch().count() - t_start_ns.load()) / 1e9;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  if (all.empty()) return fail(cmd, "every request failed", 1);
  std::sort(all.begin(), all.end());
  const double rps = (double)all.size() / wall;
  const double p50 = percentile(all, 50) * 1e3, p90 = percentile(all, 90) * 1e3, p99 = percentile(all, 99) * 1e3;
  if (as_json) {
    std::printf("%s\n", nlohmann::json{{"url", url}, {"requests", all.size()}, {"errors", errors.load()}, {"concurrency", concurrency},
                                       {"requests_per_s", rps}, {"latency_ms", {{"p50", p50}, {"p90", p90}, {"p99", p99}}}}
                            .dump()
                            .c_str());
  } else {
    std::printf("%-28s %8s %8s %10s %9s %9s %9s\n", "url", "conc", "errors", "req/s", "p50 ms", "p90 ms", "p99 ms");
    std::printf("%-28s %8d %8d %10.0f %9.3f %9.3f %9.3f\n", url.c_str(), concurrency, errors.load(), rps, p50, p90, p99);
  }
  return errors.load() > 0 ? 1 : 0;
}

}  // namespace

int cmd_gateway(int argc, char** argv) {
  if (argc >= 2) {
    const std::string sub = argv[1];
    if (sub == "hash-key") return cmd_hash_key(argc - 1, argv + 1);
    if (sub == "stub") return cmd_stub(argc - 1, argv + 1);
    if (sub == "bench") return cmd_gateway_bench(argc - 1, argv + 1);
  }
  const std::string cmd = "serval gateway";
  CLI::App app{"One OpenAI-compatible endpoint in front of many replicas: cache-aware routing, keys, quotas, budgets, "
               "retries, circuit breaking, fallback (also: serval gateway hash-key|stub|bench --help)",
               cmd};
  std::string config_path, host;
  int port = -1;
  bool check = false;
  app.add_option("-c,--config", config_path, "the TOML configuration (deploy/gateway/gateway.toml is an example)")->required();
  app.add_option("--host", host, "listen address (overrides [server] host)");
  app.add_option("--port", port, "listen port (overrides [server] port; 0: any free one)")->check(CLI::Range(0, 65535));
  app.add_flag("--check", check, "validate the configuration and exit");
  if (auto rc = parse(app, argc, argv)) return *rc;
  auto cfg = gateway::load_gateway_config(config_path);
  if (!cfg) return fail(cmd, cfg.status().message());
  if (!host.empty()) cfg->host = host;
  if (port >= 0) cfg->port = (uint16_t)port;
  if (check) {
    size_t n = 0;
    for (const auto& m : cfg->models) n += m.upstreams.size();
    std::printf("%s: ok (%zu models, %zu upstreams, %zu keys, policy %s)\n", config_path.c_str(), cfg->models.size(), n,
                cfg->keys.size(), std::string(gateway::policy_name(cfg->policy)).c_str());
    return 0;
  }

  sigset_t sigs = block_stop_signals();
  const double drain_timeout = cfg->drain_timeout_s;
  http::HttpServerConfig hc;
  hc.host = cfg->host;
  hc.port = cfg->port;
  hc.n_threads = cfg->threads;
  hc.max_body_bytes = cfg->max_body_bytes;
  hc.max_connections = (size_t)std::max(4096, cfg->max_inflight * 2);
  auto gw = gateway::Gateway::create(std::move(*cfg));
  if (!gw) return fail(cmd, gw.status().message(), 1);
  gateway::Gateway* g = gw->get();
  auto server = http::HttpServer::create(
      hc, [g](http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch) { g->handle(std::move(req), std::move(ch)); },
      [](int st, const std::string& msg) { return gateway::Gateway::error_body(st, msg); });
  if (!server) return fail(cmd, server.status().message(), 1);
  http::HttpServer* hs = server->get();
  g->start();

  SignalDrain signal_drain = drain_on_signal(
      sigs, cmd, drain_timeout,
      {[g] { return g->in_flight(); }, [g, hs] { g->begin_drain(), hs->stop_accepting(); }, [g] { g->cancel_all(); },
       [hs] { hs->stop(); }});
  const auto& c = g->config();
  size_t n_up = 0;
  for (const auto& m : c.models) n_up += m.upstreams.size();
  std::fprintf(stderr, "serval gateway: listening on http://%s:%u  %zu models, %zu upstreams, policy %s\n", c.host.c_str(),
               (unsigned)hs->port(), c.models.size(), n_up, std::string(gateway::policy_name(c.policy)).c_str());
  std::fflush(stderr);
  hs->run();
  const size_t left = g->in_flight();
  signal_drain.finish();
  g->stop();
  server->reset();
  gw->reset();
  return stopped_status(cmd, left);
}

}  // namespace serval::cli
