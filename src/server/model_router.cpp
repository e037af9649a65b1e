#include "server/model_router.h"

#include <malloc.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/api_keys.h"
#include "server/api_translation.h"
#include "server/openai_request.h"
#include "server/openai_server.h"
#include "server/webui.h"

namespace serval::server {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(const std::shared_ptr<http::ResponseChannel>& ch, int status, const std::string& body,
               http::Headers extra = {}) {
  ch->send(status, "application/json", body, std::move(extra));
}

void send_error(const std::shared_ptr<http::ResponseChannel>& ch, const ApiError& e, http::Headers extra = {}) {
  send_json(ch, e.status, e.body(), std::move(extra));
}

// A failed model is not tried again for this long; its requests get the
// loader's error meanwhile.
constexpr double kRetryFailedS = 30;

std::string percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit((unsigned char)s[i + 1]) &&
        std::isxdigit((unsigned char)s[i + 2])) {
      out.push_back((char)std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out.push_back(plus_is_space && s[i] == '+' ? ' ' : s[i]);
    }
  }
  return out;
}

// ?model=NAME (percent-decoded); nullopt when absent.
std::optional<std::string> query_model(const std::string& query) {
  std::string_view q = query;
  while (!q.empty()) {
    const size_t amp = q.find('&');
    const std::string_view kv = q.substr(0, amp);
    if (kv.rfind("model=", 0) == 0) return percent_decode(kv.substr(6), true);
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

// A Prometheus label value: backslash, quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ServedModel::~ServedModel() {
  api.reset();
  owner.reset();
}

const char* ModelRouter::state_name(State s) {
  switch (s) {
    case State::unloaded: return "unloaded";
    case State::loading: return "loading";
    case State::loaded: return "loaded";
    case State::failed: return "failed";
  }
  return "unknown";
}

Expected<std::unique_ptr<ModelRouter>> ModelRouter::create(std::vector<RouterModelSpec> specs, ModelFactory factory,
                                                           RouterConfig cfg) {
  if (specs.empty()) return invalid_argument("router: no model to serve");
  if (!factory) return invalid_argument("router: no model factory");
  std::vector<Entry> entries;
  std::set<std::string> taken;
  for (RouterModelSpec& s : specs) {
    if (s.name.empty() || s.name.size() > 256 ||
        std::any_of(s.name.begin(), s.name.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
      return invalid_argument("model name '" + s.name + "': 1 to 256 characters without control characters");
    Entry e;
    e.ids.push_back(s.name);
    for (const std::string& a : s.aliases) {
      if (a.empty() || a.size() > 256 ||
          std::any_of(a.begin(), a.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
        return invalid_argument("model '" + s.name + "': alias '" + a +
                                "' is not 1 to 256 characters without control characters");
      e.ids.push_back(a);
    }
    for (const RouterModelSpec::Adapter& a : s.loras) {
      if (a.name.empty() || a.name.size() > 256 ||
          std::any_of(a.name.begin(), a.name.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
        return invalid_argument("model '" + s.name + "': adapter name '" + a.name +
                                "' is not 1 to 256 characters without control characters");
      e.ids.push_back(a.name);  // a request for the adapter goes to its base's server
    }
    for (const std::string& id : e.ids)
      if (!taken.insert(id).second) return invalid_argument("model id '" + id + "' is given to two models");
    std::error_code ec;
    const auto sz = std::filesystem::file_size(s.path, ec);
    e.file_bytes = ec ? 0 : (uint64_t)sz;
    for (const RouterModelSpec::Adapter& a : s.loras) {
      const auto asz = std::filesystem::file_size(a.path, ec);
      e.file_bytes += ec ? 0 : (uint64_t)asz;
    }
    e.spec = std::move(s);
    entries.push_back(std::move(e));
  }
  // The file's name, with and without .gguf, is accepted too unless another model has it as an id.
  for (Entry& e : entries) {
    const std::string base = std::filesystem::path(e.spec.path).filename().string();
    std::vector<std::string> extra = {base};
    if (base.size() > 5 && base.ends_with(".gguf")) extra.push_back(base.substr(0, base.size() - 5));
    for (const std::string& id : extra)
      if (taken.insert(id).second) e.ids.push_back(id);
  }
  if (cfg.models_max > 0) {
    size_t pinned = 0;
    for (const Entry& e : entries) pinned += e.spec.pinned;
    if (pinned > cfg.models_max)
      return invalid_argument("--models-max " + std::to_string(cfg.models_max) + " cannot hold the " +
                              std::to_string(pinned) + " pinned models");
  }
  return std::unique_ptr<ModelRouter>(new ModelRouter(std::move(entries), std::move(factory), std::move(cfg)));
}

ModelRouter::ModelRouter(std::vector<Entry> entries, ModelFactory factory, RouterConfig cfg)
    : factory_(std::move(factory)), cfg_(std::move(cfg)), entries_(std::move(entries)) {
  loader_ = std::thread([this] { loader_loop(); });
}

ModelRouter::~ModelRouter() {
  std::vector<Waiter> left;
  std::vector<std::shared_ptr<ServedModel>> drop;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    for (Entry& e : entries_) {
      for (Waiter& w : e.waiters) left.push_back(std::move(w));
      e.waiters.clear();
    }
  }
  cv_.notify_all();
  if (loader_.joinable()) loader_.join();
  if (load_thread_.joinable()) load_thread_.join();
  for (Waiter& w : left)
    send_error(w.ch, ApiError{503, "server is shutting down", "server_error", "", "draining"});
  std::lock_guard<std::mutex> lk(mu_);
  for (Entry& e : entries_) drop.push_back(std::move(e.served));
}

ModelRouter::Entry* ModelRouter::find(const std::string& id) {
  for (Entry& e : entries_)
    if (std::find(e.ids.begin(), e.ids.end(), id) != e.ids.end()) return &e;
  return nullptr;
}

bool ModelRouter::idle(const Entry& e) {
  return e.state == State::loaded && !e.spec.pinned && e.served && e.served.use_count() == 1 && e.waiters.empty() &&
         e.served->api->quiescent();
}

size_t ModelRouter::est_bytes(const Entry& e) const {
  if (e.served && e.served->bytes) return e.served->bytes;
  return (size_t)e.file_bytes + (e.spec.kv_memory ? e.spec.kv_memory : cfg_.kv_bytes_default) +
         cfg_.engine_extra_bytes;
}

std::vector<ModelRouter::ModelStatus> ModelRouter::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<ModelStatus> out;
  for (const Entry& e : entries_) {
    ModelStatus s;
    s.name = e.spec.name;
    s.state = e.state;
    s.bytes = est_bytes(e);
    s.loads = e.loads;
    s.unloads = e.evictions + e.idle_unloads + e.admin_unloads;
    s.waiting = e.waiters.size();
    s.error = e.error;
    out.push_back(std::move(s));
  }
  return out;
}

void ModelRouter::begin_drain() {
  std::vector<Waiter> left;
  std::vector<std::shared_ptr<ServedModel>> live;
  {
    std::lock_guard<std::mutex> lk(mu_);
    draining_ = true;
    for (Entry& e : entries_) {
      for (Waiter& w : e.waiters) left.push_back(std::move(w));
      e.waiters.clear();
      if (e.served) live.push_back(e.served);
    }
  }
  for (auto& s : live) s->api->begin_drain();
  for (Waiter& w : left)
    send_error(w.ch, ApiError{503, "server is shutting down; no new requests", "server_error", "", "draining"});
}

size_t ModelRouter::in_flight() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const Entry& e : entries_) {
    n += e.waiters.size();
    if (e.served) n += e.served->api->in_flight();
  }
  return n;
}

void ModelRouter::handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> raw) {
  const std::string& path = req.path;
  const bool anthropic = path == "/v1/messages" || path == "/v1/messages/count_tokens";
  // The router's own errors in the route's shape; the model's server shapes its own.
  std::shared_ptr<http::ResponseChannel> ch =
      anthropic ? std::make_shared<ErrorShapeChannel>(raw, &anthropic_error_body) : raw;
  if (is_webui_path(path)) return serve_webui(req, *ch, cfg_.webui);
  if (path == "/health") {
    if (req.method != "GET") return send_error(ch, method_not_allowed_error("GET"), {{"Allow", "GET"}});
    return send_json(ch, 200, R"({"status":"ok"})");
  }
  if (api_key_index(cfg_.api_keys, req) < 0)
    return send_error(ch, ApiError{401, "missing or invalid API key (Authorization: Bearer ..., or x-api-key)",
                                   "invalid_request_error", "", "invalid_api_key"});
  bool draining;
  {
    std::lock_guard<std::mutex> lk(mu_);
    draining = draining_;
  }
  if (path == "/ready") {
    if (draining) return send_error(ch, ApiError{503, "server is draining", "server_error", "", "draining"});
    return send_json(ch, 200, R"({"status":"ready"})");
  }
  if (path == "/metrics") {
    if (req.method != "GET") return send_error(ch, method_not_allowed_error("GET"), {{"Allow", "GET"}});
    return ch->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text());
  }
  if (path == "/v1/models") {
    if (req.method != "GET") return send_error(ch, method_not_allowed_error("GET"), {{"Allow", "GET"}});
    return list_models(ch);
  }
  if (path.rfind("/v1/models/", 0) == 0) return admin(req, ch);
  if (draining)
    return send_error(ch, ApiError{503, "server is shutting down; no new requests", "server_error", "", "draining"});
  if (path.rfind("/v1/files", 0) == 0 || path.rfind("/v1/batches", 0) == 0)
    return send_error(ch, ApiError{404, "the Files and Batches APIs are off in router mode (serve one model for them)",
                                   "invalid_request_error", "", "not_found"});
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter")
    return send_error(ch, ApiError{404, "LoRA adapters are off in router mode (serve one model for them)",
                                   "invalid_request_error", "", "not_found"});
  Entry* e = route(req, ch);
  if (!e) return;
  dispatch(*e, std::move(req), std::move(raw));
}

ModelRouter::Entry* ModelRouter::route(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch) {
  std::optional<std::string> name = query_model(req.query);
  const std::string ctype = req.header("content-type");
  const bool json_body = req.method == "POST" && !req.body.empty() &&
                         ctype.find("multipart/") == std::string::npos;
  if (!name && json_body) {
    auto parsed = parse_json_object(req.body, cfg_.max_json_depth);
    if (auto* err = std::get_if<ApiError>(&parsed)) {
      send_error(ch, *err);
      return nullptr;
    }
    const auto& body = std::get<nlohmann::ordered_json>(parsed);
    if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
      if (!it->is_string()) {
        send_error(ch, bad_request("model: expected a string", "model"));
        return nullptr;
      }
      if (!it->get_ref<const std::string&>().empty()) name = it->get<std::string>();
    }
  }
  if (!name) {
    if (entries_.size() == 1) return &entries_[0];
    send_error(ch, bad_request("model: required, this server has " + std::to_string(entries_.size()) +
                                   " models (GET /v1/models lists them; routes without a body take ?model=)",
                               "model", "model_required"));
    return nullptr;
  }
  Entry* e = find(*name);
  if (!e) {
    std::string shown = name->substr(0, 256);
    send_error(ch, ApiError{404, "the model '" + shown + "' does not exist (GET /v1/models lists them)",
                            "invalid_request_error", "model", "model_not_found"});
    return nullptr;
  }
  return e;
}

