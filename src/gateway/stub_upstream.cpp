#include "gateway/stub_upstream.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "gateway/gateway.h"

namespace serval::gateway {

using json = nlohmann::json;

Expected<std::unique_ptr<StubUpstream>> StubUpstream::start(const std::string& host, uint16_t port, const std::string& name,
                                                             int n_threads) {
  std::unique_ptr<StubUpstream> s(new StubUpstream());
  s->name_ = name;
  s->host_ = host;
  http::HttpServerConfig hc;
  hc.host = host;
  hc.port = port;
  hc.n_threads = n_threads;
  StubUpstream* raw = s.get();
  auto server = http::HttpServer::create(
      hc, [raw](http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch) { raw->handle(std::move(req), std::move(ch)); },
      [](int st, const std::string& msg) { return Gateway::error_body(st, msg); });
  if (!server) return server.status();
  s->server_ = std::move(*server);
  s->thread_ = std::thread([raw] { raw->server_->run(); });
  return s;
}

StubUpstream::~StubUpstream() { stop(); }

uint16_t StubUpstream::port() const { return server_->port(); }
std::string StubUpstream::url() const { return "http://" + host_ + ":" + std::to_string(port()); }

void StubUpstream::stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string StubUpstream::last_traceparent() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_traceparent_;
}

void StubUpstream::wait() {
  if (thread_.joinable()) thread_.join();
}

void StubUpstream::handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch) {
  if (req.path == "/health") return ch->send(200, "application/json", R"({"status":"ok"})");
  if (req.path == "/ready")
    return b_.ready.load() ? ch->send(200, "application/json", R"({"status":"ready"})")
                           : ch->send(503, "application/json", R"({"status":"not ready"})");
  if (req.path == "/metrics")
    return ch->send(200, "text/plain; version=0.0.4",
                    "# TYPE serval_requests_running gauge\nserval_requests_running 0\n"
                    "# TYPE serval_requests_waiting gauge\nserval_requests_waiting 0\n"
                    "# TYPE serval_kv_usage_ratio gauge\nserval_kv_usage_ratio 0\n");
  if (req.path == "/v1/models")
    return ch->send(200, "application/json",
                    json{{"object", "list"}, {"data", {{{"id", name_}, {"object", "model"}, {"max_model_len", 4096}}}}}.dump());
  if (req.method != "POST" || (req.path != "/v1/completions" && req.path != "/v1/chat/completions" && req.path != "/v1/embeddings"))
    return ch->send(404, "application/json", Gateway::error_body(404, "no route " + req.path));
  b_.requests.fetch_add(1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    last_traceparent_ = req.header("traceparent");
  }
  if (const int d = b_.delay_ms.load(); d > 0) {
    std::thread([this, req = std::move(req), ch, d] {
      std::this_thread::sleep_for(std::chrono::milliseconds(d));
      answer(req, ch);
    }).detach();
    return;
  }
  answer(req, ch);
}

void StubUpstream::answer(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch) {
  if (const int f = b_.fail_status.load(); f != 0)
    return ch->send(f, "application/json", Gateway::error_body(f, "stub upstream told to fail with " + std::to_string(f)));
  json body = json::parse(req.body, nullptr, false);
  if (!body.is_object()) return ch->send(400, "application/json", Gateway::error_body(400, "body: expected a JSON object"));
  const std::string model = body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : name_;
  const bool chat = req.path == "/v1/chat/completions";
  // Prompt size: characters of the prompt or the messages' contents.
  size_t prompt_chars = 0;
  if (auto p = body.find("prompt"); p != body.end() && p->is_string()) prompt_chars = p->get_ref<const std::string&>().size();
  if (auto ms = body.find("messages"); ms != body.end() && ms->is_array())
    for (const auto& msg : *ms)
      if (msg.is_object() && msg.contains("content") && msg["content"].is_string()) prompt_chars += msg["content"].get_ref<const std::string&>().size();
  if (auto in = body.find("input"); in != body.end() && in->is_string()) prompt_chars = in->get_ref<const std::string&>().size();
  if (const int lim = b_.context_chars.load(); lim > 0 && (int)prompt_chars > lim)
    return ch->send(400, "application/json", Gateway::error_body(400, "prompt longer than the context", "context_length_exceeded"));
  const int64_t pt = (int64_t)prompt_chars / 4 + 1;
  const int n = std::max(0, b_.completion_tokens.load());
  json usage = {{"prompt_tokens", pt}, {"completion_tokens", n}, {"total_tokens", pt + n}};
  if (req.path == "/v1/embeddings") {
    usage = {{"prompt_tokens", pt}, {"total_tokens", pt}};
    return ch->send(200, "application/json",
                    json{{"object", "list"}, {"model", model}, {"data", {{{"object", "embedding"}, {"index", 0}, {"embedding", {0.6, 0.8}}}}}, {"usage", usage}}.dump());
  }
  const bool stream = body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
  const std::string obj = chat ? "chat.completion" : "text_completion";
  if (!stream) {
    std::string text;
    for (int i = 0; i < n; ++i) text += " tok";
    json choice = chat ? json{{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}}, {"finish_reason", "length"}}
                       : json{{"index", 0}, {"text", text}, {"finish_reason", "length"}};
    return ch->send(200, "application/json",
                    json{{"id", "stub-1"}, {"object", obj}, {"created", 0}, {"model", model}, {"choices", {choice}}, {"usage", usage}}.dump());
  }
  bool include_usage = false;
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object())
    if (auto iu = so->find("include_usage"); iu != so->end() && iu->is_boolean()) include_usage = iu->get<bool>();
  ch->start_stream(200, "text/event-stream");
  const int stop_after = b_.stream_stop_after.load();
  for (int i = 0; i < n; ++i) {
    if (stop_after >= 0 && i >= stop_after) return ch->end();
    json choice = chat ? json{{"index", 0}, {"delta", {{"content", " tok"}}}, {"finish_reason", i + 1 == n ? json("length") : json(nullptr)}}
                       : json{{"index", 0}, {"text", " tok"}, {"finish_reason", i + 1 == n ? json("length") : json(nullptr)}};
    ch->write("data: " + json{{"id", "stub-1"}, {"object", obj + (chat ? ".chunk" : "")}, {"model", model}, {"choices", {choice}}}.dump() + "\n\n");
  }
  if (stop_after >= 0 && n >= stop_after && stop_after == n) return ch->end();
  if (include_usage)
    ch->write("data: " + json{{"id", "stub-1"}, {"object", obj}, {"model", model}, {"choices", json::array()}, {"usage", usage}}.dump() + "\n\n");
  ch->write("data: [DONE]\n\n");
  ch->end();
}

}  // namespace serval::gateway
