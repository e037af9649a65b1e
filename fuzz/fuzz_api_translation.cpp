// libFuzzer harness: the Anthropic Messages and OpenAI Responses request
// bodies (untrusted, from clients) -> chat bodies, and the translators fed
// arbitrary chat bodies and chunk streams (src/server/anthropic_api.h,
// responses_api.h, api_translation.h). Nothing may crash or throw out of the
// channel; an accepted request is always a chat body with a non-empty
// messages array; every SSE event the translators write is complete.
// First byte: which path (and count_tokens / store flags); the rest: the body,
// or for the translators newline-separated chunks.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "server/anthropic_api.h"
#include "server/responses_api.h"

namespace {

using json = nlohmann::ordered_json;

// Collects what a translator writes; checks each write is whole SSE events.
class Sink : public serval::http::ResponseChannel {
 public:
  void send(int, std::string, std::string, serval::http::Headers) override {}
  void start_stream(int, std::string, serval::http::Headers) override {}
  void write(std::string data) override {
    if (data.size() < 2 || data.compare(data.size() - 2, 2, "\n\n") != 0) __builtin_trap();
  }
  void end() override {}
  void on_disconnect(std::function<void()>) override {}
  bool disconnected() const override { return false; }
};

void check_chat(const json& chat) {
  if (!chat.is_object() || !chat.contains("messages") || !chat["messages"].is_array() || chat["messages"].empty())
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace serval::server;
  if (size < 1 || size > 1 << 16) return 0;
  const uint8_t mode = data[0];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  static ResponseStore store(4);
  switch (mode % 4) {
    case 0: {
      auto r = anthropic_to_chat(body, mode & 4, 64);
      if (auto* a = std::get_if<AnthropicRequest>(&r)) check_chat(a->chat);
      break;
    }
    case 1: {
      auto r = responses_to_chat(body, 64, store, mode & 4 ? "a" : "b");
      if (auto* q = std::get_if<ResponsesRequest>(&r)) check_chat(q->chat);
      break;
    }
    default: {
      // A translator over arbitrary chat output: whole bodies and chunk streams.
      std::shared_ptr<ApiTranslator> t;
      if (mode % 4 == 2) {
        t = std::make_shared<AnthropicTranslator>("m");
      } else {
        auto r = responses_to_chat(R"({"input": "x"})", 64, store, "a");
        t = std::make_shared<ResponsesTranslator>(std::get<ResponsesRequest>(r), &store, "a");
      }
      TranslatingChannel ch(std::make_shared<Sink>(), t);
      if (mode & 4) {
        ch.send(mode & 8 ? 400 : 200, "application/json", body);
      } else {
        size_t at = 0;
        while (at <= body.size()) {
          size_t nl = body.find('\n', at);
          if (nl == std::string::npos) nl = body.size();
          ch.write("data: " + body.substr(at, nl - at) + "\n\n");
          at = nl + 1;
        }
        ch.write("data: [DONE]\n\n");
      }
    }
  }
  return 0;
}