void ModelRouter::dispatch(Entry& e, http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch) {
  std::shared_ptr<ServedModel> served;
  std::string error;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const auto now = Clock::now();
    e.last_used = now;
    if (draining_) {
      error = "draining";
    } else if (e.state == State::loaded) {
      served = e.served;
    } else if (e.state == State::failed && seconds(now - e.failed_at) < kRetryFailedS) {
      error = e.error;
    } else {
      if (e.waiters.size() >= cfg_.max_waiting) {
        e.rejected++;
        error.clear();
      } else {
        const auto wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.load_wait_s));
        e.waiters.push_back(Waiter{std::move(req), ch, now + wait, false});
        cv_.notify_all();
        return;
      }
    }
  }
  const bool anthropic = req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens";
  if (served) return served->api->handle(std::move(req), std::move(ch));
  std::shared_ptr<http::ResponseChannel> shaped =
      anthropic ? std::make_shared<ErrorShapeChannel>(ch, &anthropic_error_body) : ch;
  if (error == "draining")
    return send_error(shaped, ApiError{503, "server is shutting down; no new requests", "server_error", "", "draining"});
  if (!error.empty())
    return send_error(shaped, ApiError{500, "model '" + e.spec.name + "' failed to load: " + error, "server_error",
                                       "model", "model_load_failed"});
  send_error(shaped,
             ApiError{503, "too many requests waiting for model '" + e.spec.name + "' to load; retry later",
                      "server_error", "", "model_loading"},
             {{"Retry-After", "5"}});
}

