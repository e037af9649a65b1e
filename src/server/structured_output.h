// Structured output on the OpenAI API: the request fields that constrain
// generation to a grammar, and the tool-call responses built from it.
// docs/STRUCTURED_OUTPUT.md documents the fields.
//
//   response_format: {"type": "text" | "json_object" | "json_schema",
//                     "json_schema": {"name", "schema", "strict"}}
//   grammar (GBNF), regex, choice (array of strings); vLLM's guided_grammar,
//   guided_regex, guided_choice, guided_json are accepted as aliases.
//   tools + tool_choice (chat only): auto | none | required |
//     {"type": "function", "function": {"name"}}
//
// At most one constraint per request. Compiled grammars come from a bounded
// GrammarCache shared by all requests. Errors are 400s naming the field and
// the problem (malformed, left-recursive, over a budget). Thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "sampler/grammar/grammar_cache.h"
#include "server/api_error.h"
#include "server/output_parser.h"
#include "serval/sampling_params.h"

namespace serval::server {

enum class ToolMode {
  off,       // no tools, or tool_choice "none"
  optional,  // "auto": text, or a call (output starting with '{' must be a call)
  required,  // "required" or a named function: the output is a call
};

struct StructuredOutput {
  std::shared_ptr<const CompiledGrammar> grammar;  // null: unconstrained
  std::string source;                              // the field it came from (tools, response_format, grammar, ...)
  ToolMode tools = ToolMode::off;
  // With tools: the model's native call format the grammar produces (none:
  // the generic {"name", "arguments"} object) and the declared names.
  ToolCallFormat tool_format = ToolCallFormat::none;
  std::set<std::string> tool_names;
};

// The native formats the tool grammar can produce: calls as JSON objects,
// alone or in a list, between fixed markers (hermes, llama3_json, mistral,
// firefunction, command_r, command_r7b). Others fall back to the generic form.
bool tool_format_constrainable(ToolCallFormat f);

// Reads the structured-output fields of a request body. `chat`: tools are
// only accepted on /v1/chat/completions. `native`: the chat template's
// tool-call format (detect_tool_call_format); constrained calls are written
// in it when tool_format_constrainable().
std::variant<StructuredOutput, ApiError> parse_structured_output(const nlohmann::ordered_json& body, bool chat,
                                                                 GrammarCache& cache,
                                                                 ToolCallFormat native = ToolCallFormat::none);

// If `text` is a tool call as the tool grammar produces it
// ({"name": ..., "arguments": {...}}), the OpenAI tool_calls entry:
// {"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}.
std::optional<nlohmann::ordered_json> parse_tool_call(const std::string& text, const std::string& id);

}  // namespace serval::server
