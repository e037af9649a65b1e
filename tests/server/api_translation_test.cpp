// The Messages and Responses translations (server/anthropic_api.h,
// server/responses_api.h): request bodies -> chat bodies, chat responses and
// chunk streams -> each API's objects and events; a stream's events
// reassemble to the non-streamed object of the same chat answer; the
// response store's bounds and owners.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/anthropic_api.h"
#include "server/responses_api.h"

namespace serval::server {
namespace {

using json = nlohmann::ordered_json;

// A chat answer as the chat path gives it whole, and the chunks it streams:
// reasoning, text, then one tool call (name, then argument pieces).
json chat_whole(const std::string& finish, json stop_reason = nullptr) {
  json msg = {{"role", "assistant"}, {"content", "Hello there"}, {"reasoning_content", "think hard"}};
  msg["tool_calls"] = json::array(
      {{{"id", "call-1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"x":1,"y":"z"})"}}}}});
  return {{"id", "chatcmpl-1"},
          {"object", "chat.completion"},
          {"model", "m"},
          {"choices", json::array({{{"index", 0}, {"message", msg}, {"finish_reason", finish}, {"stop_reason", stop_reason}}})},
          {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 7}, {"total_tokens", 17},
                     {"prompt_tokens_details", {{"cached_tokens", 4}}}}}};
}

std::vector<json> chat_chunks(const std::string& finish, json stop_reason = nullptr) {
  auto chunk = [](json delta, json finish_reason = nullptr, json stop = nullptr) {
    json c = {{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish_reason}};
    if (!finish_reason.is_null()) c["stop_reason"] = stop;
    return json{{"object", "chat.completion.chunk"}, {"model", "m"}, {"choices", json::array({c})}};
  };
  return {chunk({{"role", "assistant"}, {"content", ""}}),
          chunk({{"reasoning_content", "think "}, {"reasoning", "think "}}),
          chunk({{"reasoning_content", "hard"}}),
          chunk({{"content", "Hello"}}),
          chunk({{"content", " there"}}),
          chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call-1"}, {"type", "function"},
                                              {"function", {{"name", "f"}, {"arguments", "{\"x\":"}}}}})}}),
          chunk({{"tool_calls", json::array({{{"index", 0}, {"function", {{"arguments", "1,\"y\":\"z\"}"}}}}})}}),
          chunk(json::object(), finish, stop_reason),
          {{"object", "chat.completion.chunk"}, {"choices", json::array()},
           {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 7}, {"total_tokens", 17},
                      {"prompt_tokens_details", {{"cached_tokens", 4}}}}}}};
}

// SSE bytes -> [(event name, data)].
std::vector<std::pair<std::string, json>> parse_sse(const std::string& s) {
  std::vector<std::pair<std::string, json>> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string ev = s.substr(at, end - at);
    at = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.push_back({ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7))});
    EXPECT_EQ(out.back().second["type"], out.back().first) << "event name = data.type";
  }
  return out;
}

std::string run_stream(ApiTranslator& t, const std::vector<json>& chunks) {
  std::string out;
  for (const json& c : chunks) out += t.translate_chunk(c);
  return out + t.translate_done();
}

// --- Anthropic -----------------------------------------------------------------