void ModelRouter::list_models(const std::shared_ptr<http::ResponseChannel>& ch) const {
  const auto created = (int64_t)std::time(nullptr);
  json data = json::array();
  std::lock_guard<std::mutex> lk(mu_);
  for (const Entry& e : entries_) {
    const char* st = state_name(e.state);
    json m = {{"id", e.spec.name},
              {"object", "model"},
              {"created", created},
              {"owned_by", "serval"},
              {"status", {{"value", st}}},
              {"state", st},
              {"size_bytes", est_bytes(e)},
              {"file_bytes", e.file_bytes},
              {"pinned", e.spec.pinned},
              {"aliases", e.spec.aliases},
              {"loads", e.loads}};
    if (e.served) m["max_model_len"] = e.served->max_model_len;
    if (e.state == State::failed) m["error"] = e.error;
    data.push_back(std::move(m));
    // Its LoRA adapters as models of their own, the base as parent (as vLLM
    // and the single-model server list them), in the base's state.
    for (const RouterModelSpec::Adapter& a : e.spec.loras) {
      json am = {{"id", a.name},   {"object", "model"}, {"created", created}, {"owned_by", "serval"},
                 {"parent", e.spec.name}, {"root", a.path}, {"status", {{"value", st}}}, {"state", st},
                 {"lora", {{"scale", a.scale}}}};
      if (e.served) am["max_model_len"] = e.served->max_model_len;
      data.push_back(std::move(am));
    }
  }
  send_json(ch, 200, dump(json{{"object", "list"}, {"data", data}}));
}

