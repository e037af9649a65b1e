// Model output -> what the APIs return: reasoning separated from the answer,
// and tool calls in the model's native format turned into structured calls.
//
// Reasoning: models that think (DeepSeek-R1 distills, Qwen3, ...) write
// `<think>...</think>` before the answer; templates that open the block
// themselves (the generation prompt ends with "<think>") make the output
// start inside it. ReasoningSplitter takes text deltas and returns reasoning
// and content deltas; a tag split across deltas is held back until it is
// decided, never shown as text.
//
// Tool calls: the formats of the chat templates in ../shared/chat-templates:
//   hermes        <tool_call>{"name": .., "arguments": {..}}</tool_call> (Hermes 2/3, Qwen 2.5)
//   llama3_json   {"name": .., "parameters": {..}}, optionally after <|python_tag|> (Llama 3.1-3.3)
//   mistral       [TOOL_CALLS][{"name": .., "arguments": {..}}, ...] (Mistral Nemo)
//   functionary31 <function=NAME>{..}</function> (Functionary v3.1)
//   functionary32 >>>NAME\n{..} (Functionary v3.2; >>>all\n opens text; the
//                 generation prompt writes the first ">>>": implied_prefix)
//   command_r     Action: ```json [{"tool_name": .., "parameters": {..}}] ``` (Command-R+)
//   command_r7b   <|START_ACTION|>[{"tool_name": .., "parameters": {..}}]<|END_ACTION|>
//   deepseek_r1   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//                 ```json {..} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   firefunction  functools[{"name": .., "arguments": {..}}, ...] (FireFunction v2)
// parse_tool_calls() splits a whole output into text and calls; anything
// malformed (bad JSON, an unknown function, an unterminated block) stays
// text — never an error. ToolCallStreamer does the same incrementally:
// content deltas, then per call its name once and its arguments as deltas
// (the argument JSON text as the model writes it), so that the deltas of a
// stream concatenate to the non-streaming result.
//
// Pure functions and small value types; no threads (one streamer per
// choice, used by the thread that serves the request).
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace serval {

// --- reasoning ---

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  // starts_inside: the prompt opened the block (generation prompt ends in "<think>").
  explicit ReasoningSplitter(bool starts_inside = false, std::string open = "<think>", std::string close = "</think>");
  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();  // flushes what was held back (an unclosed tag prefix is text)
  bool inside() const { return inside_; }

 private:
  std::string open_, close_, held_;
  bool inside_ = false;
  bool seen_content_ = false;  // the opening tag counts only before any answer text
  bool strip_ = false;         // newlines right after a tag are layout
};

// Whole output: {reasoning, content}.
ReasoningDelta split_reasoning(std::string_view text, bool starts_inside = false);

// True when a chat template's generation prompt opens a reasoning block or
// its text shows the model reasons in <think> tags.
bool template_reasons(std::string_view template_source);
bool prompt_opens_reasoning(std::string_view rendered_prompt);

// --- tool calls ---

enum class ToolCallFormat {
  none, hermes, llama3_json, mistral, functionary31, functionary32, command_r, command_r7b, deepseek_r1, firefunction
};

const char* tool_call_format_name(ToolCallFormat f);
ToolCallFormat detect_tool_call_format(std::string_view template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object
  bool operator==(const ToolCall&) const = default;
};

struct ParsedOutput {
  std::string content;  // text outside calls (markers removed where calls were found)
  std::vector<ToolCall> calls;
};

// `names`: the declared functions (empty: any name is accepted).
// implied_prefix: what the prompt already wrote of the output's format
// (Functionary v3.2's generation prompt ends with ">>>", the output starts
// with the recipient); it is scanned as if output but never returned as text.
ParsedOutput parse_tool_calls(ToolCallFormat f, std::string_view text, const std::set<std::string>& names = {},
                              std::string_view implied_prefix = {});

struct ToolCallDelta {
  std::string content;  // text to show
  struct Call {
    size_t index = 0;
    std::string name;       // set on the call's first delta
    std::string arguments;  // argument text to append
  };
  std::vector<Call> calls;
};

class ToolCallStreamer {
 public:
  ToolCallStreamer(ToolCallFormat f, std::set<std::string> names = {}, std::string implied_prefix = {});
  ToolCallDelta feed(std::string_view text);
  ToolCallDelta finish();  // the end of the output: anything held back is settled
  size_t n_calls() const { return sent_args_.size(); }

 private:
  ToolCallDelta diff(const ParsedOutput& now, size_t content_ready);
  ToolCallFormat f_;
  std::set<std::string> names_;
  std::string text_;  // the implied prefix, then the output so far
  size_t implied_ = 0;
  size_t sent_content_ = 0;
  std::vector<size_t> sent_args_;
};

}  // namespace serval
