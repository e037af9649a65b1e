// The Anthropic Messages API, served by translation to chat completions
// (api_translation.h):
//   POST /v1/messages               system, messages (text, tool_use,
//                                   tool_result blocks), tools, tool_choice,
//                                   max_tokens, stop_sequences, temperature,
//                                   top_p, top_k, stream, thinking, metadata
//   POST /v1/messages/count_tokens  {"input_tokens": N} for the same body
// Responses: a `message` (content blocks thinking / text / tool_use,
// stop_reason end_turn / max_tokens / stop_sequence / tool_use, usage), or the
// event stream message_start, content_block_start / _delta / _stop per block,
// message_delta, message_stop. Errors (everything non-2xx on these routes,
// 401 and 429 included) come as {"type": "error", "error": {"type", "message"}}
// with Anthropic's error types. `x-api-key` is accepted like a Bearer key.
//
// Content this server cannot take (image, document and other non-text
// blocks, server tools) is refused with a 400 naming the block, and a
// tool_result must answer a tool_use of an earlier assistant turn.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "server/api_error.h"
#include "server/api_translation.h"

namespace serval::server {

struct AnthropicRequest {
  nlohmann::ordered_json chat;  // the /v1/chat/completions body
  std::string model;
  bool stream = false;
};

// Parses and checks a Messages body (count_tokens: max_tokens not required,
// nothing generated). max_json_depth bounds the body's nesting.
std::variant<AnthropicRequest, ApiError> anthropic_to_chat(const std::string& body, bool count_tokens,
                                                           int max_json_depth);

// An OpenAI-shaped error body -> Anthropic's (the status picks the type).
std::string anthropic_error_body(int status, const std::string& openai_body);
// The error's Anthropic type for an HTTP status.
const char* anthropic_error_type(int status);

class AnthropicTranslator : public ApiTranslator {
 public:
  explicit AnthropicTranslator(std::string model);
  std::string translate_body(int status, const std::string& body) override;
  std::string translate_chunk(const nlohmann::ordered_json& chunk) override;
  std::string translate_done() override;

 private:
  enum class Block { none, thinking, text, tool_use };
  std::string start_if_needed();
  std::string open_block(Block b, nlohmann::ordered_json content_block);
  std::string close_block();

  std::string model_, id_;
  bool started_ = false, finished_ = false;
  Block block_ = Block::none;
  int index_ = -1;  // the current block's index
  std::string stop_reason_ = "end_turn";
  nlohmann::ordered_json stop_sequence_ = nullptr;
  int64_t output_tokens_ = 0;
};

}  // namespace serval::server