// GET /v1/models/{id}; POST /v1/models/{id}/load and /unload (API key required).
void ModelRouter::admin(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch) {
  std::string rest = req.path.substr(std::string("/v1/models/").size());
  std::string action;
  for (const char* a : {"/load", "/unload"})
    if (rest.size() > std::strlen(a) && rest.ends_with(a)) {
      action = a + 1;
      rest.resize(rest.size() - std::strlen(a));
      break;
    }
  const std::string id = percent_decode(rest, false);
  Entry* e = find(id);
  if (!e)
    return send_error(ch, ApiError{404, "the model '" + id.substr(0, 256) + "' does not exist",
                                   "invalid_request_error", "model", "model_not_found"});
  auto state_body = [&](const Entry& x) {
    json m = {{"id", x.spec.name}, {"object", "model"}, {"status", {{"value", state_name(x.state)}}},
              {"state", state_name(x.state)}, {"size_bytes", est_bytes(x)}, {"pinned", x.spec.pinned}};
    if (x.state == State::failed) m["error"] = x.error;
    return dump(m);
  };
  if (action.empty()) {
    if (req.method != "GET") return send_error(ch, method_not_allowed_error("GET"), {{"Allow", "GET"}});
    std::lock_guard<std::mutex> lk(mu_);
    return send_json(ch, 200, state_body(*e));
  }
  if (req.method != "POST") return send_error(ch, method_not_allowed_error("POST"), {{"Allow", "POST"}});
  if (cfg_.api_keys.empty())
    return send_error(ch, ApiError{403, "loading and unloading models needs an API key on the server (--api-key)",
                                   "permission_error", "", "admin_disabled"});
  std::shared_ptr<ServedModel> drop;
  if (action == "unload") {
    // A request whose answer was just sent still holds its state for a
    // moment (quiescent() turns true right after): an unload sent after a
    // reply waits for that, at most 200 ms, rather than answering 409. It is
    // an operator's route; nothing waits if requests are still in flight.
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (e->state != State::loaded || !e->served || e->served.use_count() > 1 || !e->waiters.empty() ||
            e->served->api->in_flight() > 0 || e->served->api->quiescent())
          break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (draining_)
      return send_error(ch, ApiError{503, "server is shutting down", "server_error", "", "draining"});
    if (action == "load") {
      if (e->state == State::loaded) return send_json(ch, 200, state_body(*e));
      if (e->waiters.size() >= cfg_.max_waiting)
        return send_error(ch, ApiError{503, "too many requests waiting for this model", "server_error", "",
                                       "model_loading"},
                          {{"Retry-After", "5"}});
      if (e->state == State::failed) e->failed_at = {};  // an operator's load retries at once
      const auto wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.load_wait_s));
      e->last_used = Clock::now();
      e->waiters.push_back(Waiter{req, ch, Clock::now() + wait, true});
      cv_.notify_all();
      return;
    }
    // unload
    if (e->state != State::loaded) return send_json(ch, 200, state_body(*e));
    if (e->served.use_count() > 1 || !e->waiters.empty() || !e->served->api->quiescent())
      return send_error(ch, ApiError{409, "model '" + e->spec.name + "' has requests in flight; unload it when idle",
                                     "invalid_request_error", "", "model_busy"});
    drop = std::move(e->served);
    e->state = State::unloaded;
    e->admin_unloads++;
  }
  // The model goes on the loader thread (freeing gigabytes takes a while).
  {
    std::lock_guard<std::mutex> lk(mu_);
    graveyard_.push_back(std::move(drop));
    std::string body = state_body(*e);
    cv_.notify_all();
    send_json(ch, 200, body);
  }
}

