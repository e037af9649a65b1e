#include "gateway/gateway.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/sse_parser.h"
#include "gateway/key_limits.h"
#include "gateway/ledger.h"
#include "gateway/router.h"
#include "server/anthropic_api.h"
#include "server/api_translation.h"
#include "server/metrics.h"
#include "server/tracing.h"

namespace serval::gateway {

using json = nlohmann::json;
namespace m = serval::metrics;

namespace {

constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxErrorBody = 64u << 10;
constexpr size_t kMaxAnswerBody = 64u << 20;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A thread per request in flight, up to `max`; idle threads are reused.
class Workers {
 public:
  explicit Workers(size_t max) : max_(max) {}
  ~Workers() { stop(); }

  // False when `max` requests are already in flight or queued.
  bool submit(std::function<void()> f) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_ || busy_ + queue_.size() >= max_) return false;
    queue_.push_back(std::move(f));
    if (idle_ >= queue_.size()) cv_.notify_one();
    else if (threads_.size() < max_) threads_.emplace_back([this] { loop(); });
    else cv_.notify_one();
    return true;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping
      auto f = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      lk.unlock();
      f();
      lk.lock();
      --busy_;
    }
  }
  size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0, busy_ = 0;
  bool stop_ = false;
};

// A model's replicas. Static pools never change; a DNS-discovered pool is
// reconciled by the health thread (replicas come and go), so readers take a
// snapshot: a replica removed while a request uses it lives until that request ends.
struct ModelPool {
  const ModelRoute* route = nullptr;
  std::atomic<uint64_t> rr{0};
  std::atomic<int> queued{0};  // requests held for want of an available replica
  std::string upstream_model() const { return route->upstream_model.empty() ? route->name : route->upstream_model; }

  std::vector<std::shared_ptr<Replica>> snapshot() const {
    std::lock_guard<std::mutex> lk(mu);
    return replicas;
  }
  void set(std::vector<std::shared_ptr<Replica>> r) {
    std::lock_guard<std::mutex> lk(mu);
    replicas = std::move(r);
  }
  // The upstream's own /v1/models entry for this model (max_model_len, ...), once seen.
  nlohmann::json info() const {
    std::lock_guard<std::mutex> lk(mu);
    return info_;
  }
  void set_info(nlohmann::json j) {
    std::lock_guard<std::mutex> lk(mu);
    info_ = std::move(j);
  }

 private:
  mutable std::mutex mu;
  std::vector<std::shared_ptr<Replica>> replicas;
  nlohmann::json info_;
};

std::vector<Replica*> raw(const std::vector<std::shared_ptr<Replica>>& v) {
  std::vector<Replica*> out;
  out.reserve(v.size());
  for (const auto& r : v) out.push_back(r.get());
  return out;
}

// The APIs the gateway proxies. OpenAI's chat and completions stream bare
// `data:` events ending in [DONE]; Anthropic's Messages and OpenAI's Responses
// stream named events (`event:` lines) and always carry usage.
enum class Api { completions, chat, embeddings, messages, responses };

Api api_of(const std::string& path) {
  if (path == "/v1/chat/completions") return Api::chat;
  if (path == "/v1/embeddings") return Api::embeddings;
  if (path.rfind("/v1/messages", 0) == 0) return Api::messages;
  if (path == "/v1/responses") return Api::responses;
  return Api::completions;
}

// A named event that comes before any output (held back until output starts).
bool is_named_preamble(Api api, std::string_view event) {
  if (api == Api::messages) return event == "message_start" || event == "content_block_start" || event == "ping";
  if (api == Api::responses)
    return event == "response.created" || event == "response.in_progress" || event == "response.output_item.added" ||
           event == "response.content_part.added";
  return false;
}

// The named event that ends a complete stream.
bool is_named_end(Api api, std::string_view event) {
  if (api == Api::messages) return event == "message_stop";
  return event == "response.completed" || event == "response.incomplete" || event == "response.failed";
}

// The text routing keys on: what the replica's prefix cache will see first.
std::string prompt_text(const json& body) {
  std::string out;
  auto add_content = [&](const json& c) {
    if (c.is_string()) out += c.get_ref<const std::string&>();
    else if (c.is_array())
      for (const auto& part : c)
        if (part.is_object())
          if (auto t = part.find("text"); t != part.end() && t->is_string()) out += t->get_ref<const std::string&>();
  };
  // Anthropic's system prompt and the Responses API's instructions come first.
  for (const char* field : {"system", "instructions"})
    if (auto sys = body.find(field); sys != body.end()) {
      add_content(*sys);
      out += '\n';
    }
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array()) {
    // The Responses API's input may be a list of messages too.
    auto in = body.find("input");
    if (in != body.end() && in->is_array() && !in->empty() && (*in)[0].is_object()) msgs = in;
  }
  if (msgs != body.end() && msgs->is_array()) {
    for (const auto& msg : *msgs) {
      if (!msg.is_object()) continue;
      if (auto r = msg.find("role"); r != msg.end() && r->is_string()) out += r->get_ref<const std::string&>();
      out += '\n';
      if (auto c = msg.find("content"); c != msg.end()) add_content(*c);
      out += '\n';
    }
    return out;
  }
  for (const char* field : {"prompt", "input"}) {
    auto p = body.find(field);
    if (p == body.end()) continue;
    if (p->is_string()) return p->get<std::string>();
    if (p->is_array() && !p->empty()) {
      const json& first = (*p)[0];
      if (first.is_string()) return first.get<std::string>();
      // Token ids: their decimal text is as good a key as characters.
      for (const auto& t : *p) {
        if (!t.is_number_integer()) break;
        out += std::to_string(t.get<int64_t>());
        out += ' ';
      }
      return out;
    }
  }
  return out;
}

// Usage in any of the proxied APIs' shapes: OpenAI's prompt/completion_tokens,
// Anthropic's and the Responses API's input/output_tokens; at the top level or
// inside `message` (message_start) or `response` (response.completed).
void read_usage(const json& j, int64_t* prompt, int64_t* completion) {
  const json* holder = &j;
  for (const char* inner : {"message", "response"})
    if (auto m = j.find(inner); m != j.end() && m->is_object() && m->contains("usage")) holder = &*m;
  auto u = holder->find("usage");
  if (u == holder->end() || !u->is_object()) return;
  for (const char* k : {"prompt_tokens", "input_tokens"})
    if (auto p = u->find(k); p != u->end() && p->is_number_integer()) *prompt = p->get<int64_t>();
  // Anthropic counts prompt tokens served from or written to its cache apart from input_tokens.
  if (u->contains("input_tokens"))
    for (const char* k : {"cache_read_input_tokens", "cache_creation_input_tokens"})
      if (auto p = u->find(k); p != u->end() && p->is_number_integer() && *prompt >= 0) *prompt += p->get<int64_t>();
  for (const char* k : {"completion_tokens", "output_tokens"})
    if (auto c = u->find(k); c != u->end() && c->is_number_integer()) *completion = c->get<int64_t>();
}

