// Reasoning and native tool-call parsing (server/output_parser.h), table
// tests on hand-written model outputs in each template's format, malformed
// ones included; and the streaming form: deltas of every split concatenate
// to the whole-output result.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "server/output_parser.h"

namespace serval {
namespace {

const std::filesystem::path kTemplates = std::filesystem::path(SERVAL_SHARED_DIR) / "chat-templates";

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Reasoning, SplitsThinkBlocks) {
  struct Case {
    const char* text;
    bool starts_inside;
    const char* reasoning;
    const char* content;
  };
  const Case cases[] = {
      {"<think>\nplan it\n</think>\n\nThe answer is 4.", false, "plan it\n", "The answer is 4."},
      {"plan it</think>\n\nFour.", true, "plan it", "Four."},  // template opened the block
      {"No thinking here.", false, "", "No thinking here."},
      {"  <think>a</think>b", false, "a", "b"},
      {"Answer first <think>not reasoning</think>", false, "", "Answer first <think>not reasoning</think>"},
      {"<think>cut off by max_tokens", false, "cut off by max_tokens", ""},
      {"<thin", false, "", "<thin"},  // an unfinished tag at the very end is text
      {"<think></think>Done", false, "", "Done"},
      {"        <think>k</think>A", false, "k", "A"},  // a fuzz finding: spaces, then the tag in pieces
  };
  for (const Case& c : cases) {
    const ReasoningDelta r = split_reasoning(c.text, c.starts_inside);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(r.content, c.content) << c.text;
  }
}

TEST(Reasoning, StreamingDeltasReassemble) {
  const std::string texts[] = {"<think>\nLet me add 2 and 2.\n</think>\n\nIt is 4. <think> stays text",
                               "   <think>x</think>\n y"};
  for (const std::string& text : texts) {
    const ReasoningDelta whole = split_reasoning(text);
    std::mt19937 rng(3);
    for (int trial = 0; trial < 200; ++trial) {
      ReasoningSplitter s;
      std::string r, c;
      size_t i = 0;
      while (i < text.size()) {
        const size_t n = 1 + rng() % 6;
        ReasoningDelta d = s.feed(std::string_view(text).substr(i, n));
        EXPECT_EQ(d.reasoning.find("</think"), std::string::npos);
        r += d.reasoning, c += d.content;
        i += n;
      }
      ReasoningDelta d = s.finish();
      r += d.reasoning, c += d.content;
      ASSERT_EQ(r, whole.reasoning) << text;
      ASSERT_EQ(c, whole.content) << text;
    }
  }
}

TEST(Reasoning, DetectedFromTemplates) {
  EXPECT_TRUE(template_reasons(read(kTemplates / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")));
  EXPECT_TRUE(template_reasons(read(kTemplates / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")));
  EXPECT_FALSE(template_reasons(read(kTemplates / "meta-llama-Llama-3.1-8B-Instruct.jinja")));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>\n"));
}

TEST(ToolCalls, FormatDetectedFromEachTemplate) {
  const std::pair<const char*, ToolCallFormat> cases[] = {
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolCallFormat::hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::hermes},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::hermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::llama3_json},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::llama3_json},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::llama3_json},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::mistral},
      {"meetkai-functionary-medium-v3.1.jinja", ToolCallFormat::functionary31},
      {"meetkai-functionary-medium-v3.2.jinja", ToolCallFormat::functionary32},
      {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ToolCallFormat::command_r},
      {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", ToolCallFormat::command_r7b},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolCallFormat::deepseek_r1},
      {"fireworks-ai-llama-3-firefunction-v2.jinja", ToolCallFormat::firefunction},
      {"google-gemma-2-2b-it.jinja", ToolCallFormat::none},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ToolCallFormat::none},
  };
  for (const auto& [file, want] : cases)
    EXPECT_EQ(detect_tool_call_format(read(kTemplates / file)), want)
        << file << ": got " << tool_call_format_name(detect_tool_call_format(read(kTemplates / file)));
}

struct CallCase {
  ToolCallFormat f;
  std::string text;
  std::string content;
  std::vector<ToolCall> calls;
  // A stream cannot take back a call it has started: outputs whose call
  // turns out malformed only after its header are exact only as a whole.
  bool streams_exactly = true;
  std::string implied = {};  // what the generation prompt already wrote (Functionary v3.2: ">>>")
};

const std::set<std::string> kNames = {"get_weather", "add"};

std::vector<CallCase> call_cases() {
  using F = ToolCallFormat;
  const std::string W = R"({"city": "Paris", "unit": "c"})";
  return {
      // Hermes / Qwen 2.5.
      {F::hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + W + "}\n</tool_call>", "", {{"get_weather", W}}},
      {F::hermes, "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + W + "}\n</tool_call>",
       "Let me check.\n\n", {{"add", R"({"a": 1, "b": 2})"}, {"get_weather", W}}},
      {F::hermes, "No tools needed: 4.", "No tools needed: 4.", {}},
      {F::hermes, "<tool_call>\nnot json at all\n</tool_call>", "<tool_call>\nnot json at all\n</tool_call>", {}},  // malformed
      {F::hermes, "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", {}},  // unknown function
      {F::hermes, "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1", "", {{"add", "{\"a\": 1"}}},  // cut off: OpenAI returns the partial arguments too
      {F::hermes, "<tool_ca", "<tool_ca", {}},
      // Llama 3.x JSON.
      {F::llama3_json, "{\"name\": \"get_weather\", \"parameters\": " + W + "}", "", {{"get_weather", W}}},
      {F::llama3_json, "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}", "", {{"add", R"({"a": 2, "b": 3})"}}},
      {F::llama3_json, "The weather is sunny {\"name\": \"x\"}", "The weather is sunny {\"name\": \"x\"}", {}},
      {F::llama3_json, "{\"answer\": 4}", "{\"answer\": 4}", {}},  // JSON, but not a call
      // Mistral Nemo.
      {F::mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + W + "}, {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 1}}]", "",
       {{"get_weather", W}, {"add", R"({"a": 1, "b": 1})"}}},
      {F::mistral, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", {}},
      // Functionary v3.1 and v3.2.
      {F::functionary31, "<function=get_weather>" + W + "</function>", "", {{"get_weather", W}}},
      {F::functionary31, "<function=get_weather>{\"city\": </function>", "<function=get_weather>{\"city\": </function>", {}, false},
      {F::hermes, "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1,}}</tool_call>", "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1,}}</tool_call>", {}, false},
      {F::functionary32, ">>>get_weather\n" + W, "", {{"get_weather", W}}},
      {F::functionary32, ">>>all\nHello there", "Hello there", {}},  // "all" is the user: text
      // v3.2's generation prompt ends with ">>>": the output starts with the recipient.
      {F::functionary32, "get_weather\n" + W, "", {{"get_weather", W}}, true, ">>>"},
      {F::functionary32, "all\nIt is sunny.", "It is sunny.", {}, true, ">>>"},
      {F::functionary32, "all\nLet me check.>>>get_weather\n" + W, "Let me check.", {{"get_weather", W}}, true, ">>>"},
      {F::functionary32, "get_weather\n" + W + ">>>add\n{\"a\": 1}", "", {{"get_weather", W}, {"add", R"({"a": 1})"}},
       true, ">>>"},
      {F::functionary32, "Hello", "Hello", {}, true, ">>>"},  // no recipient: text, without the prompt's ">>>"
      // Command-R+ and R7B.
      {F::command_r, "Action: ```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": " + W + "\n    }\n]\n```", "", {{"get_weather", W}}},
      {F::command_r7b, "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"add\", \"parameters\": {\"a\": 5, \"b\": 6}}]<|END_ACTION|>", "",
       {{"add", R"({"a": 5, "b": 6})"}}},
      // DeepSeek-R1.
      {F::deepseek_r1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + W + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "",
       {{"get_weather", W}}},
      {F::deepseek_r1, "<｜tool▁calls▁begin｜>garbage", "<｜tool▁calls▁begin｜>garbage", {}},
      // FireFunction v2.
      {F::firefunction, " functools[{\"name\": \"add\", \"arguments\": {\"a\": 7, \"b\": 8}}]", "", {{"add", R"({"a": 7, "b": 8})"}}},
  };
}

TEST(ToolCalls, ParsesEachFormat) {
  for (const CallCase& c : call_cases()) {
    const ParsedOutput p = parse_tool_calls(c.f, c.text, kNames, c.implied);
    EXPECT_EQ(p.content, c.content) << tool_call_format_name(c.f) << ": " << c.text;
    EXPECT_EQ(p.calls, c.calls) << tool_call_format_name(c.f) << ": " << c.text;
  }
}

TEST(ToolCalls, StreamingDeltasReassemble) {
  std::mt19937 rng(11);
  for (const CallCase& c : call_cases()) {
    if (!c.streams_exactly) continue;
    for (int trial = 0; trial < 40; ++trial) {
      ToolCallStreamer s(c.f, kNames, c.implied);
      std::string content;
      std::vector<ToolCall> calls;
      auto apply = [&](const ToolCallDelta& d) {
        content += d.content;
        for (const auto& k : d.calls) {
          if (k.index >= calls.size()) {
            ASSERT_EQ(k.index, calls.size());
            ASSERT_FALSE(k.name.empty()) << "a call's first delta carries its name";
            calls.push_back({k.name, {}});
          }
          calls[k.index].arguments += k.arguments;
        }
      };
      size_t i = 0;
      while (i < c.text.size()) {
        const size_t n = 1 + rng() % 7;
        apply(s.feed(std::string_view(c.text).substr(i, n)));
        i += n;
      }
      apply(s.finish());
      const ParsedOutput whole = parse_tool_calls(c.f, c.text, kNames, c.implied);
      ASSERT_EQ(content, whole.content) << tool_call_format_name(c.f) << ": " << c.text;
      ASSERT_EQ(calls, whole.calls) << tool_call_format_name(c.f) << ": " << c.text;
    }
  }
}

TEST(ToolCalls, NothingHeldBackWithoutAMarker) {
  ToolCallStreamer s(ToolCallFormat::hermes, kNames);
  EXPECT_EQ(s.feed("Hello, ").content, "Hello, ");
  EXPECT_EQ(s.feed("world <tool").content, "world ");  // "<tool" may start a call
  EXPECT_EQ(s.feed("box>").content, "<toolbox>");
}

}  // namespace
}  // namespace serval
