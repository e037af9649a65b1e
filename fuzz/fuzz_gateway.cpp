// serval gateway's request path: raw HTTP bytes through the server's parser
// into Gateway::handle (auth, model lookup, key limits and budgets, the admin
// routes, body validation, the proxy). Its one upstream refuses connections
// (127.0.0.1:1), so proxied requests end in a 502 from a worker. Every input
// must get exactly one answer; an error answer must be an OpenAI-style JSON
// error body; nothing may throw or hang.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "gateway/gateway.h"
#include "server/http_server.h"

using namespace serval;

namespace {

class Channel : public http::ResponseChannel {
 public:
  void send(int status, std::string, std::string body, http::Headers) override { finish(status, body); }
  void start_stream(int status, std::string, http::Headers) override { finish(status, ""); }
  void write(std::string) override {}
  void end() override {}
  void on_disconnect(std::function<void()>) override {}
  bool disconnected() const override { return false; }
  bool done() const { return done_.load(); }

 private:
  void finish(int status, const std::string& body) {
    fuzz::require(!done_.exchange(true), "one answer per request");
    fuzz::require(status >= 200 && status < 600, "a status code: " + std::to_string(status));
    if (status >= 400) {
      auto j = nlohmann::json::parse(body, nullptr, false);
      fuzz::require(j.is_object() && j.contains("error") && j["error"].is_object() && j["error"]["message"].is_string(),
                    "an OpenAI error body for " + std::to_string(status) + ": " + body.substr(0, 200));
    }
  }
  std::atomic<bool> done_{false};
};

gateway::Gateway& the_gateway() {
  static std::unique_ptr<gateway::Gateway> g = [] {
    const std::string toml =
        "[server]\nmax_inflight = 4\n[retry]\nattempts = 1\nbackoff_ms = 0\n[breaker]\nfailures = 1000000\n"
        "[auth]\nadmin_key_sha256 = '" + gateway::sha256_hex("admin-key-0123456789") + "'\n"
        "[[models]]\nname = 'm'\naliases = ['a']\nupstreams = ['http://127.0.0.1:1']\nconnect_timeout_s = 1\n"
        "price_input_per_mtok = 1\nfallback = ['n']\n"
        "[[models]]\nname = 'n'\nupstreams = ['http://127.0.0.1:1']\n"
        "[[keys]]\nname = 'k'\nsha256 = '" + gateway::sha256_hex("user-key-0123456789") + "'\nrpm = 1e9\ntpm = 1e12\n"
        "models = ['m']\nbudget = 1e9\nbudget_period = 'day'\n";
    auto cfg = gateway::parse_gateway_config(toml, "fuzz.toml");
    if (!cfg.ok()) fuzz::die(cfg.status().message());
    auto gw = gateway::Gateway::create(*cfg);
    if (!gw.ok()) fuzz::die(gw.status().message());
    return std::move(*gw);
  }();
  return *g;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::HttpServerConfig cfg;
  cfg.max_header_bytes = 4096;
  cfg.max_body_bytes = 64 * 1024;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (int i = 0; i < 4 && !rest.empty(); ++i) {
    auto p = http::parse_http_request(rest, cfg);
    if (!p.request) return 0;
    rest.remove_prefix(p.consumed);
    auto ch = std::make_shared<Channel>();
    the_gateway().handle(std::move(*p.request), ch);
    // Proxied requests answer from a worker (a refused connection: quickly).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!ch->done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(50));
    fuzz::require(ch->done(), "an answer within 5 s");
  }
  return 0;
}
