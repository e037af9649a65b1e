// libFuzzer harness: model output -> reasoning split and native tool-call
// parsing (src/server/output_parser.h). Model output is untrusted text; the
// parsers must never crash, loop or allocate without bound, and for each
// split of the input into deltas the streamed content/calls must stay
// within what the whole-output parse returns (the stream never shows text
// twice or calls that are not there). First byte: the format; second: the
// delta size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/output_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace serval;
  if (size < 2 || size > 1 << 16) return 0;
  const auto f = (ToolCallFormat)(data[0] % 10);
  const size_t step = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  const ReasoningDelta whole_r = split_reasoning(text, data[1] & 1);
  ReasoningSplitter rs(data[1] & 1);
  std::string r, c;
  for (size_t i = 0; i < text.size(); i += step) {
    ReasoningDelta d = rs.feed(text.substr(i, step));
    r += d.reasoning, c += d.content;
  }
  ReasoningDelta d = rs.finish();
  r += d.reasoning, c += d.content;
  if (r != whole_r.reasoning || c != whole_r.content) __builtin_trap();  // reasoning streams exactly

  const std::set<std::string> names = {"get_weather", "add"};
  const ParsedOutput whole = parse_tool_calls(f, text, data[1] & 2 ? names : std::set<std::string>{});
  if (whole.content.size() > text.size()) __builtin_trap();
  ToolCallStreamer s(f, data[1] & 2 ? names : std::set<std::string>{});
  size_t streamed = 0;
  for (size_t i = 0; i < text.size(); i += step) streamed += s.feed(text.substr(i, step)).content.size();
  streamed += s.finish().content.size();
  if (streamed > text.size()) __builtin_trap();
  return 0;
}
