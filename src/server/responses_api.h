// The OpenAI Responses API, served by translation to chat completions
// (api_translation.h):
//   POST   /v1/responses       input (a string or items: messages,
//                              function_call, function_call_output),
//                              instructions, tools (function), tool_choice,
//                              text.format (text / json_object / json_schema),
//                              max_output_tokens, temperature, top_p, stream,
//                              store, previous_response_id, metadata
//   GET    /v1/responses/{id}  a stored response
//   DELETE /v1/responses/{id}
// A response's output items are reasoning (when the model thinks), message
// (output_text) and function_call; status completed, or incomplete with
// reason max_output_tokens. Streams are the Responses event sequence
// (response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta / .done,
// response.function_call_arguments.delta / .done, response.reasoning_text.*,
// response.output_item.done, response.completed / .incomplete; on an error
// `error` then response.failed), every event with a sequence_number.
//
// State: responses with store (the default) are kept in a bounded in-memory
// ResponseStore, per owner (API key), least recently used first out, so that
// previous_response_id continues a conversation (its instructions are not
// carried over, as OpenAI documents). Nothing survives a restart.
#pragma once

#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>

#include "server/api_error.h"
#include "server/api_translation.h"

namespace serval::server {

class ResponseStore {
 public:
  struct Entry {
    std::string owner;
    nlohmann::ordered_json response;  // the response object as returned
    nlohmann::ordered_json messages;  // the conversation so far as chat messages, this response's output included
  };
  // max_entries 0: nothing is stored (previous_response_id is refused).
  explicit ResponseStore(size_t max_entries = 1024, size_t max_bytes = size_t{64} << 20)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}
  bool enabled() const { return max_entries_ > 0; }
  void put(const std::string& id, Entry e);
  // The entry of `owner` (another owner's id reads as absent).
  std::optional<Entry> get(const std::string& id, const std::string& owner);
  bool erase(const std::string& id, const std::string& owner);
  size_t size() const;

 private:
  struct Slot {
    Entry e;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  const size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> map_;
  std::list<std::string> lru_;  // most recent first
  size_t bytes_ = 0;
};

struct ResponsesRequest {
  nlohmann::ordered_json chat;       // the /v1/chat/completions body
  nlohmann::ordered_json echo;       // the request fields a response object repeats
  nlohmann::ordered_json messages;   // the conversation (history + this input) without instructions
  bool stream = false;
  bool store = true;
};

// Parses and checks a Responses body; `store` resolves previous_response_id
// for `owner` (an unknown id is a 400 naming it).
std::variant<ResponsesRequest, ApiError> responses_to_chat(const std::string& body, int max_json_depth,
                                                           ResponseStore& store, const std::string& owner);

class ResponsesTranslator : public ApiTranslator {
 public:
  // req: the parsed request (its echo fields, conversation and store flag).
  ResponsesTranslator(ResponsesRequest req, ResponseStore* store, std::string owner);
  std::string translate_body(int status, const std::string& body) override;
  std::string translate_chunk(const nlohmann::ordered_json& chunk) override;
  std::string translate_done() override;

 private:
  enum class Item { none, reasoning, message, function_call };
  std::string emit(const std::string& type, nlohmann::ordered_json ev);
  nlohmann::ordered_json response_object(const std::string& status) const;
  std::string start_if_needed();
  std::string open_item(Item kind, nlohmann::ordered_json item);
  std::string close_item();
  void finish_and_store(const std::string& status);

  ResponsesRequest req_;
  ResponseStore* store_;
  std::string owner_, id_;
  int64_t created_at_ = 0;
  int64_t seq_ = 0;
  bool started_ = false, finished_ = false;
  // The item being streamed and the items done.
  Item item_ = Item::none;
  nlohmann::ordered_json cur_;    // its object
  std::string text_;              // its text or arguments so far
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  std::string finish_ = "stop";
  nlohmann::ordered_json usage_ = nullptr;
};

}  // namespace serval::server
