// Parsing and validation of OpenAI requests (/v1/completions,
// /v1/chat/completions) into engine requests. Every field is type- and
// range-checked before anything is queued; errors name the field.
// Pure functions of their inputs; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "serval/engine.h"
#include "server/api_error.h"
#include "server/structured_output.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {

struct ApiLimits {
  int32_t max_n = 16;
  size_t max_prompts = 64;             // prompts in one completions request
  size_t max_messages = 4096;
  int64_t default_completion_max_tokens = 16;  // OpenAI's default for /v1/completions
  int max_json_depth = 64;
};

struct ParsedRequest {
  bool chat = false;
  std::string model;
  std::vector<std::vector<TokenId>> prompts;  // token ids, one per prompt (chat: one)
  std::vector<std::string> prompt_texts;      // the text of each prompt (echo)
  SamplingParams params;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool logprobs = false;       // chat: logprobs: true; completions: logprobs given
  int32_t top_logprobs = 0;
  // The prompt's log-probs are computed (Request::prompt_logprobs: that many
  // top entries; -1 = not asked): for `echo` with `logprobs` (completions,
  // returned in the choice's logprobs lists) and for vLLM's
  // `prompt_logprobs: N` (returned as `prompt_logprobs`).
  int32_t prompt_logprobs = -1;
  bool vllm_prompt_logprobs = false;  // `prompt_logprobs` was given
  int32_t vllm_prompt_top = 0;        // its N
  bool score_only = false;            // completions with max_tokens 0 (and echo): nothing is generated
  int32_t priority = 0;
  ToolMode tools = ToolMode::off;  // how to read the output (structured_output.h)
  ToolCallFormat tool_format = ToolCallFormat::none;  // with tools: calls in this native format (none: generic JSON)
  std::set<std::string> tool_names;                   // the declared functions
  std::string tool_prefix;  // what the prompt already wrote of the call format (Functionary v3.2: ">>>")
  std::string constraint;                             // the field that constrains the output ("" if none)
};

struct ParseContext {
  const Tokenizer* tok = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat is refused with a 400
  std::string model_name;                      // the served id (answered when "model" is absent)
  std::vector<std::string> model_aliases;      // other ids accepted in "model"
  // A loaded LoRA adapter's name, also accepted in "model" (null: none).
  std::function<bool(const std::string&)> is_adapter;
  int64_t n_vocab = 0;
  int64_t max_model_len = 0;
  ApiLimits limits;
  GrammarCache* grammar_cache = nullptr;  // compiled grammars; null: a process-wide default
  ToolCallFormat tool_format = ToolCallFormat::none;  // the chat template's native tool-call format
};

// Maximum nesting depth of a JSON text (brackets outside strings), computed
// without building it. Used to refuse deeply nested bodies cheaply.
int json_depth(std::string_view text);

// A request body as a JSON object, depth-bounded before it is parsed: the
// object, or the 400 to send (too deep, not JSON, not an object).
std::variant<nlohmann::ordered_json, ApiError> parse_json_object(const std::string& body, int max_depth);

// A request's "model": absent, null or "" is the served name; another name
// must be the served one, an alias or a LoRA adapter's (else 404 model_not_found).
std::optional<ApiError> resolve_model_name(const std::string& name, const ParseContext& ctx, std::string* out);
template <class Json>  // nlohmann::json or ordered_json; null: absent
std::optional<ApiError> resolve_model(const Json* model, const ParseContext& ctx, std::string* out) {
  if (model && !model->is_null() && !model->is_string()) return bad_request("model: expected a string", "model");
  return resolve_model_name(model && model->is_string() ? model->template get<std::string>() : std::string(), ctx,
                            out);
}

// Parses the body; returns the request or the error to send.
std::variant<ParsedRequest, ApiError> parse_openai_request(const std::string& body, bool chat, const ParseContext& ctx);

}  // namespace serval::server