void ModelRouter::release(std::vector<Waiter> ws, const std::shared_ptr<ServedModel>& served, const std::string& name,
                          const std::string& error, const char* state) {
  for (Waiter& w : ws) {
    if (w.ch->disconnected()) continue;
    const bool anthropic = w.req.path == "/v1/messages" || w.req.path == "/v1/messages/count_tokens";
    std::shared_ptr<http::ResponseChannel> shaped =
        anthropic ? std::make_shared<ErrorShapeChannel>(w.ch, &anthropic_error_body) : w.ch;
    if (!served && std::string_view(state) == "unfit") {
      send_error(shaped, ApiError{503, "model '" + name + "' cannot be loaded: " + error, "server_error", "model",
                                  "model_does_not_fit"});
      continue;
    }
    if (w.admin) {
      if (served)
        send_json(w.ch, 200, dump(json{{"id", name}, {"object", "model"}, {"status", {{"value", "loaded"}}},
                                       {"state", "loaded"}, {"size_bytes", served->bytes}}));
      else if (error.empty())
        send_error(w.ch,
                   ApiError{503, std::string("model '") + name + "' is " + state + "; not loaded within " +
                                     std::to_string((int)cfg_.load_wait_s) + " s",
                            "server_error", "", "model_loading"},
                   {{"Retry-After", "10"}});
      else
        send_error(w.ch, ApiError{500, "model '" + name + "' failed to load: " + error, "server_error", "model",
                                  "model_load_failed"});
      continue;
    }
    if (served) {
      served->api->handle(std::move(w.req), std::move(w.ch));
    } else if (!error.empty()) {
      send_error(shaped, ApiError{500, "model '" + name + "' failed to load: " + error, "server_error", "model",
                                  "model_load_failed"});
    } else {
      send_error(shaped,
                 ApiError{503, std::string("model '") + name + "' is " + state + "; not ready within " +
                                   std::to_string((int)cfg_.load_wait_s) + " s, retry later",
                          "server_error", "", "model_loading"},
                 {{"Retry-After", "10"}});
    }
  }
}

Expected<std::unique_ptr<ServedModel>> ModelRouter::make(const RouterModelSpec& spec) {
  try {
    return factory_(spec);
  } catch (const std::bad_alloc&) {
    return io_error("out of memory while loading");
  } catch (const std::exception& ex) {
    return invalid_file(std::string("loading failed: ") + ex.what());
  }
}

