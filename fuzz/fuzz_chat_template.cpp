// Chat-template compiler and renderer: the input is the template source;
// accepted templates are rendered with a realistic chat context. Any outcome
// but a crash, a sanitizer report, a timeout or an allocation past the
// libFuzzer limits is fine: the budgets (ChatTemplateLimits) must stop
// runaway templates with an error. The step budget is lowered from the
// server's default so each execution stays fast; depth limits stay as served.
#include <cstdint>
#include <string_view>

#include "fuzz_common.h"

using namespace serval;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = [] {
    auto messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Hi <b>there</b> \u00e9"},
      {"role": "assistant", "content": "Hello.", "tool_calls": [{"type": "function",
        "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
      {"role": "tool", "content": "42"},
      {"role": "user", "content": [{"type": "text", "text": "part"}]}])");
    ChatContextOptions opt;
    opt.bos_token = "<s>";
    opt.eos_token = "</s>";
    opt.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"x": {"type": "array"}}}}}])");
    auto c = build_chat_context(messages, opt);
    if (!c.ok()) fuzz::die(c.status().message());
    return *c;
  }();
  ChatTemplateLimits limits;
  limits.max_steps = 200'000;
  limits.max_loop_iterations = 20'000;
  limits.max_alloc_bytes = 64u << 20;
  auto t = ChatTemplate::compile(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!t.ok()) {
    fuzz::require(!t.status().message().empty(), "a compile error has a message");
    return 0;
  }
  ChatTemplateRenderOptions ro;
  ro.now_unix_seconds = 1700000000;
  auto out = t->render(context, ro);
  if (out.ok()) fuzz::require(out->size() <= limits.max_output_bytes, "output within max_output_bytes");
  else fuzz::require(!out.status().message().empty(), "a render error has a message");
  return 0;
}