// An Anthropic message rebuilt from its stream, as the SDK's MessageStream does.
json anthropic_from_stream(const std::vector<std::pair<std::string, json>>& evs) {
  json msg;
  int open = -1;
  for (const auto& [name, d] : evs) {
    if (name == "message_start") {
      msg = d["message"];
    } else if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started before the previous one stopped";
      EXPECT_EQ(d["index"], msg["content"].size());
      msg["content"].push_back(d["content_block"]);
      open = d["index"];
    } else if (name == "content_block_delta") {
      EXPECT_EQ(d["index"], open);
      json& b = msg["content"][(size_t)open];
      const json& x = d["delta"];
      if (x["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + x["text"].get<std::string>();
      else if (x["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + x["thinking"].get<std::string>();
      else if (x["type"] == "signature_delta") b["signature"] = x["signature"];
      else if (x["type"] == "input_json_delta") b["partial"] = b.value("partial", "") + x["partial_json"].get<std::string>();
    } else if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      json& b = msg["content"][(size_t)open];
      if (b.contains("partial")) {
        b["input"] = json::parse(b["partial"].get<std::string>());
        b.erase("partial");
      }
      open = -1;
    } else if (name == "message_delta") {
      msg["stop_reason"] = d["delta"]["stop_reason"];
      msg["stop_sequence"] = d["delta"]["stop_sequence"];
      msg["usage"]["output_tokens"] = d["usage"]["output_tokens"];
    }
  }
  return msg;
}

TEST(AnthropicTranslation, StreamReassemblesToTheWholeMessage) {
  for (const auto& [finish, stop, want_reason] :
       std::vector<std::tuple<std::string, json, std::string>>{{"tool_calls", nullptr, "tool_use"},
                                                              {"length", nullptr, "max_tokens"},
                                                              {"stop", "END", "stop_sequence"},
                                                              {"stop", nullptr, "end_turn"}}) {
    AnthropicTranslator whole_t("m");
    const json whole = json::parse(whole_t.translate_body(200, chat_whole(finish, stop).dump()));
    ASSERT_EQ(whole["content"].size(), 3u);
    EXPECT_EQ(whole["content"][0], json({{"type", "thinking"}, {"thinking", "think hard"}, {"signature", ""}}));
    EXPECT_EQ(whole["content"][1], json({{"type", "text"}, {"text", "Hello there"}}));
    EXPECT_EQ(whole["content"][2]["type"], "tool_use");
    EXPECT_EQ(whole["content"][2]["input"], json({{"x", 1}, {"y", "z"}}));
    EXPECT_EQ(whole["content"][2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
    EXPECT_EQ(whole["stop_reason"], want_reason);
    EXPECT_EQ(whole["stop_sequence"], want_reason == "stop_sequence" ? json("END") : json(nullptr));
    EXPECT_EQ(whole["usage"]["input_tokens"], 6);  // prompt minus cache reads
    EXPECT_EQ(whole["usage"]["cache_read_input_tokens"], 4);
    EXPECT_EQ(whole["usage"]["output_tokens"], 7);

    AnthropicTranslator t("m");
    t.set_prompt_tokens(10);
    const auto evs = parse_sse(run_stream(t, chat_chunks(finish, stop)));
    ASSERT_GE(evs.size(), 4u);
    EXPECT_EQ(evs.front().first, "message_start");
    EXPECT_EQ(evs.front().second["message"]["usage"]["input_tokens"], 10);
    EXPECT_EQ(evs.back().first, "message_stop");
    json got = anthropic_from_stream(evs);
    // Ids are drawn per object; everything else must agree.
    got["content"][2]["id"] = whole["content"][2]["id"];
    EXPECT_EQ(got["content"], whole["content"]);
    EXPECT_EQ(got["stop_reason"], whole["stop_reason"]);
    EXPECT_EQ(got["stop_sequence"], whole["stop_sequence"]);
    EXPECT_EQ(got["usage"]["output_tokens"], 7);
  }
}

TEST(AnthropicTranslation, ErrorsTakeAnthropicsShape) {
  AnthropicTranslator t("m");
  const json e = json::parse(t.translate_body(400, bad_request("max_tokens: too big", "max_tokens").body()));
  EXPECT_EQ(e, json({{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", "max_tokens: too big"}}}}));
  for (const auto& [status, type] : std::vector<std::pair<int, std::string>>{
           {401, "authentication_error"}, {403, "permission_error"}, {404, "not_found_error"},
           {413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"}})
    EXPECT_EQ(json::parse(anthropic_error_body(status, ApiError{status, "x", "server_error", "", ""}.body()))["error"]["type"], type) << status;
  // Mid-stream: an error event, and nothing after it.
  AnthropicTranslator s("m");
  std::string out = s.translate_chunk(chat_chunks("stop")[3]);
  out += s.translate_chunk(json::parse(ApiError{500, "engine failed", "server_error", "", ""}.body()));
  out += s.translate_chunk(chat_chunks("stop")[4]);
  out += s.translate_done();
  const auto evs = parse_sse(out);
  EXPECT_EQ(evs.back().first, "error");
  EXPECT_EQ(evs.back().second["error"]["message"], "engine failed");
}

TEST(AnthropicTranslation, RequestsBecomeChatBodies) {
  const std::string body = R"({
    "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
    "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "stream": true,
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any"},
    "messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                        {"type": "text", "text": "calling"},
                                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                                   {"type": "tool_result", "tool_use_id": "toolu_1", "content": "bad", "is_error": true},
                                   {"type": "text", "text": "thanks"}]}]})";
  auto r = anthropic_to_chat(body, false, 64);
  ASSERT_TRUE(std::holds_alternative<AnthropicRequest>(r)) << std::get<ApiError>(r).message;
  const json& c = std::get<AnthropicRequest>(r).chat;
  EXPECT_EQ(c["max_tokens"], 50);
  EXPECT_EQ(c["stop"], json::array({"END"}));
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_EQ(c["stream_options"]["include_usage"], true);
  EXPECT_EQ(c["tool_choice"], "required");
  EXPECT_EQ(c["tools"][0]["function"]["parameters"], json({{"type", "object"}}));
  const json& m = c["messages"];
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "A\nB"}}));
  EXPECT_EQ(m[2]["content"], "calling");  // thinking dropped
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "42"}}));
  EXPECT_EQ(m[4]["content"], "Error: bad");
  EXPECT_EQ(m[5], json({{"role", "user"}, {"content", "thanks"}}));
  // count_tokens needs no max_tokens and never streams.
  auto ct = anthropic_to_chat(R"({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]})", true, 64);
  ASSERT_TRUE(std::holds_alternative<AnthropicRequest>(ct));
  EXPECT_FALSE(std::get<AnthropicRequest>(ct).chat.contains("stream"));
}

