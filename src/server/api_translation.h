// APIs served by translation to chat completions (the Anthropic Messages API,
// the OpenAI Responses API): the request body becomes a chat-completions body
// that goes through the same parsing, limits, admission and engine path as
// /v1/chat/completions; the chat response — one JSON body, or the SSE chunks
// of a stream — becomes that API's on the way out, in a ResponseChannel that
// wraps the client's.
//
// The chat stream the translators read is serval's own: one
// `data: {chat.completion.chunk}` per write, a usage chunk (include_usage is
// always asked for), then `data: [DONE]`; an error mid-stream is
// `data: {"error": {...}}`. Tool calls arrive as structured `tool_calls`
// deltas (name first, then argument deltas) and reasoning as
// `reasoning_content` deltas, so a translator never parses model text.
//
// Threads: a translator is used by one request, its calls serialized by the
// job that writes (the channel adds no locking of its own).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"
#include "server/http_server.h"

namespace serval::server {

class ApiTranslator {
 public:
  virtual ~ApiTranslator() = default;
  // Before any output: the prompt's size (the start events carry it).
  virtual void set_prompt_tokens(int64_t n) { prompt_tokens_ = n; }
  // A whole (non-streamed) response: the chat JSON body, or an error's
  // OpenAI-shaped body when status is not 2xx -> this API's body.
  virtual std::string translate_body(int status, const std::string& body) = 0;
  // A stream: one chat chunk (or {"error": ...}) -> this API's SSE bytes ("" for none).
  virtual std::string translate_chunk(const nlohmann::ordered_json& chunk) = 0;
  // `data: [DONE]` -> the closing events.
  virtual std::string translate_done() = 0;

 protected:
  int64_t prompt_tokens_ = 0;
};

// One server-sent event with a name: "event: NAME\ndata: JSON\n\n".
std::string sse_event(const std::string& name, const nlohmann::ordered_json& data);
// Compact JSON text (invalid UTF-8 replaced, never thrown on).
std::string json_text(const nlohmann::ordered_json& j);
// prefix + `hex_digits` random hex digits (8..32): the translated APIs' object ids.
std::string random_hex_id(const std::string& prefix, int hex_digits);

// Forwards everything to `inner`, passing bodies and stream writes through
// the translator.
class TranslatingChannel : public http::ResponseChannel {
 public:
  TranslatingChannel(std::shared_ptr<http::ResponseChannel> inner, std::shared_ptr<ApiTranslator> t)
      : inner_(std::move(inner)), t_(std::move(t)) {}
  void send(int status, std::string content_type, std::string body, http::Headers extra = {}) override;
  void start_stream(int status, std::string content_type, http::Headers extra = {}) override {
    inner_->start_stream(status, std::move(content_type), std::move(extra));
  }
  void write(std::string data) override;
  void end() override { inner_->end(); }
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }
  bool disconnected() const override { return inner_->disconnected(); }

 private:
  std::shared_ptr<http::ResponseChannel> inner_;
  std::shared_ptr<ApiTranslator> t_;
};

// Rewrites the body of every non-2xx JSON answer with `error_body` (an
// OpenAI-shaped error in, this API's shape out): the errors a route gives
// before a request reaches its translator (401, 405, 413, 429, 503).
class ErrorShapeChannel : public http::ResponseChannel {
 public:
  using Reshape = std::string (*)(int status, const std::string& openai_body);
  ErrorShapeChannel(std::shared_ptr<http::ResponseChannel> inner, Reshape reshape)
      : inner_(std::move(inner)), reshape_(reshape) {}
  void send(int status, std::string content_type, std::string body, http::Headers extra = {}) override {
    if (status >= 300) body = reshape_(status, body);
    inner_->send(status, std::move(content_type), std::move(body), std::move(extra));
  }
  void start_stream(int status, std::string content_type, http::Headers extra = {}) override {
    inner_->start_stream(status, std::move(content_type), std::move(extra));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end() override { inner_->end(); }
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }
  bool disconnected() const override { return inner_->disconnected(); }

 private:
  std::shared_ptr<http::ResponseChannel> inner_;
  Reshape reshape_;
};

// The fields of an OpenAI-shaped error body ({"error": {"message", "type",
// "param", "code"}}); a body that is not one becomes a server_error.
ApiError parse_openai_error(int status, const std::string& body);

}  // namespace serval::server