void ModelRouter::loader_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  // A load that waits for a busy model to go idle looks again soon: the
  // model's last request ends (in_flight() drops) without telling the router.
  bool blocked = false;
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(blocked ? 2 : 100));
    blocked = false;
    if (stop_) break;
    const auto now = Clock::now();
    std::vector<std::shared_ptr<ServedModel>> drop;
    drop.swap(graveyard_);
    struct Expired {
      std::vector<Waiter> ws;
      std::string name;
      const char* state;
    };
    std::vector<Expired> expired;
    // Waiters past their deadline. An operator's load (admin) that has
    // started waits for its end: the route answers with the load's outcome.
    for (Entry& e : entries_) {
      Expired x{{}, e.spec.name, state_name(e.state)};
      for (auto it = e.waiters.begin(); it != e.waiters.end();) {
        const bool past = it->deadline <= now && !(it->admin && e.state == State::loading);
        if (past || it->ch->disconnected()) {
          if (!it->ch->disconnected()) x.ws.push_back(std::move(*it));
          it = e.waiters.erase(it);
        } else {
          ++it;
        }
      }
      if (!x.ws.empty()) expired.push_back(std::move(x));
    }
    // A model with work in flight counts as used now (LRU order and idle
    // unloading run from a request's end, not its start).
    for (Entry& e : entries_)
      if (e.state == State::loaded && e.served && (!e.served->api->quiescent() || !e.waiters.empty()))
        e.last_used = now;
    // Idle unloading.
    if (cfg_.idle_unload_s > 0)
      for (Entry& e : entries_)
        if (idle(e) && seconds(now - e.last_used) >= cfg_.idle_unload_s) {
          drop.push_back(std::move(e.served));
          e.state = State::unloaded;
          e.idle_unloads++;
        }
    // Failed models within their retry pause: their waiters get the error.
    std::vector<std::pair<Entry*, std::vector<Waiter>>> failed_now;
    for (Entry& e : entries_)
      if (!e.waiters.empty() && e.state == State::failed && seconds(now - e.failed_at) < kRetryFailedS) {
        std::vector<Waiter> ws(std::make_move_iterator(e.waiters.begin()), std::make_move_iterator(e.waiters.end()));
        e.waiters.clear();
        failed_now.emplace_back(&e, std::move(ws));
      }
    // The model to load: of those with waiters, the one whose oldest waiter
    // came first among those that fit once idle models are unloaded.
    std::vector<Entry*> wanted;
    for (Entry& e : entries_)
      if (!e.waiters.empty() && (e.state == State::unloaded || e.state == State::failed)) wanted.push_back(&e);
    std::sort(wanted.begin(), wanted.end(),
              [](const Entry* a, const Entry* b) { return a->waiters.front().deadline < b->waiters.front().deadline; });
    size_t loaded_n = 0, loaded_bytes = 0, pinned_n = 0, pinned_bytes = 0;
    std::vector<Entry*> idle_lru;
    for (Entry& e : entries_) {
      if (e.state != State::loaded && e.state != State::loading) continue;
      loaded_n++;
      loaded_bytes += est_bytes(e);
      if (e.spec.pinned) {
        pinned_n++;
        pinned_bytes += est_bytes(e);
      }
      if (idle(e)) idle_lru.push_back(&e);
    }
    std::sort(idle_lru.begin(), idle_lru.end(), [](const Entry* a, const Entry* b) { return a->last_used < b->last_used; });
    auto fits = [&](size_t n, size_t bytes, size_t need) {
      return (cfg_.models_max == 0 || n + 1 <= cfg_.models_max) &&
             (cfg_.models_memory == 0 || n == 0 || bytes + need <= cfg_.models_memory);
    };
    Entry* target = nullptr;
    std::vector<std::pair<Entry*, std::vector<Waiter>>> never_fit;
    for (Entry* cand : draining_ || load_running_ ? std::vector<Entry*>{} : wanted) {
      const size_t need = est_bytes(*cand);
      if (!fits(pinned_n, pinned_bytes, need)) {  // not even with every unpinned model out
        std::vector<Waiter> ws(std::make_move_iterator(cand->waiters.begin()),
                               std::make_move_iterator(cand->waiters.end()));
        cand->waiters.clear();
        never_fit.emplace_back(cand, std::move(ws));
        continue;
      }
      // The fewest least recently used idle models whose unloading makes room; none if that is not enough.
      size_t n = loaded_n, bytes = loaded_bytes, k = 0;
      while (!fits(n, bytes, need) && k < idle_lru.size()) {
        n--;
        bytes -= est_bytes(*idle_lru[k]);
        k++;
      }
      if (!fits(n, bytes, need)) {
        blocked = true;  // a busy model must go idle first (or the waiters time out)
        continue;
      }
      for (size_t i = 0; i < k; ++i) {
        drop.push_back(std::move(idle_lru[i]->served));
        idle_lru[i]->state = State::unloaded;
        idle_lru[i]->evictions++;
      }
      target = cand;
      break;
    }
    if (target) {
      target->state = State::loading;
      load_running_ = true;
    }
    lk.unlock();
    const bool freed = !drop.empty();
    drop.clear();
    if (freed) malloc_trim(0);
    for (Expired& x : expired) release(std::move(x.ws), nullptr, x.name, "", x.state);
    for (auto& [e, ws] : never_fit)
      release(std::move(ws), nullptr, e->spec.name,
              "it does not fit next to the pinned models (--models-max / --models-memory)", "unfit");
    for (auto& [e, ws] : failed_now) {
      std::string err;
      {
        std::lock_guard<std::mutex> g(mu_);
        err = e->error;
      }
      release(std::move(ws), nullptr, e->spec.name, err, "failed");
    }
    if (target) {
      // On its own thread, so that deadlines keep being checked while it
      // loads (a large model takes seconds; other models' waiters must still
      // get their 503 at --models-load-timeout). The previous load's thread
      // has finished its load (load_running_ was false); join its last steps.
      if (load_thread_.joinable()) load_thread_.join();
      load_thread_ = std::thread([this, target] { finish_load(target); });
    }
    lk.lock();
  }
}