// --- Responses -----------------------------------------------------------------

json responses_from_stream(const std::vector<std::pair<std::string, json>>& evs) {
  json resp;
  int64_t seq = 0;
  std::map<int64_t, std::string> text;
  for (const auto& [name, d] : evs) {
    EXPECT_EQ(d["sequence_number"], seq++);
    if (name == "response.created") resp = d["response"];
    if (name == "response.output_item.added") {
      EXPECT_EQ(d["output_index"], resp["output"].size());
      resp["output"].push_back(d["item"]);
    }
    if (name == "response.output_text.delta" || name == "response.reasoning_text.delta" ||
        name == "response.function_call_arguments.delta")
      text[d["output_index"].get<int64_t>()] += d["delta"].get<std::string>();
    if (name == "response.output_text.done") {
      EXPECT_EQ(d["text"], text[d["output_index"].get<int64_t>()]);
    }
    if (name == "response.function_call_arguments.done") {
      EXPECT_EQ(d["arguments"], text[d["output_index"].get<int64_t>()]);
    }
    if (name == "response.output_item.done") resp["output"][d["output_index"].get<size_t>()] = d["item"];
    if (name == "response.completed" || name == "response.incomplete") {
      EXPECT_EQ(d["response"]["output"], resp["output"]) << "the final object lists the streamed items";
      resp["status"] = d["response"]["status"];
      resp["usage"] = d["response"]["usage"];
    }
  }
  return resp;
}

json strip_ids(json output) {
  for (json& it : output) {
    it.erase("id");
    if (it.contains("call_id")) it.erase("call_id");
  }
  return output;
}

TEST(ResponsesTranslation, StreamReassemblesToTheWholeResponse) {
  for (const std::string finish : {"tool_calls", "length"}) {
    ResponseStore store(8);
    auto req = responses_to_chat(R"({"input": "hi", "store": false})", 64, store, "o");
    ASSERT_TRUE(std::holds_alternative<ResponsesRequest>(req));
    ResponsesTranslator whole_t(std::get<ResponsesRequest>(req), &store, "o");
    const json whole = json::parse(whole_t.translate_body(200, chat_whole(finish).dump()));
    ASSERT_EQ(whole["output"].size(), 3u);
    EXPECT_EQ(whole["output"][0]["type"], "reasoning");
    EXPECT_EQ(whole["output"][0]["content"][0]["text"], "think hard");
    EXPECT_EQ(whole["output"][1]["content"][0]["text"], "Hello there");
    EXPECT_EQ(whole["output"][2]["arguments"], R"({"x":1,"y":"z"})");
    EXPECT_EQ(whole["status"], finish == "length" ? "incomplete" : "completed");
    EXPECT_EQ(whole["usage"]["input_tokens_details"]["cached_tokens"], 4);
    EXPECT_EQ(whole["model"], "m");

    ResponsesTranslator t(std::get<ResponsesRequest>(req), &store, "o");
    const auto evs = parse_sse(run_stream(t, chat_chunks(finish)));
    EXPECT_EQ(evs.front().first, "response.created");
    EXPECT_EQ(evs.back().first, finish == "length" ? "response.incomplete" : "response.completed");
    const json got = responses_from_stream(evs);
    EXPECT_EQ(strip_ids(got["output"]), strip_ids(whole["output"]));
    EXPECT_EQ(got["usage"], whole["usage"]);
    EXPECT_EQ(store.size(), 0u) << "store: false";
  }
}