// An SSE event that carries no output yet: a chat delta with only a role (or
// empty content) and no finish reason. Such events may be held back.
bool is_preamble(std::string_view data) {
  if (data.find("\"choices\"") == std::string_view::npos) return false;
  json j = json::parse(data, nullptr, false);
  if (!j.is_object() || j.contains("error") || (j.contains("usage") && !j["usage"].is_null())) return false;
  auto ch = j.find("choices");
  if (ch == j.end() || !ch->is_array() || ch->empty()) return false;
  for (const auto& c : *ch) {
    if (!c.is_object()) return false;
    if (auto f = c.find("finish_reason"); f != c.end() && !f->is_null()) return false;
    if (auto t = c.find("text"); t != c.end() && !(t->is_string() && t->get_ref<const std::string&>().empty())) return false;
    auto d = c.find("delta");
    if (d == c.end()) {
      if (c.find("text") == c.end()) return false;
      continue;
    }
    if (!d->is_object()) return false;
    for (const auto& [k, v] : d->items()) {
      if (k == "role") continue;
      if (k == "content" && (v.is_null() || (v.is_string() && v.get_ref<const std::string&>().empty()))) continue;
      return false;
    }
  }
  return true;
}

// One SSE event carrying `data` (a data: field per line of it), named when `event` is not empty.
std::string sse_event(std::string_view data, std::string_view event = {}) {
  std::string ev;
  ev.reserve(data.size() + event.size() + 16);
  if (!event.empty()) {
    ev += "event: ";
    ev += event;
    ev += '\n';
  }
  size_t pos = 0;
  for (;;) {
    const size_t nl = data.find('\n', pos);
    ev += "data: ";
    ev += data.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    ev += '\n';
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  ev += '\n';
  return ev;
}

std::string header_value(const HeaderList& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (k == name) return v;
  return "";
}

std::string random_id() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s = "gw-";
  for (int i = 0; i < 24; ++i) s.push_back(hex[rng() & 15]);
  return s;
}

double jitter(double max_ms) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return std::uniform_real_distribution<double>(0, std::max(0.0, max_ms))(rng);
}

// Seconds until the budget period that contains now ends (UTC).
double seconds_to_period_end(BudgetPeriod p) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t tt = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
  if (p == BudgetPeriod::day) tm.tm_mday += 1;
  else if (p == BudgetPeriod::month) {
    tm.tm_mday = 1;
    tm.tm_mon += 1;
  } else return 0;
  return std::difftime(timegm(&tm), tt);
}

std::string period_name(BudgetPeriod p) {
  return p == BudgetPeriod::day ? "day" : p == BudgetPeriod::month ? "month" : "total";
}

}  // namespace

struct Gateway::Impl {
  GatewayConfig cfg;
  RoutingConfig routing;
  std::unique_ptr<Ledger> ledger;
  KeyRegistry keys;
  std::vector<std::unique_ptr<ModelPool>> pools;
  std::unordered_map<std::string, int> by_name;  // names and aliases -> pool
  Workers workers;
  std::atomic<bool> draining{false};
  std::atomic<size_t> inflight{0};
  const Clock::time_point started = Clock::now();

  std::mutex cancels_mu;
  std::set<std::shared_ptr<CallCancel>> cancels;

  std::thread health_thread;
  std::mutex health_mu;
  std::condition_variable health_cv;
  bool health_stop = false;

  // Metrics.
  m::Family<m::Counter> requests_total{"serval_gateway_requests_total", "Requests answered, by model and HTTP status."};
  m::Family<m::Histogram> request_seconds{"serval_gateway_request_duration_seconds",
                                          "Whole request as the client saw it (first attempt to last byte).",
                                          m::latency_buckets()};
  m::Family<m::Histogram> overhead_seconds{"serval_gateway_overhead_seconds",
                                           "Time the gateway added: the request's duration minus the upstream call it relayed.",
                                           m::exponential_buckets(1e-5, 2, 20)};
  m::Family<m::Histogram> upstream_seconds{"serval_gateway_upstream_latency_seconds",
                                           "Upstream time to response header, by upstream.", m::latency_buckets()};
  m::Family<m::Counter> upstream_total{"serval_gateway_upstream_requests_total",
                                       "Upstream attempts by upstream and outcome (status code or error kind)."};
  m::Family<m::Counter> breaker_opened_total{"serval_gateway_breaker_opened_total",
                                             "Times an upstream's circuit breaker opened (consecutive failures or a failed probe)."};
  m::Family<m::Counter> retries_total{"serval_gateway_retries_total", "Attempts after the first, by model."};
  m::Family<m::Counter> fallbacks_total{"serval_gateway_fallbacks_total", "Moves to a fallback model, by from and to."};
  m::Family<m::Counter> routing_total{"serval_gateway_routing_decisions_total", "Routing decisions by model, policy and reason."};
  m::Family<m::Histogram> prefix_match_chars{"serval_gateway_prefix_match_chars",
                                             "Prompt characters the chosen replica already held (prefix index), by model.",
                                             m::exponential_buckets(16, 2, 14)};
  m::Family<m::Counter> rejected_total{"serval_gateway_rejected_total", "Requests refused by the gateway, by reason."};
  m::Family<m::Counter> key_spend_total{"serval_gateway_key_spend_total", "Spend recorded in the ledger, by key (currency)."};
  m::Family<m::Counter> key_tokens_total{"serval_gateway_key_tokens_total", "Tokens recorded in the ledger, by key and kind."};
  m::Family<m::Counter> stream_errors_total{"serval_gateway_stream_errors_total",
                                            "Streams ended with an error event after they had started, by model."};

  Impl(GatewayConfig c) : cfg(std::move(c)), workers((size_t)cfg.max_inflight) {
    routing.policy = cfg.policy;
    routing.cache_threshold = cfg.cache_threshold;
    routing.balance_abs_threshold = cfg.balance_abs_threshold;
    routing.balance_rel_threshold = cfg.balance_rel_threshold;
    const BreakerConfig bc{cfg.breaker_failures, cfg.breaker_open_s, cfg.breaker_max_open_s};
    for (const auto& route : cfg.models) {
      auto p = std::make_unique<ModelPool>();
      p->route = &route;
      std::vector<std::shared_ptr<Replica>> rs;
      if (!route.discover_dns)
        for (const auto& u : route.upstreams) rs.push_back(std::make_shared<Replica>(u, cfg.max_tree_chunks, bc));
      p->set(std::move(rs));
      by_name[route.name] = (int)pools.size();
      for (const auto& a : route.aliases) by_name[a] = (int)pools.size();
      pools.push_back(std::move(p));
    }
  }

  // ---- auth ----

  enum class Who { anonymous, key, admin, invalid };
  struct Caller {
    Who who = Who::anonymous;
    std::shared_ptr<KeyState> key;
    std::string name() const { return who == Who::admin ? "admin" : key ? key->cfg.name : ""; }
  };
  Caller identify(const http::HttpRequest& req) const {
    Caller c;
    std::string token = req.header("authorization");
    if (token.size() > 7 && (token.compare(0, 7, "Bearer ") == 0 || token.compare(0, 7, "bearer ") == 0)) token = token.substr(7);
    else token.clear();
    if (token.empty()) token = req.header("x-api-key");
    if (token.empty()) return c;
    const std::string h = sha256_hex(token);
    if (!cfg.admin_key_sha256.empty() && h == cfg.admin_key_sha256) {
      c.who = Who::admin;
      return c;
    }
    c.key = keys.find_by_hash(h);
    c.who = c.key ? Who::key : Who::invalid;
    return c;
  }