void ModelRouter::finish_load(Entry* target) {
  const auto t0 = Clock::now();
  auto made = make(target->spec);
  const double took = seconds(Clock::now() - t0);
  std::shared_ptr<ServedModel> served;
  std::string err;
  if (made.ok() && *made && (*made)->api) {
    served = std::shared_ptr<ServedModel>(std::move(made.value()));
  } else {
    err = made.ok() ? "the loader made no server" : made.status().message();
  }
  std::vector<Waiter> ws;
  bool drain_now = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (served) {
      target->state = State::loaded;
      target->served = served;
      target->error.clear();
      target->loads++;
      target->last_load_s = took;
      target->last_used = Clock::now();
      drain_now = draining_;
    } else {
      target->state = State::failed;
      target->error = err;
      target->failed_at = Clock::now();
      target->load_failures++;
    }
    ws.assign(std::make_move_iterator(target->waiters.begin()), std::make_move_iterator(target->waiters.end()));
    target->waiters.clear();
  }
  if (drain_now) served->api->begin_drain();
  release(std::move(ws), served, target->spec.name, err, served ? "loaded" : "failed");
  served.reset();
  std::lock_guard<std::mutex> done(mu_);
  load_running_ = false;
  cv_.notify_all();
}

Status ModelRouter::load_now(const std::string& name) {
  Entry* e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    e = find(name);
    if (!e) return not_found("no model named '" + name + "'");
    if (e->state == State::loaded) return {};
    if (e->state == State::loading) return invalid_argument("model '" + name + "' is loading");
    e->state = State::loading;
  }
  const auto t0 = Clock::now();
  auto made = make(e->spec);
  std::lock_guard<std::mutex> lk(mu_);
  if (!made.ok() || !*made || !(*made)->api) {
    e->state = State::failed;
    e->error = made.ok() ? "the loader made no server" : made.status().message();
    e->failed_at = Clock::now();
    e->load_failures++;
    return made.ok() ? invalid_file(e->error) : made.status();
  }
  e->served = std::shared_ptr<ServedModel>(std::move(made.value()));
  e->state = State::loaded;
  e->loads++;
  e->last_load_s = seconds(Clock::now() - t0);
  e->last_used = Clock::now();
  return {};
}

