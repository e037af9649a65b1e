#include "server/anthropic_api.h"

#include <set>

#include "server/openai_request.h"

namespace serval::server {

using json = nlohmann::ordered_json;

namespace {

// "msg_" / "toolu_" + 24 hex digits, like Anthropic's ids.
std::string anthropic_id(const char* prefix) { return random_hex_id(prefix, 24); }

ApiError bad(const std::string& where, const std::string& what) {
  return bad_request(where + ": " + what, where.substr(0, where.find('.')));
}

bool is_text_block(const json& b) { return b.is_object() && b.value("type", "") == "text"; }

// A string, or an array of text blocks (joined with "\n"); the error otherwise.
std::optional<ApiError> text_of(const json& v, const std::string& where, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return bad(where, "expected a string or an array of text blocks");
  out->clear();
  for (size_t k = 0; k < v.size(); ++k) {
    const std::string w = where + "." + std::to_string(k);
    if (!v[k].is_object() || !v[k].contains("type") || !v[k]["type"].is_string())
      return bad(w, "expected a content block with a string 'type'");
    if (!is_text_block(v[k]))
      return bad(w + ".type", "content block type '" + v[k]["type"].get<std::string>() +
                                  "' is not supported here (text only: this server runs text models)");
    if (!v[k].contains("text") || !v[k]["text"].is_string()) return bad(w + ".text", "expected a string");
    if (k) *out += "\n";
    *out += v[k]["text"].get<std::string>();
  }
  return std::nullopt;
}

// One Anthropic message -> chat messages appended to `out`. tool_use ids of
// assistant turns go into `ids`; a tool_result must name one of them.
std::optional<ApiError> convert_message(const json& m, size_t i, std::set<std::string>* ids, json* out) {
  const std::string where = "messages." + std::to_string(i);
  if (!m.is_object()) return bad(where, "expected an object");
  if (!m.contains("role") || !m["role"].is_string()) return bad(where + ".role", "expected 'user' or 'assistant'");
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant")
    return bad(where + ".role", "expected 'user' or 'assistant', got '" + role + "' (the system prompt is 'system')");
  if (!m.contains("content")) return bad(where + ".content", "required");
  const json& content = m["content"];
  if (content.is_string()) {
    out->push_back({{"role", role}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array()) return bad(where + ".content", "expected a string or an array of content blocks");
  std::string text;
  bool has_text = false;
  json calls = json::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const json& b = content[k];
    const std::string w = where + ".content." + std::to_string(k);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return bad(w, "expected a content block with a string 'type'");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return bad(w + ".text", "expected a string");
      if (has_text) text += "\n";
      text += b["text"].get<std::string>();
      has_text = true;
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("id") || !b["id"].is_string() || b["id"].get<std::string>().empty())
        return bad(w + ".id", "expected a non-empty string");
      if (!b.contains("name") || !b["name"].is_string()) return bad(w + ".name", "expected a string");
      if (!b.contains("input") || !b["input"].is_object()) return bad(w + ".input", "expected an object");
      ids->insert(b["id"].get<std::string>());
      calls.push_back({{"id", b["id"]},
                       {"type", "function"},
                       {"function", {{"name", b["name"]}, {"arguments", json_text(b["input"])}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) return bad(w + ".tool_use_id", "expected a string");
      const std::string id = b["tool_use_id"].get<std::string>();
      if (!ids->count(id))
        return bad(w + ".tool_use_id", "no tool_use block with id '" + id + "' in an earlier assistant turn");
      std::string result;
      if (b.contains("content") && !b["content"].is_null())
        if (auto e = text_of(b["content"], w + ".content", &result)) return e;
      if (b.contains("is_error") && !b["is_error"].is_boolean()) return bad(w + ".is_error", "expected a boolean");
      if (b.value("is_error", false)) result = "Error: " + result;
      out->push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else if ((type == "thinking" || type == "redacted_thinking") && role == "assistant") {
      // Earlier reasoning is not shown to the model again (as the templates drop it).
    } else if (type == "tool_use" || type == "tool_result" || type == "thinking" || type == "redacted_thinking") {
      return bad(w + ".type", "a '" + type + "' block belongs in " +
                                  (type == "tool_result" ? "a user" : "an assistant") + " message");
    } else {
      return bad(w + ".type", "content block type '" + type +
                                  "' is not supported (this server takes text, tool_use and tool_result blocks)");
    }
  }
  if (role == "assistant") {
    // Content "" rather than null with calls only: templates concatenate it.
    json msg = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    if (has_text || msg.contains("tool_calls")) out->push_back(std::move(msg));
  } else if (has_text) {
    out->push_back({{"role", "user"}, {"content", text}});
  }
  return std::nullopt;
}

}  // namespace

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string anthropic_error_body(int status, const std::string& openai_body) {
  const ApiError e = parse_openai_error(status, openai_body);
  return json_text(json{{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", e.message}}}});
}

std::variant<AnthropicRequest, ApiError> anthropic_to_chat(const std::string& body, bool count_tokens,
                                                           int max_json_depth) {
  if (json_depth(body) > max_json_depth)
    return bad_request("request body nests deeper than " + std::to_string(max_json_depth) + " levels");
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return bad_request("request body is not valid JSON");
  if (!j.is_object()) return bad_request("request body must be a JSON object");
  AnthropicRequest r;
  json& chat = r.chat;
  chat = json::object();
  if (!j.contains("model") || !j["model"].is_string()) return bad("model", "required (a string)");
  r.model = j["model"].get<std::string>();
  chat["model"] = r.model;
  if (!count_tokens) {
    if (!j.contains("max_tokens")) return bad("max_tokens", "required");
    if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1)
      return bad("max_tokens", "expected an integer >= 1");
    chat["max_tokens"] = j["max_tokens"];
  }
  json messages = json::array();
  if (j.contains("system") && !j["system"].is_null()) {
    std::string sys;
    if (auto e = text_of(j["system"], "system", &sys)) return *e;
    messages.push_back({{"role", "system"}, {"content", sys}});
  }
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    return bad("messages", "required (a non-empty array)");
  std::set<std::string> ids;
  for (size_t i = 0; i < j["messages"].size(); ++i)
    if (auto e = convert_message(j["messages"][i], i, &ids, &messages)) return *e;
  if (messages.empty() || (messages.size() == 1 && messages[0]["role"] == "system"))
    return bad("messages", "no text to answer");
  chat["messages"] = std::move(messages);
  if (j.contains("stop_sequences") && !j["stop_sequences"].is_null()) {
    const json& s = j["stop_sequences"];
    if (!s.is_array()) return bad("stop_sequences", "expected an array of strings");
    for (const auto& x : s)
      if (!x.is_string()) return bad("stop_sequences", "expected an array of strings");
    if (!s.empty()) chat["stop"] = s;
  }
  for (const char* k : {"temperature", "top_p", "top_k"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    if (!j[k].is_number()) return bad(k, "expected a number");
    chat[k] = j[k];
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad("stream", "expected a boolean");
    r.stream = j["stream"].get<bool>() && !count_tokens;
  }
  if (r.stream) {
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}};
  }
  if (j.contains("metadata") && !j["metadata"].is_null() && !j["metadata"].is_object())
    return bad("metadata", "expected an object");
  if (j.contains("thinking") && !j["thinking"].is_null()) {
    const json& t = j["thinking"];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string() ||
        (t["type"] != "enabled" && t["type"] != "disabled"))
      return bad("thinking", "expected {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
  }
  bool any_tools = false;
  if (j.contains("tools") && !j["tools"].is_null()) {
    const json& tools = j["tools"];
    if (!tools.is_array()) return bad("tools", "expected an array");
    json out = json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      const std::string w = "tools." + std::to_string(i);
      if (!t.is_object()) return bad(w, "expected an object");
      if (t.contains("type") && !t["type"].is_null() && t["type"] != "custom")
        return bad(w + ".type", "server tools ('" + (t["type"].is_string() ? t["type"].get<std::string>() : "?") +
                                    "') are not supported; define the tool with name, description and input_schema");
      if (!t.contains("name") || !t["name"].is_string()) return bad(w + ".name", "required (a string)");
      if (!t.contains("input_schema") || !t["input_schema"].is_object())
        return bad(w + ".input_schema", "required (a JSON Schema object)");
      json fn = {{"name", t["name"]}, {"parameters", t["input_schema"]}};
      if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
      out.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!out.empty()) {
      chat["tools"] = std::move(out);
      any_tools = true;
    }
  }
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const json& tc = j["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      return bad("tool_choice", "expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const std::string type = tc["type"].get<std::string>();
    if (type != "auto" && type != "any" && type != "tool" && type != "none")
      return bad("tool_choice.type", "expected 'auto', 'any', 'tool' or 'none', got '" + type + "'");
    if (type != "none" && type != "auto" && !any_tools) return bad("tool_choice", "'" + type + "' needs tools");
    if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string()) return bad("tool_choice.name", "required with type 'tool'");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else if (any_tools) {
      chat["tool_choice"] = type == "any" ? "required" : type;
    }
  }
  return r;
}

AnthropicTranslator::AnthropicTranslator(std::string model) : model_(std::move(model)), id_(anthropic_id("msg_")) {}

std::string AnthropicTranslator::translate_body(int status, const std::string& body) {
  if (status >= 300) return anthropic_error_body(status, body);
  json chat = json::parse(body, nullptr, false);
  if (chat.is_discarded() || !chat.contains("choices") || chat["choices"].empty())
    return anthropic_error_body(500, body);
  // Copies: a missing member reads as null (const operator[] would not be safe).
  json choice = chat["choices"][0];
  json msg = choice["message"];
  json content = json::array();
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string())
    content.push_back({{"type", "thinking"}, {"thinking", msg["reasoning_content"]}, {"signature", ""}});
  if (msg.contains("content") && msg["content"].is_string() && !msg["content"].get<std::string>().empty())
    content.push_back({{"type", "text"}, {"text", msg["content"]}});
  if (msg.contains("tool_calls"))
    for (json tc : msg["tool_calls"]) {
      json input = json::parse(tc["function"].value("arguments", "{}"), nullptr, false);
      if (input.is_discarded() || !input.is_object()) input = json::object();
      content.push_back(
          {{"type", "tool_use"}, {"id", anthropic_id("toolu_")}, {"name", tc["function"]["name"]}, {"input", input}});
    }
  const std::string finish = choice.value("finish_reason", "stop");
  std::string stop_reason = "end_turn";
  json stop_sequence = nullptr;
  if (finish == "length") stop_reason = "max_tokens";
  else if (finish == "tool_calls") stop_reason = "tool_use";
  else if (choice.contains("stop_reason") && choice["stop_reason"].is_string()) {
    stop_reason = "stop_sequence";
    stop_sequence = choice["stop_reason"];
  }
  json u = chat["usage"];
  const int64_t prompt = u.value("prompt_tokens", int64_t{0});
  const int64_t cached = u.contains("prompt_tokens_details") ? u["prompt_tokens_details"].value("cached_tokens", int64_t{0}) : 0;
  json out = {{"id", id_},
              {"type", "message"},
              {"role", "assistant"},
              {"model", chat.value("model", model_)},
              {"content", content},
              {"stop_reason", stop_reason},
              {"stop_sequence", stop_sequence},
              {"usage",
               {{"input_tokens", prompt - cached},
                {"cache_creation_input_tokens", 0},
                {"cache_read_input_tokens", cached},
                {"output_tokens", u.value("completion_tokens", int64_t{0})}}}};
  return json_text(out);
}

std::string AnthropicTranslator::start_if_needed() {
  if (started_) return {};
  started_ = true;
  json msg = {{"id", id_},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model_},
              {"content", json::array()},
              {"stop_reason", nullptr},
              {"stop_sequence", nullptr},
              {"usage", {{"input_tokens", prompt_tokens_}, {"output_tokens", 0}}}};
  return sse_event("message_start", {{"type", "message_start"}, {"message", msg}}) +
         sse_event("ping", {{"type", "ping"}});
}

std::string AnthropicTranslator::open_block(Block b, json content_block) {
  std::string out = close_block();
  block_ = b;
  ++index_;
  out += sse_event("content_block_start",
                   {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
  return out;
}

std::string AnthropicTranslator::close_block() {
  if (block_ == Block::none) return {};
  std::string out;
  if (block_ == Block::thinking)
    out += sse_event("content_block_delta", {{"type", "content_block_delta"},
                                             {"index", index_},
                                             {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  block_ = Block::none;
  return out + sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicTranslator::translate_chunk(const json& chunk) {
  if (finished_) return {};
  if (chunk.contains("error")) {
    finished_ = true;
    const int status = 500;
    const ApiError e = parse_openai_error(status, json_text(chunk));
    const char* type = e.type == "timeout_error" ? "timeout_error" : anthropic_error_type(status);
    return sse_event("error", {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}});
  }
  std::string out = start_if_needed();
  if (chunk.contains("usage") && chunk["usage"].is_object())
    output_tokens_ = chunk["usage"].value("completion_tokens", output_tokens_);
  if (!chunk.contains("choices")) return out;
  for (const json& choice : chunk["choices"]) {
    if (!choice.contains("delta")) continue;
    const json& d = choice["delta"];
    auto delta = [&](json body) {
      out += sse_event("content_block_delta",
                       {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(body)}});
    };
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string() &&
        !d["reasoning_content"].get<std::string>().empty()) {
      if (block_ != Block::thinking)
        out += open_block(Block::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      delta({{"type", "thinking_delta"}, {"thinking", d["reasoning_content"]}});
    }
    if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty()) {
      if (block_ != Block::text) out += open_block(Block::text, {{"type", "text"}, {"text", ""}});
      delta({{"type", "text_delta"}, {"text", d["content"]}});
    }
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const json& tc : d["tool_calls"]) {
        if (!tc.contains("function")) continue;
        const json& fn = tc["function"];
        if (fn.contains("name") && fn["name"].is_string())
          out += open_block(Block::tool_use, {{"type", "tool_use"},
                                              {"id", anthropic_id("toolu_")},
                                              {"name", fn["name"]},
                                              {"input", json::object()}});
        if (block_ == Block::tool_use && fn.contains("arguments") && fn["arguments"].is_string() &&
            !fn["arguments"].get<std::string>().empty())
          delta({{"type", "input_json_delta"}, {"partial_json", fn["arguments"]}});
      }
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      const std::string f = choice["finish_reason"].get<std::string>();
      if (f == "length") stop_reason_ = "max_tokens";
      else if (f == "tool_calls") stop_reason_ = "tool_use";
      else if (choice.contains("stop_reason") && choice["stop_reason"].is_string()) {
        stop_reason_ = "stop_sequence";
        stop_sequence_ = choice["stop_reason"];
      }
    }
  }
  return out;
}

std::string AnthropicTranslator::translate_done() {
  if (finished_) return {};
  finished_ = true;
  std::string out = start_if_needed();
  out += close_block();
  out += sse_event("message_delta", {{"type", "message_delta"},
                                     {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}}},
                                     {"usage", {{"output_tokens", output_tokens_}}}});
  return out + sse_event("message_stop", {{"type", "message_stop"}});
}

}  // namespace serval::server