  void reply_error(http::ResponseChannel& ch, int status, const std::string& msg, const std::string& code,
                   const std::string& reason, http::Headers extra = {}) {
    rejected_total.with({{"reason", reason}}).inc();
    ch.send(status, "application/json", Gateway::error_body(status, msg, code), std::move(extra));
  }

  // ---- routes answered on the I/O thread ----

  void models(http::ResponseChannel& ch) {
    json data = json::array();
    const auto now = Clock::now();
    for (const auto& p : pools) {
      int up = 0;
      const auto snap = p->snapshot();
      for (const auto& r : snap) up += r->can_admit(now) ? 1 : 0;
      auto entry = [&](const std::string& id, const std::string& parent) {
        json e = {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "serval-gateway"},
                  {"root", p->upstream_model()}, {"replicas", snap.size()}, {"replicas_available", up}};
        if (!parent.empty()) e["parent"] = parent;
        // Merged from the replicas' own listing: what a client sizes requests by.
        const json info = p->info();
        if (info.is_object())
          for (const char* k : {"max_model_len", "context_length", "owned_by"})
            if (auto it = info.find(k); it != info.end()) e[k == std::string("owned_by") ? "upstream_owned_by" : k] = *it;
        if (!p->route->fallback.empty()) e["fallback"] = p->route->fallback;
        data.push_back(std::move(e));
      };
      entry(p->route->name, "");
      for (const auto& a : p->route->aliases) entry(a, p->route->name);
    }
    ch.send(200, "application/json", json{{"object", "list"}, {"data", std::move(data)}}.dump());
  }

  std::string metrics_text() {
    m::ExpositionWriter w;
    for (auto* f : {&requests_total, &upstream_total, &breaker_opened_total, &retries_total, &fallbacks_total, &routing_total, &rejected_total,
                    &key_spend_total, &key_tokens_total, &stream_errors_total})
      w.family(*f);
    for (auto* f : {&request_seconds, &overhead_seconds, &upstream_seconds, &prefix_match_chars}) w.family(*f);
    const auto now = Clock::now();
    w.header("serval_gateway_requests_in_flight", "Requests being proxied.", m::Type::gauge);
    w.sample("serval_gateway_requests_in_flight", "", (double)inflight.load());
    struct G {
      const char* name;
      const char* help;
      std::function<double(Replica&)> f;
    };
    const G gauges[] = {
        {"serval_gateway_upstream_healthy", "1 when the upstream's last health check passed.", [](Replica& r) { return r.healthy() ? 1.0 : 0.0; }},
        {"serval_gateway_breaker_state", "Circuit breaker: 0 closed, 1 open, 2 half-open.",
         [now](Replica& r) { return (double)(int)r.breaker_state(now); }},
        {"serval_gateway_upstream_in_flight", "Requests this gateway has in flight at the upstream.", [](Replica& r) { return (double)r.inflight.load(); }},
        {"serval_gateway_upstream_load", "Load as routing sees it (in flight, or running + waiting scraped).", [](Replica& r) { return r.load(); }},
        {"serval_gateway_upstream_kv_usage_ratio", "The upstream's KV-cache usage, scraped.", [](Replica& r) { return r.kv_usage(); }},
        {"serval_gateway_prefix_index_chunks", "Chunks in the upstream's prefix index.", [](Replica& r) { return (double)r.prefix().size(); }},
    };
    for (const auto& g : gauges) {
      w.header(g.name, g.help, m::Type::gauge);
      for (const auto& p : pools)
        for (const auto& r : p->snapshot())
          w.sample(g.name, m::render_labels({{"model", p->route->name}, {"upstream", r->url()}}), g.f(*r));
    }
    w.header("serval_gateway_requests_queued", "Requests held while no replica of their model is available (scale from zero).",
             m::Type::gauge);
    for (const auto& p : pools) w.sample("serval_gateway_requests_queued", m::render_labels({{"model", p->route->name}}), (double)p->queued.load());
    w.header("serval_gateway_replicas", "Replicas in the model's pool (DNS discovery changes it).", m::Type::gauge);
    for (const auto& p : pools) w.sample("serval_gateway_replicas", m::render_labels({{"model", p->route->name}}), (double)p->snapshot().size());
    w.header("serval_gateway_uptime_seconds", "Seconds since the gateway started.", m::Type::gauge);
    w.sample("serval_gateway_uptime_seconds", "", since(started));
    return w.take();
  }

  json usage_json(const std::string& key, const std::string& from, const std::string& to) {
    json rows = json::array();
    double total = 0;
    int64_t pt = 0, ct = 0, n = 0;
    for (const auto& r : ledger->usage(key, from, to)) {
      rows.push_back({{"key", r.key}, {"model", r.model}, {"day", r.day}, {"requests", r.requests},
                      {"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens}, {"spend", r.spend}});
      total += r.spend;
      pt += r.prompt_tokens;
      ct += r.completion_tokens;
      n += r.requests;
    }
    return {{"object", "gateway.usage"}, {"data", std::move(rows)},
            {"total", {{"requests", n}, {"prompt_tokens", pt}, {"completion_tokens", ct}, {"spend", total}}}};
  }

  static std::string query_param(const std::string& q, const std::string& name) {
    size_t pos = 0;
    while (pos <= q.size()) {
      size_t amp = q.find('&', pos);
      if (amp == std::string::npos) amp = q.size();
      std::string_view kv(q.data() + pos, amp - pos);
      if (kv.substr(0, name.size() + 1) == name + "=") return std::string(kv.substr(name.size() + 1));
      pos = amp + 1;
    }
    return "";
  }

  static bool valid_day(const std::string& d) {
    if (d.empty()) return true;
    if (d.size() != 10 || d[4] != '-' || d[7] != '-') return false;
    for (int i : {0, 1, 2, 3, 5, 6, 8, 9})
      if (d[i] < '0' || d[i] > '9') return false;
    return true;
  }

  json key_json(const KeyConfig& k, bool from_config) {
    const std::string today = utc_day(std::chrono::system_clock::now());
    return {{"name", k.name}, {"rpm", k.rpm}, {"tpm", k.tpm}, {"max_parallel", k.max_parallel}, {"models", k.models},
            {"budget", k.budget}, {"budget_period", period_name(k.budget_period)},
            {"spend", ledger->spend(k.name, k.budget_period, today)}, {"source", from_config ? "config" : "api"}};
  }

  void admin(const http::HttpRequest& req, http::ResponseChannel& ch, const Caller& who) {
    const bool is_admin = who.who == Who::admin;
    if (req.path == "/v1/gateway/usage" && req.method == "GET") {
      std::string key = query_param(req.query, "key");
      const std::string from = query_param(req.query, "from"), to = query_param(req.query, "to");
      if (!valid_day(from) || !valid_day(to))
        return reply_error(ch, 400, "from/to: expected a UTC day YYYY-MM-DD", "invalid_value", "bad_request");
      if (!is_admin) {
        if (who.who != Who::key) return reply_error(ch, 401, "an API key is required (Authorization: Bearer KEY)", "invalid_api_key", "unauthorized");
        if (!key.empty() && key != who.key->cfg.name)
          return reply_error(ch, 403, "a key may read only its own usage", "forbidden", "forbidden");
        key = who.key->cfg.name;
      }
      return ch.send(200, "application/json", usage_json(key, from, to).dump());
    }
    if (!is_admin) {
      if (cfg.admin_key_sha256.empty()) return reply_error(ch, 404, "admin routes are off ([auth] admin_key_sha256 is not set)", "not_found", "not_found");
      return reply_error(ch, 401, "the admin key is required for " + req.path, "invalid_api_key", "unauthorized");
    }
    if (req.path == "/v1/gateway/keys" && req.method == "GET") {
      json data = json::array();
      for (const auto& k : keys.all()) data.push_back(key_json(k->cfg, k->from_config));
      return ch.send(200, "application/json", json{{"object", "list"}, {"data", std::move(data)}}.dump());
    }
    if (req.path == "/v1/gateway/keys" && req.method == "POST") {
      if (json_nesting_depth(req.body) > kMaxJsonDepth) return reply_error(ch, 400, "JSON nested too deeply", "invalid_json", "bad_request");
      json b = json::parse(req.body, nullptr, false);
      if (b.is_discarded() || !b.is_object()) return reply_error(ch, 400, "body: expected a JSON object", "invalid_json", "bad_request");
      // Reuse the config file's validation: the body's fields are a [[keys]] table.
      std::string toml = "[[models]]\nname='-'\nupstreams=['http://x:1']\n[[keys]]\n";
      std::string key_plain;
      for (auto& [k, v] : b.items()) {
        if (k == "key") {
          if (!v.is_string() || v.get<std::string>().size() < 16 || v.get<std::string>().size() > 256)
            return reply_error(ch, 400, "key: expected a string of 16 to 256 characters", "invalid_value", "bad_request");
          key_plain = v.get<std::string>();
          continue;
        }
        if (k == "name" || k == "budget_period") {
          if (!v.is_string()) return reply_error(ch, 400, k + ": expected a string", "invalid_value", "bad_request");
          toml += k + " = " + json(v).dump() + "\n";
        } else if (k == "models") {
          if (!v.is_array()) return reply_error(ch, 400, "models: expected an array of model names", "invalid_value", "bad_request");
          for (const auto& mname : v)
            if (!mname.is_string() || !by_name.count(mname.get<std::string>()))
              return reply_error(ch, 400, "models: no model named " + mname.dump(), "invalid_value", "bad_request");
          toml += "models = []\n";
        } else if (k == "rpm" || k == "tpm" || k == "max_parallel" || k == "budget") {
          if (!v.is_number()) return reply_error(ch, 400, k + ": expected a number", "invalid_value", "bad_request");
          toml += k + " = " + v.dump() + "\n";
        } else {
          return reply_error(ch, 400, k + ": unknown field", "invalid_value", "bad_request");
        }
      }
      if (key_plain.empty()) {
        std::random_device rd;
        static const char* al = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        key_plain = "sk-serval-";
        for (int i = 0; i < 40; ++i) key_plain.push_back(al[rd() % 62]);
      }
      toml += "sha256 = '" + sha256_hex(key_plain) + "'\n";
      auto parsed = parse_gateway_config(toml, "body");
      if (!parsed) {
        std::string msg = parsed.status().message();
        if (auto p = msg.find("keys[0]."); p != std::string::npos) msg = msg.substr(p + 8);
        return reply_error(ch, 400, msg, "invalid_value", "bad_request");
      }
      KeyConfig k = parsed->keys[0];
      if (auto mm = b.find("models"); mm != b.end()) k.models = mm->get<std::vector<std::string>>();
      if (keys.find_by_name(k.name)) return reply_error(ch, 409, "a key named '" + k.name + "' exists", "conflict", "conflict");
      if (keys.find_by_hash(k.sha256)) return reply_error(ch, 409, "that key exists already", "conflict", "conflict");
      if (auto st = ledger->put_key(k); !st.ok()) return reply_error(ch, 409, st.message(), "conflict", "conflict");
      keys.put(k, false);
      json out = key_json(k, false);
      out["key"] = key_plain;  // shown once; only the hash is stored
      return ch.send(201, "application/json", out.dump());
    }
    const std::string prefix = "/v1/gateway/keys/";
    if (req.path.compare(0, prefix.size(), prefix) == 0 && req.method == "DELETE") {
      const std::string name = req.path.substr(prefix.size());
      auto k = keys.find_by_name(name);
      if (!k) return reply_error(ch, 404, "no key named '" + name + "'", "not_found", "not_found");
      if (k->from_config) return reply_error(ch, 409, "key '" + name + "' is declared in the config file; remove it there", "conflict", "conflict");
      if (auto st = ledger->delete_key(name); !st.ok()) return reply_error(ch, 404, st.message(), "not_found", "not_found");
      keys.remove(name);
      return ch.send(200, "application/json", json{{"deleted", true}, {"name", name}}.dump());
    }
    reply_error(ch, 404, "no route " + req.method + " " + req.path, "not_found", "not_found");
  }

  // ---- proxying (a worker thread) ----

  struct Ctx {
    http::HttpRequest req;
    std::shared_ptr<http::ResponseChannel> ch;
    std::string id;
    Clock::time_point start, deadline;
    Caller caller;
    json body;
    bool stream = false, client_usage = false;
    Api api = Api::completions;
    std::shared_ptr<http::ResponseChannel> err_ch;  // the gateway's own errors, in the route's error shape
    int pool = 0;
    std::vector<uint64_t> hashes;
    tracing::TraceContext trace;
    std::shared_ptr<CallCancel> cancel;
    double upstream_s = 0;  // time inside the relayed upstream call
  };

  enum class Outcome { delivered, retry, fallback };

  struct Attempt {
    Outcome outcome = Outcome::retry;
    int status = 0;
    std::string error_body;      // the upstream's answer (non-200), for the client if nothing else works
    std::string retry_after;     // its Retry-After header
    std::string message;         // why it failed
    int64_t prompt_tokens = 0, completion_tokens = 0;
    bool counted = false;        // usage known (or partial) and to be recorded
    // The last bytes to the client (the final event and the end, or the whole
    // answer). They go after finish() has charged the request, so a client
    // that sends its next request the moment this one ends is judged on the
    // spend and tokens of this one.
    std::function<void()> reply;
  };

  Attempt attempt(Ctx& c, ModelPool& p, Replica& r) {
    Attempt a;
    json body = c.body;
    body["model"] = p.upstream_model();
    if (c.stream && (c.api == Api::chat || c.api == Api::completions)) {
      json so = body.value("stream_options", json::object());
      if (!so.is_object()) so = json::object();
      so["include_usage"] = true;
      body["stream_options"] = so;
    }
    CallRequest req;
    req.method = "POST";
    req.target = c.req.path;
    req.body = body.dump();
    req.headers = {{"content-type", "application/json"}, {"x-request-id", c.id},
                   {"traceparent", tracing::format_traceparent(c.trace.trace_id, tracing::random_span_id(), c.trace.flags)}};
    if (c.stream) req.headers.emplace_back("accept", "text/event-stream");
    if (!p.route->api_key.empty()) req.headers.emplace_back("authorization", "Bearer " + p.route->api_key);

    CallTimeouts t;
    t.deadline = c.deadline;
    t.connect_s = p.route->connect_timeout_s;
    t.first_byte_s = p.route->first_byte_timeout_s;
    t.idle_s = p.route->idle_timeout_s;

    // A stream is committed to the client (its 200 header sent) only at the
    // first event that carries output: until then a failure is retried
    // elsewhere and the client never knows. Preamble events (a role-only chat
    // delta) wait in `pending`.
    bool committed = false, done = false, stopped_by_client = false, stream_ok = false;
    std::vector<std::string> pending;
    std::string held_end;
    int status = 0;
    std::string content_type = "application/json", buf, retry_after;
    SseParser sse;
    int64_t content_events = 0;
    const auto t0 = Clock::now();
    ++r.inflight;
    auto on_header = [&](int st, const HeaderList& h) {
      status = st;
      upstream_seconds.with({{"upstream", r.url()}}).observe(since(t0));
      content_type = header_value(h, "content-type");
      retry_after = header_value(h, "retry-after");
      if (content_type.empty()) content_type = "application/json";
      stream_ok = st == 200 && c.stream;
      return true;
    };
    auto commit = [&] {
      committed = true;
      c.ch->start_stream(200, "text/event-stream", {{"x-request-id", c.id}, {"cache-control", "no-cache"}});
      for (auto& ev : pending) c.ch->write(std::move(ev));
      pending.clear();
    };
    const bool named = c.api == Api::messages || c.api == Api::responses;
    // The usage an event carries, into `a`; the parsed event (discarded when it has none).
    auto take_usage = [&](std::string_view data) {
      json j;
      if (data.find("\"usage\"") == std::string_view::npos) return json(json::value_t::discarded);
      j = json::parse(data, nullptr, false);
      if (j.is_object()) {
        int64_t pt = -1, ct = -1;
        read_usage(j, &pt, &ct);
        if (pt >= 0) a.prompt_tokens = pt;
        if (ct >= 0) a.completion_tokens = ct, a.counted = true;
      }
      return j;
    };
    auto on_event = [&](std::string_view event, std::string_view data) {
      if (named) {
        // Forwarded as they come (usage read on the way); output commits the stream.
        if (!committed && is_named_preamble(c.api, event)) {
          pending.push_back(sse_event(data, event));
        } else if (is_named_end(c.api, event)) {
          if (!committed) commit();
          held_end = sse_event(data, event);  // written by reply, after the accounting
        } else {
          if (!committed) commit();
          c.ch->write(sse_event(data, event));
        }
        if (is_named_end(c.api, event)) done = true;
        if (event == "content_block_delta" || event == "response.output_text.delta") ++content_events;
        take_usage(data);
        return;
      }
      if (!committed) {
        if (data != "[DONE]" && is_preamble(data)) {
          pending.push_back(sse_event(data));
          return;
        }
        commit();
      }
      if (data == "[DONE]") {
        done = true;
        held_end = "data: [DONE]\n\n";  // written by reply, after the accounting
        return;
      }
      bool forward = true;
      json j = take_usage(data);
      if (j.is_object()) {
        // The gateway asked for usage for its ledger: the client gets it only if it asked too.
        auto ch = j.find("choices");
        if (!c.client_usage && ch != j.end() && ch->is_array() && ch->empty()) forward = false;
        else if (!c.client_usage && j.contains("usage") && !j["usage"].is_null()) {
          j.erase("usage");
          c.ch->write("data: " + j.dump() + "\n\n");
          forward = false;
          ++content_events;
        }
      } else {
        ++content_events;
      }
      if (forward) c.ch->write(sse_event(data));
    };
    auto on_body = [&](std::string_view chunk) {
      if (c.ch->disconnected()) {
        stopped_by_client = true;
        return false;
      }
      if (stream_ok) return sse.feed(chunk, on_event);
      const size_t cap = status == 200 ? kMaxAnswerBody : kMaxErrorBody;
      buf.append(chunk.substr(0, cap - std::min(cap, buf.size())));
      return buf.size() < cap || status != 200;
    };
    const CallResult res = call(r.pool(), req, t, on_header, on_body, c.cancel.get());
    --r.inflight;
    c.upstream_s += since(t0);
    const auto now = Clock::now();
    const std::string outcome_label =
        res.kind == CallResult::Kind::ok ? std::to_string(res.status) : std::string(call_kind_name(res.kind));
    upstream_total.with({{"upstream", r.url()}, {"outcome", outcome_label}}).inc();

    if (res.kind == CallResult::Kind::cancelled || stopped_by_client || (committed && c.ch->disconnected())) {
      // The client went away (or the drain deadline passed): nothing more to send.
      r.on_success();
      a.outcome = Outcome::delivered;
      a.status = 499;
      if (committed && !a.counted) a.completion_tokens = content_events, a.counted = true;
      return a;
    }
    if (res.kind == CallResult::Kind::ok) {
      a.status = res.status;
      if (res.status == 200) {
        r.on_success();
        r.prefix().insert(c.hashes);
        a.outcome = Outcome::delivered;
        if (c.stream) {
          if (!committed) commit();
          if (!done) {
            // A 200 stream that ended without [DONE]: the upstream gave up mid-way.
            stream_error(c, p, "the upstream " + r.url() + " ended the stream before its end");
          }
          if (!a.counted) a.completion_tokens = content_events, a.counted = true;
          a.reply = [&c, end = std::move(held_end)]() mutable {
            if (!end.empty()) c.ch->write(std::move(end));
            c.ch->end();
          };
        } else {
          json j = json::parse(buf, nullptr, false);
          if (j.is_object()) {
            int64_t pt = 0, ct = 0;
            read_usage(j, &pt, &ct);
            a.prompt_tokens = pt;
            a.completion_tokens = ct;
            a.counted = true;
          }
          a.reply = [&c, ct = std::move(content_type), b = std::move(buf)]() mutable {
            c.ch->send(200, ct, std::move(b), {{"x-request-id", c.id}});
          };
        }
        return a;
      }
      a.error_body = buf;
      a.retry_after = retry_after;
      a.message = "HTTP " + std::to_string(res.status) + " from " + r.url();
      if (res.status >= 500) {
        failure(r, now);
        a.outcome = Outcome::retry;
      } else if (res.status == 429 || res.status == 408) {
        r.on_success();  // alive, only busy
        a.outcome = Outcome::retry;
      } else if (res.status == 400 && buf.find("context_length_exceeded") != std::string::npos) {
        r.on_success();
        a.outcome = Outcome::fallback;
      } else {
        r.on_success();
        a.outcome = Outcome::delivered;
        a.reply = [&c, st = res.status, ct = std::move(content_type), b = std::move(buf)]() mutable {
          c.ch->send(st, ct, std::move(b), {{"x-request-id", c.id}});
        };
      }
      return a;
    }
    // Connection error, timeout or a body that broke off.
    failure(r, now);
    a.message = std::string(call_kind_name(res.kind)) + " error: " + res.error;
    if (committed) {
      stream_error(c, p, "the upstream " + r.url() + " failed mid-stream (" + res.error + ")");
      a.reply = [&c] { c.ch->end(); };
      a.outcome = Outcome::delivered;
      a.status = 502;
      if (!a.counted) a.completion_tokens = content_events, a.counted = true;
      return a;
    }
    a.outcome = Outcome::retry;
    return a;
  }

  void failure(Replica& r, Clock::time_point now) {
    if (r.on_failure(now)) breaker_opened_total.with({{"upstream", r.url()}}).inc();
  }

  void stream_error(Ctx& c, ModelPool& p, const std::string& msg) {
    stream_errors_total.with({{"model", p.route->name}}).inc();
    if (c.api == Api::messages) {  // Anthropic's error event
      json e = {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", msg}}}};
      c.ch->write(sse_event(e.dump(), "error"));
    } else if (c.api == Api::responses) {  // the Responses API's error event
      json e = {{"type", "error"}, {"code", "upstream_stream_broken"}, {"message", msg}, {"param", nullptr}};
      c.ch->write(sse_event(e.dump(), "error"));
    } else {
      json e = {{"error", {{"message", msg}, {"type", "upstream_error"}, {"code", "upstream_stream_broken"}}}};
      c.ch->write("data: " + e.dump() + "\n\n");
    }
  }

  void proxy(Ctx& c) {
    std::vector<int> chain{c.pool};
    for (const auto& f : pools[c.pool]->route->fallback) chain.push_back(by_name.at(f));
    Attempt last;
    bool delivered = false;
    int answered_pool = c.pool;
    int attempts_total = 0;
    for (size_t ci = 0; ci < chain.size() && !delivered; ++ci) {
      ModelPool& p = *pools[chain[ci]];
      if (ci > 0) fallbacks_total.with({{"from", pools[chain[ci - 1]]->route->name}, {"to", p.route->name}}).inc();
      std::vector<const Replica*> tried;
      for (int att = 0; att < cfg.retry_attempts && !delivered; ++att) {
        if (Clock::now() >= c.deadline) break;
        if (c.ch->disconnected()) {
          Attempt gone;
          gone.outcome = Outcome::delivered;
          gone.status = 499;
          return finish(c, p, gone, true);
        }
        auto now = Clock::now();
        auto snap = p.snapshot();
        std::vector<Replica*> ptrs = raw(snap);
        RouteChoice choice = choose_replica(ptrs, tried, c.hashes, routing, p.rr, now);
        if (choice.index < 0 && tried.empty() && cfg.queue_timeout_s > 0) {
          // No replica yet (scaled to zero, all starting, all open): hold the
          // request, counted in serval_gateway_requests_queued, until one is up.
          const auto until = std::min(c.deadline, now + std::chrono::duration_cast<Clock::duration>(
                                                              std::chrono::duration<double>(cfg.queue_timeout_s)));
          ++p.queued;
          while (choice.index < 0 && Clock::now() < until && !c.ch->disconnected() && !draining.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(25));
            now = Clock::now();
            snap = p.snapshot();
            ptrs = raw(snap);
            choice = choose_replica(ptrs, tried, c.hashes, routing, p.rr, now);
          }
          --p.queued;
        }
        if (choice.index < 0) {
          last.message = "no available upstream for model '" + p.route->name + "' (all unhealthy or circuit open)";
          last.status = 503;
          last.error_body.clear();
          break;
        }
        Replica& r = *ptrs[choice.index];
        tried.push_back(&r);
        if (!r.admit(now)) {
          --att;  // a half-open trial is taken: try another replica without counting an attempt
          if (tried.size() > ptrs.size() * 2) {
            last.message = "no available upstream for model '" + p.route->name + "' (circuit half-open, its trial in flight)";
            last.status = 503;
            last.error_body.clear();
            break;
          }
          continue;
        }
        if (attempts_total++ > 0) retries_total.with({{"model", p.route->name}}).inc();
        routing_total.with({{"model", p.route->name}, {"policy", std::string(policy_name(cfg.policy))}, {"reason", choice.reason}}).inc();
        prefix_match_chars.with({{"model", p.route->name}}).observe((double)choice.matched_chunks * cfg.chunk_chars);
        Attempt a = attempt(c, p, r);
        if (a.outcome == Outcome::delivered) {
          delivered = true;
          answered_pool = chain[ci];
          last = a;
          break;
        }
        last = a;
        if (a.outcome == Outcome::fallback) break;
        // Jittered exponential backoff before the next attempt (never past the deadline).
        if (att + 1 < cfg.retry_attempts) {
          const double cap = std::min(cfg.retry_max_backoff_ms, cfg.retry_backoff_ms * std::pow(2.0, att));
          const auto wake = std::min(c.deadline, Clock::now() + std::chrono::microseconds((int64_t)(jitter(cap) * 1000)));
          std::this_thread::sleep_until(wake);
        }
      }
    }
    ModelPool& ap = *pools[answered_pool];
    if (!delivered) {
      // Nothing reached the client: answer with the last upstream error or our own.
      int st = last.status;
      if (Clock::now() >= c.deadline) {
        st = 504;
        last.message = "request_timeout_s (" + std::to_string((int)cfg.request_timeout_s) + " s) passed; last: " + last.message;
        last.error_body.clear();
      }
      if (st == 0) st = 502;
      if (!last.error_body.empty() && st >= 400 && st != 200) {
        last.reply = [&c, st, body = std::move(last.error_body), ra = last.retry_after]() mutable {
          http::Headers extra{{"x-request-id", c.id}};
          if (!ra.empty()) extra.emplace_back("retry-after", ra);
          c.ch->send(st, "application/json", std::move(body), std::move(extra));
        };
      } else {
        const std::string code = st == 503 ? "no_upstream" : st == 504 ? "timeout" : "upstream_error";
        last.reply = [&c, st, body = Gateway::error_body(st, last.message, code)]() mutable {
          http::Headers extra{{"x-request-id", c.id}};
          if (st == 503) extra.emplace_back("retry-after", "1");
          c.err_ch->send(st, "application/json", std::move(body), std::move(extra));
        };
      }
      last.counted = false;
    }
    // Charged first, answered second: see Attempt::reply.
    auto reply = std::move(last.reply);
    finish(c, ap, last, delivered);
    if (reply) reply();
  }

  void finish(Ctx& c, ModelPool& p, const Attempt& a, bool delivered) {
    const auto now = Clock::now();
    const int64_t tokens = a.prompt_tokens + a.completion_tokens;
    if (c.caller.key) finish_key(*c.caller.key, delivered ? tokens : 0, now);
    if (delivered && a.counted) {
      UsageRecord u;
      u.request_id = c.id;
      u.key = c.caller.name();
      u.model = p.route->name;
      u.day = utc_day(std::chrono::system_clock::now());
      u.prompt_tokens = a.prompt_tokens;
      u.completion_tokens = a.completion_tokens;
      u.spend = (double)a.prompt_tokens * p.route->price_input_per_mtok / 1e6 +
                (double)a.completion_tokens * p.route->price_output_per_mtok / 1e6;
      ledger->record(u);
      if (!u.key.empty()) {
        key_spend_total.with({{"key", u.key}}).inc(u.spend);
        key_tokens_total.with({{"key", u.key}, {"kind", "prompt"}}).inc((double)u.prompt_tokens);
        key_tokens_total.with({{"key", u.key}, {"kind", "completion"}}).inc((double)u.completion_tokens);
      }
    }
    const int status = delivered ? (a.status ? a.status : 200) : (a.status ? a.status : 502);
    requests_total.with({{"model", pools[c.pool]->route->name}, {"code", std::to_string(status)}}).inc();
    const double total = since(c.start);
    request_seconds.with({{"model", pools[c.pool]->route->name}}).observe(total);
    overhead_seconds.with({}).observe(std::max(0.0, total - c.upstream_s));
    {
      std::lock_guard<std::mutex> lk(cancels_mu);
      cancels.erase(c.cancel);
    }
    --inflight;
  }

  // ch: the client's channel; err: the same, shaping the gateway's own errors for the route.
  void handle_proxy(http::HttpRequest&& req, std::shared_ptr<http::ResponseChannel> raw,
                    std::shared_ptr<http::ResponseChannel> ch, Caller caller) {
    if (draining.load()) return reply_error(*ch, 503, "the gateway is shutting down", "unavailable", "draining", {{"retry-after", "1"}});
    if (json_nesting_depth(req.body) > kMaxJsonDepth) return reply_error(*ch, 400, "JSON nested deeper than 64 levels", "invalid_json", "bad_request");
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) return reply_error(*ch, 400, "body: expected a JSON object", "invalid_json", "bad_request");
    auto mi = body.find("model");
    if (mi == body.end() || !mi->is_string())
      return reply_error(*ch, 400, "model: expected a string naming one of GET /v1/models", "invalid_value", "bad_request");
    const std::string model = mi->get<std::string>();
    auto it = by_name.find(model);
    if (it == by_name.end()) return reply_error(*ch, 404, "model '" + model + "' does not exist (see GET /v1/models)", "model_not_found", "unknown_model");
    const ModelRoute& route = *pools[it->second]->route;
    bool stream = false;
    if (auto s = body.find("stream"); s != body.end() && !s->is_null()) {
      if (!s->is_boolean()) return reply_error(*ch, 400, "stream: expected a boolean", "invalid_value", "bad_request");
      stream = s->get<bool>();
    }
    if (stream && (req.path == "/v1/embeddings" || req.path == "/v1/messages/count_tokens"))
      return reply_error(*ch, 400, "stream: " + req.path + " does not stream", "invalid_value", "bad_request");
    bool client_usage = false;
    if (auto so = body.find("stream_options"); so != body.end() && so->is_object())
      if (auto iu = so->find("include_usage"); iu != so->end() && iu->is_boolean()) client_usage = iu->get<bool>();

    const auto now = Clock::now();
    if (caller.key) {
      const KeyConfig& k = caller.key->cfg;
      if (!k.models.empty() && std::find(k.models.begin(), k.models.end(), route.name) == k.models.end() &&
          std::find(k.models.begin(), k.models.end(), model) == k.models.end())
        return reply_error(*ch, 403, "key '" + k.name + "' may not use model '" + model + "'", "model_not_allowed", "forbidden");
      if (k.budget > 0) {
        const double spent = ledger->spend(k.name, k.budget_period, utc_day(std::chrono::system_clock::now()));
        if (spent >= k.budget) {
          char msg[256];
          std::snprintf(msg, sizeof msg, "budget of key '%s' exhausted: spent %.6g of %.6g per %s", k.name.c_str(), spent, k.budget,
                        period_name(k.budget_period).c_str());
          http::Headers extra;
          if (k.budget_period != BudgetPeriod::total)
            extra.emplace_back("retry-after", std::to_string((int64_t)std::ceil(seconds_to_period_end(k.budget_period))));
          return reply_error(*ch, 429, msg, "budget_exceeded", "budget", std::move(extra));
        }
      }
      Admission adm = admit_key(*caller.key, now);
      if (adm.status)
        return reply_error(*ch, adm.status, adm.message, adm.code, adm.code,
                           {{"retry-after", std::to_string(std::max<int64_t>(1, (int64_t)std::ceil(adm.retry_after_s)))}});
    }

    auto c = std::make_shared<Ctx>();
    c->id = random_id();
    c->start = now;
    c->deadline = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg.request_timeout_s));
    c->caller = caller;
    c->stream = stream;
    c->client_usage = client_usage;
    c->api = api_of(req.path);
    c->err_ch = ch;
    ch = raw;
    c->pool = it->second;
    // Only cache-aware routing reads the prompt's prefix keys.
    if (cfg.policy == Policy::cache_aware) c->hashes = prefix_chunk_hashes(prompt_text(body), cfg.chunk_chars);
    c->body = std::move(body);
    if (auto tp = tracing::parse_traceparent(req.header("traceparent"))) c->trace = *tp;
    else c->trace.trace_id = tracing::random_trace_id();
    c->cancel = std::make_shared<CallCancel>();
    c->req = std::move(req);
    c->ch = ch;
    ch->on_disconnect([cancel = c->cancel] { cancel->cancel(); });
    {
      std::lock_guard<std::mutex> lk(cancels_mu);
      cancels.insert(c->cancel);
    }
    ++inflight;
    const bool ok = workers.submit([this, c] { proxy(*c); });
    if (!ok) {
      {
        std::lock_guard<std::mutex> lk(cancels_mu);
        cancels.erase(c->cancel);
      }
      --inflight;
      if (c->caller.key) finish_key(*c->caller.key, 0, now);
      reply_error(*c->err_ch, 503, "the gateway has max_inflight (" + std::to_string(cfg.max_inflight) + ") requests in flight",
                  "overloaded", "overloaded", {{"retry-after", "1"}});
    }
  }

  void handle(http::HttpRequest&& req, std::shared_ptr<http::ResponseChannel> raw) {
    const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
    // The gateway's own errors on Anthropic's routes in Anthropic's shape (upstream answers pass through `raw`).
    std::shared_ptr<http::ResponseChannel> ch =
        anthropic ? std::make_shared<server::ErrorShapeChannel>(raw, &server::anthropic_error_body) : raw;
    if (req.method == "GET" && req.path == "/health") return ch->send(200, "application/json", R"({"status":"ok"})");
    if (req.method == "GET" && req.path == "/ready") {
      const auto now = Clock::now();
      bool any = false;
      for (const auto& p : pools)
        for (const auto& r : p->snapshot()) any = any || r->can_admit(now);
      if (draining.load()) return ch->send(503, "application/json", R"({"status":"draining"})");
      return ch->send(any ? 200 : 503, "application/json", any ? R"({"status":"ready"})" : R"({"status":"no upstream available"})");
    }
    if (req.method == "GET" && req.path == "/metrics") return ch->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text());

    Caller caller = identify(req);
    if (caller.who == Who::invalid) return reply_error(*ch, 401, "invalid API key", "invalid_api_key", "unauthorized");
    if (caller.who == Who::anonymous && cfg.require_key && req.path.compare(0, 4, "/v1/") == 0)
      return reply_error(*ch, 401, "an API key is required (Authorization: Bearer KEY)", "invalid_api_key", "unauthorized");
    if (req.path.compare(0, 12, "/v1/gateway/") == 0) return admin(req, *ch, caller);
    if (req.path == "/v1/models") {
      if (req.method != "GET") return reply_error(*ch, 405, "use GET /v1/models", "method_not_allowed", "bad_request");
      return models(*ch);
    }
    if (req.path == "/v1/chat/completions" || req.path == "/v1/completions" || req.path == "/v1/embeddings" ||
        req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens" || req.path == "/v1/responses") {
      if (req.method != "POST") return reply_error(*ch, 405, "use POST " + req.path, "method_not_allowed", "bad_request");
      return handle_proxy(std::move(req), std::move(raw), std::move(ch), std::move(caller));
    }
    reply_error(*ch, 404, "no route " + req.method + " " + req.path, "not_found", "not_found");
  }

  // ---- health checks and load scrapes ----

  ModelPool* pool_of(const ModelRoute* route) {
    for (auto& p : pools)
      if (p->route == route) return p.get();
    return nullptr;
  }

  static double metric_value(const std::string& text, std::string_view name) {
    size_t pos = 0;
    while ((pos = text.find(name, pos)) != std::string::npos) {
      const bool line_start = pos == 0 || text[pos - 1] == '\n';
      const size_t after = pos + name.size();
      if (line_start && after < text.size() && (text[after] == ' ' || text[after] == '{')) {
        size_t sp = text.find(' ', text[after] == '{' ? text.find('}', after) : after);
        if (sp == std::string::npos) return -1;
        return std::strtod(text.c_str() + sp + 1, nullptr);
      }
      pos = after;
    }
    return -1;
  }

  // A DNS-discovered pool follows its names' addresses: new ones join
  // (unhealthy until their first health check), vanished ones leave.
  void discover(ModelPool& p) {
    std::vector<UpstreamUrl> found;
    for (const auto& u : p.route->upstreams) {
      auto r = resolve_all(u);
      if (r) found.insert(found.end(), r->begin(), r->end());
    }
    auto old = p.snapshot();
    std::vector<std::shared_ptr<Replica>> next;
    const BreakerConfig bc{cfg.breaker_failures, cfg.breaker_open_s, cfg.breaker_max_open_s};
    for (const auto& u : found) {
      auto it = std::find_if(old.begin(), old.end(), [&](const auto& r) { return r->url() == u.url; });
      if (it != old.end()) {
        next.push_back(*it);
      } else {
        auto r = std::make_shared<Replica>(u, cfg.max_tree_chunks, bc);
        r->on_health(false, Clock::now());
        next.push_back(std::move(r));
      }
    }
    if (next.size() != old.size() || !std::equal(next.begin(), next.end(), old.begin()))
      std::fprintf(stderr, "serval gateway: model '%s': %zu replicas from DNS\n", p.route->name.c_str(), next.size());
    p.set(std::move(next));
  }

  void check_once() {
    std::vector<std::thread> ts;
    for (const auto& p : pools) {
      if (p->route->discover_dns) discover(*p);
      for (const auto& rp : p->snapshot()) {
        Replica* r = rp.get();
        ts.emplace_back([this, r, rp, route = p->route] {
          const auto now = Clock::now();
          HeaderList auth;
          if (!route->api_key.empty()) auth.emplace_back("authorization", "Bearer " + route->api_key);
          if (!route->health_path.empty()) {
            auto res = simple_get(r->pool(), route->health_path, cfg.health_timeout_s, 4096, auth);
            r->on_health(res.result.kind == CallResult::Kind::ok && res.result.status == 200, now);
          }
          if (r->healthy() && !pool_of(route)->info().is_object()) {
            auto res = simple_get(r->pool(), "/v1/models", cfg.health_timeout_s, 1u << 20, auth);
            json j = json::parse(res.body, nullptr, false);
            const std::string want = route->upstream_model.empty() ? route->name : route->upstream_model;
            // Its entry for this model (or the only one a single-model server lists).
            if (res.result.kind == CallResult::Kind::ok && res.result.status == 200 && j.is_object() &&
                j.contains("data") && j["data"].is_array()) {
              const json& d = j["data"];
              for (const auto& e : d)
                if (e.is_object() && e.contains("id") && e["id"].is_string() && e["id"].get_ref<const std::string&>() == want)
                  pool_of(route)->set_info(e);
              if (!pool_of(route)->info().is_object() && d.size() == 1 && d[0].is_object()) pool_of(route)->set_info(d[0]);
            }
          }
          if (!route->metrics_path.empty() && r->healthy()) {
            auto res = simple_get(r->pool(), route->metrics_path, cfg.health_timeout_s, 4u << 20, auth);
            if (res.result.kind == CallResult::Kind::ok && res.result.status == 200) {
              const bool s = route->serval;
              const double run = metric_value(res.body, s ? "serval_requests_running" : "vllm:num_requests_running");
              const double wait = metric_value(res.body, s ? "serval_requests_waiting" : "vllm:num_requests_waiting");
              const double kv = metric_value(res.body, s ? "serval_kv_usage_ratio" : "vllm:kv_cache_usage_perc");
              if (run >= 0 && wait >= 0) r->set_scraped(run, wait, std::max(0.0, kv));
            }
          }
        });
      }
    }
    for (auto& t : ts) t.join();
  }

  void health_loop() {
    std::unique_lock<std::mutex> lk(health_mu);
    while (!health_stop) {
      health_cv.wait_for(lk, std::chrono::duration<double>(cfg.health_interval_s), [&] { return health_stop; });
      if (health_stop) break;
      lk.unlock();
      check_once();
      lk.lock();
    }
  }
};

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Gateway::~Gateway() { stop(); }