std::string merge_model_metrics(const std::vector<std::pair<std::string, std::string>>& texts) {
  struct Family {
    std::vector<std::string> meta;  // # HELP / # TYPE, from the first text that has them
    std::vector<std::string> samples;
  };
  std::vector<std::string> order;
  std::map<std::string, Family> fams;
  for (const auto& [model, text] : texts) {
    std::istringstream in(text);
    std::string line, cur;
    std::set<std::string> meta_seen;  // families whose meta lines this text gave
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (line.rfind("# ", 0) == 0) {
        std::istringstream ls(line.substr(2));
        std::string kind, name;
        ls >> kind >> name;
        if (kind != "HELP" && kind != "TYPE") continue;
        cur = name;
        if (!fams.count(name)) order.push_back(name);
        Family& f = fams[name];
        if (f.meta.size() < 2 && (f.samples.empty() || meta_seen.count(name))) {
          f.meta.push_back(line);
          meta_seen.insert(name);
        }
        continue;
      }
      if (line[0] == '#') continue;
      std::string sample = line;
      const size_t brace = sample.find('{');
      const size_t space = sample.find(' ');
      const std::string label = "model=\"" + label_value(model) + "\"";
      if (brace != std::string::npos && brace < space) {
        const size_t close = sample.find('}', brace);
        if (sample.substr(brace, close - brace).find("model=\"") == std::string::npos)
          sample.insert(brace + 1, label + (close == brace + 1 ? "" : ","));
      } else if (space != std::string::npos) {
        sample.insert(space, "{" + label + "}");
      }
      const std::string name = sample.substr(0, std::min(sample.find('{'), sample.find(' ')));
      std::string fam = cur;
      if (fam.empty() || name.rfind(fam, 0) != 0) {
        fam = name;
        if (!fams.count(fam)) order.push_back(fam);
      }
      fams[fam].samples.push_back(std::move(sample));
    }
  }
  std::string out;
  for (const std::string& name : order) {
    const Family& f = fams[name];
    for (const std::string& m : f.meta) out += m + "\n";
    for (const std::string& s : f.samples) out += s + "\n";
  }
  return out;
}

std::string ModelRouter::metrics_text() const {
  std::vector<std::pair<std::string, std::string>> texts;
  std::vector<std::pair<std::string, std::shared_ptr<ServedModel>>> live;
  std::ostringstream r;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Entry& e : entries_)
      if (e.served) live.emplace_back(e.spec.name, e.served);
    auto family = [&](const char* name, const char* type, const char* help, auto value) {
      r << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
      for (const Entry& e : entries_) value(e);
    };
    auto lbl = [](const Entry& e) { return "{model=\"" + label_value(e.spec.name) + "\"}"; };
    family("serval_router_model_loaded", "gauge", "1 when the model is in memory, else 0.",
           [&](const Entry& e) { r << "serval_router_model_loaded" << lbl(e) << " " << (e.state == State::loaded) << "\n"; });
    family("serval_router_model_loading", "gauge", "1 while the model loads, else 0.",
           [&](const Entry& e) { r << "serval_router_model_loading" << lbl(e) << " " << (e.state == State::loading) << "\n"; });
    family("serval_router_model_bytes", "gauge", "Memory of the model when loaded (weights + KV pool; estimated before).",
           [&](const Entry& e) { r << "serval_router_model_bytes" << lbl(e) << " " << est_bytes(e) << "\n"; });
    family("serval_router_model_loads_total", "counter", "Times the model was loaded.",
           [&](const Entry& e) { r << "serval_router_model_loads_total" << lbl(e) << " " << e.loads << "\n"; });
    family("serval_router_model_load_failures_total", "counter", "Loads of the model that failed.",
           [&](const Entry& e) { r << "serval_router_model_load_failures_total" << lbl(e) << " " << e.load_failures << "\n"; });
    r << "# HELP serval_router_model_unloads_total Times the model was unloaded, by reason.\n"
         "# TYPE serval_router_model_unloads_total counter\n";
    for (const Entry& e : entries_) {
      const std::string m = label_value(e.spec.name);
      r << "serval_router_model_unloads_total{model=\"" << m << "\",reason=\"lru\"} " << e.evictions << "\n";
      r << "serval_router_model_unloads_total{model=\"" << m << "\",reason=\"idle\"} " << e.idle_unloads << "\n";
      r << "serval_router_model_unloads_total{model=\"" << m << "\",reason=\"admin\"} " << e.admin_unloads << "\n";
    }
    family("serval_router_model_load_seconds", "gauge", "Duration of the model's latest load.",
           [&](const Entry& e) { r << "serval_router_model_load_seconds" << lbl(e) << " " << e.last_load_s << "\n"; });
    family("serval_router_requests_waiting", "gauge", "Requests waiting for the model to load.",
           [&](const Entry& e) { r << "serval_router_requests_waiting" << lbl(e) << " " << e.waiters.size() << "\n"; });
    family("serval_router_requests_rejected_total", "counter",
           "Requests refused (503) because too many were waiting for the model.",
           [&](const Entry& e) { r << "serval_router_requests_rejected_total" << lbl(e) << " " << e.rejected << "\n"; });
  }
  for (auto& [name, s] : live) texts.emplace_back(name, s->api->metrics_text());
  return merge_model_metrics(texts) + r.str();
}

}  // namespace serval::server