TEST(ResponsesTranslation, PreviousResponseContinuesTheConversation) {
  ResponseStore store(8);
  auto first = responses_to_chat(R"({"input": "weather?", "instructions": "be brief"})", 64, store, "alice");
  ASSERT_TRUE(std::holds_alternative<ResponsesRequest>(first));
  ResponsesTranslator t(std::get<ResponsesRequest>(first), &store, "alice");
  const json r1 = json::parse(t.translate_body(200, chat_whole("tool_calls").dump()));
  ASSERT_EQ(store.size(), 1u);
  const std::string call_id = r1["output"][2]["call_id"];
  const std::string body = R"({"previous_response_id": ")" + r1["id"].get<std::string>() +
                           R"(", "input": [{"type": "function_call_output", "call_id": ")" + call_id +
                           R"(", "output": "sunny"}]})";
  auto second = responses_to_chat(body, 64, store, "alice");
  ASSERT_TRUE(std::holds_alternative<ResponsesRequest>(second)) << std::get<ApiError>(second).message;
  const json& m = std::get<ResponsesRequest>(second).chat["messages"];
  ASSERT_EQ(m.size(), 3u) << m.dump();  // instructions are not carried over
  EXPECT_EQ(m[0], json({{"role", "user"}, {"content", "weather?"}}));
  EXPECT_EQ(m[1]["content"], "Hello there");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], call_id);
  EXPECT_EQ(m[2], json({{"role", "tool"}, {"tool_call_id", call_id}, {"content", "sunny"}}));
  // Another owner cannot see it.
  auto stolen = responses_to_chat(body, 64, store, "mallory");
  ASSERT_TRUE(std::holds_alternative<ApiError>(stolen));
  EXPECT_EQ(std::get<ApiError>(stolen).param, "previous_response_id");
}

TEST(ResponsesTranslation, ChatErrorsNameTheResponsesFields) {
  ResponseStore store(0);
  auto req = responses_to_chat(R"({"input": "x"})", 64, store, "o");
  ResponsesTranslator t(std::get<ResponsesRequest>(req), &store, "o");
  const json e = json::parse(t.translate_body(400, bad_request("max_tokens: past the context", "max_tokens").body()));
  EXPECT_EQ(e["error"]["param"], "max_output_tokens");
  EXPECT_EQ(e["error"]["message"], "max_output_tokens: past the context");
  auto prev = responses_to_chat(R"({"input": "x", "previous_response_id": "resp_1"})", 64, store, "o");
  ASSERT_TRUE(std::holds_alternative<ApiError>(prev));
  EXPECT_NE(std::get<ApiError>(prev).message.find("store is off"), std::string::npos);
}

TEST(ResponseStore, BoundedByEntriesAndBytesPerOwner) {
  ResponseStore s(3, 4096);
  auto entry = [](const std::string& owner, size_t pad) {
    return ResponseStore::Entry{owner, json{{"pad", std::string(pad, 'x')}}, json::array()};
  };
  for (int i = 0; i < 4; ++i) s.put("r" + std::to_string(i), entry("a", 10));
  EXPECT_EQ(s.size(), 3u);
  EXPECT_FALSE(s.get("r0", "a"));  // least recently used out
  ASSERT_TRUE(s.get("r1", "a"));   // touches r1
  s.put("r4", entry("a", 10));
  EXPECT_TRUE(s.get("r1", "a"));
  EXPECT_FALSE(s.get("r2", "a"));
  EXPECT_FALSE(s.get("r1", "b"));
  EXPECT_FALSE(s.erase("r1", "b"));
  EXPECT_TRUE(s.erase("r1", "a"));
  s.put("big", entry("a", 5000));  // larger than the whole store: not kept
  EXPECT_FALSE(s.get("big", "a"));
  s.put("half1", entry("a", 1800));
  s.put("half2", entry("a", 1800));
  s.put("half3", entry("a", 1800));  // bytes, not entries, push half1 out
  EXPECT_FALSE(s.get("half1", "a"));
  EXPECT_TRUE(s.get("half3", "a"));
  ResponseStore off(0);
  off.put("x", entry("a", 1));
  EXPECT_FALSE(off.get("x", "a"));
}

}  // namespace
}  // namespace serval::server