Expected<std::unique_ptr<Gateway>> Gateway::create(GatewayConfig cfg) {
  auto impl = std::make_unique<Impl>(std::move(cfg));
  auto ledger = Ledger::open(impl->cfg.db_path);
  if (!ledger) return ledger.status();
  impl->ledger = std::move(*ledger);
  for (const auto& k : impl->cfg.keys) impl->keys.put(k, true);
  for (const auto& k : impl->ledger->keys()) {
    if (impl->keys.find_by_name(k.name)) {
      std::fprintf(stderr, "serval gateway: key '%s' in the database is shadowed by the config file's\n", k.name.c_str());
      continue;
    }
    impl->keys.put(k, false);
  }
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

void Gateway::handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch) { impl_->handle(std::move(req), std::move(ch)); }

std::string Gateway::error_body(int status, const std::string& message, const std::string& code) {
  const char* type = status == 401 ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code.empty() ? json(nullptr) : json(code)}};
  // Messages quote request paths and names: bytes that are not UTF-8 become U+FFFD rather than an exception.
  return json{{"error", std::move(e)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

void Gateway::start() {
  impl_->check_once();
  impl_->health_thread = std::thread([this] { impl_->health_loop(); });
}

void Gateway::begin_drain() { impl_->draining.store(true); }
size_t Gateway::in_flight() const { return impl_->inflight.load(); }

void Gateway::cancel_all() {
  std::lock_guard<std::mutex> lk(impl_->cancels_mu);
  for (const auto& c : impl_->cancels) c->cancel();
}

void Gateway::stop() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lk(impl_->health_mu);
    impl_->health_stop = true;
  }
  impl_->health_cv.notify_all();
  if (impl_->health_thread.joinable()) impl_->health_thread.join();
  cancel_all();
  impl_->workers.stop();
  if (impl_->ledger) impl_->ledger->close();
}

const GatewayConfig& Gateway::config() const { return impl_->cfg; }

}  // namespace serval::gateway
