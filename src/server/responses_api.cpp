#include "server/responses_api.h"

#include <chrono>
#include <set>

#include "server/openai_request.h"

namespace serval::server {

using json = nlohmann::ordered_json;

namespace {

std::string item_id(const char* prefix) { return random_hex_id(std::string(prefix) + "_", 32); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError bad(const std::string& param, const std::string& what) { return bad_request(param + ": " + what, param); }

// Text of a message's content: a string, or parts of the given text types.
std::optional<ApiError> content_text(const json& c, const std::string& where, bool assistant, std::string* out) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return bad(where, "expected a string or an array of content parts");
  out->clear();
  for (size_t k = 0; k < c.size(); ++k) {
    const std::string w = where + "[" + std::to_string(k) + "]";
    const json& p = c[k];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      return bad(w, "expected a content part with a string 'type'");
    const std::string type = p["type"].get<std::string>();
    const bool text_part = type == "input_text" || (assistant && (type == "output_text" || type == "refusal"));
    if (!text_part)
      return bad(w + ".type", "content part type '" + type + "' is not supported (" +
                                  (assistant ? "output_text or input_text" : "input_text only: this server runs text models") +
                                  ")");
    const char* key = type == "refusal" ? "refusal" : "text";
    if (!p.contains(key) || !p[key].is_string()) return bad(w + "." + key, "expected a string");
    if (k) *out += "\n";
    *out += p[key].get<std::string>();
  }
  return std::nullopt;
}

// The chat messages of `input`, appended to `msgs`; call ids seen (in the
// history or here) must precede each function_call_output.
std::optional<ApiError> convert_input(const json& input, json* msgs, std::set<std::string>* call_ids) {
  if (input.is_string()) {
    msgs->push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return bad("input", "expected a string or an array of input items");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& it = input[i];
    const std::string w = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) return bad(w, "expected an object");
    std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "";
    if (type.empty() && it.contains("role")) type = "message";
    if (type == "message") {
      if (!it.contains("role") || !it["role"].is_string()) return bad(w + ".role", "expected a string");
      std::string role = it["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(w + ".role", "expected user, assistant, system or developer, got '" + role + "'");
      if (role == "developer") role = "system";
      if (!it.contains("content")) return bad(w + ".content", "required");
      std::string text;
      if (auto e = content_text(it["content"], w + ".content", role == "assistant", &text)) return e;
      msgs->push_back({{"role", role}, {"content", text}});
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!it.contains(k) || !it[k].is_string()) return bad(w + "." + k, "expected a string");
      const std::string id = it["call_id"].get<std::string>();
      if (id.empty()) return bad(w + ".call_id", "must not be empty");
      call_ids->insert(id);
      json call = {{"id", id}, {"type", "function"},
                   {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      // Consecutive calls belong to one assistant turn.
      if (!msgs->empty() && msgs->back()["role"] == "assistant" && msgs->back().contains("tool_calls"))
        msgs->back()["tool_calls"].push_back(std::move(call));
      else
        msgs->push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({std::move(call)})}});
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string()) return bad(w + ".call_id", "expected a string");
      const std::string id = it["call_id"].get<std::string>();
      if (!call_ids->count(id))
        return bad(w + ".call_id", "no function_call with call_id '" + id +
                                       "' in the input or the previous response");
      if (!it.contains("output")) return bad(w + ".output", "required");
      std::string out;
      if (auto e = content_text(it["output"], w + ".output", false, &out)) return e;
      msgs->push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", out}});
    } else if (type == "reasoning") {
      // Earlier reasoning is not shown to the model again.
    } else {
      return bad(w + ".type", "input item type '" + (type.empty() ? std::string("(none)") : type) +
                                  "' is not supported (message, function_call, function_call_output, reasoning)");
    }
  }
  return std::nullopt;
}

// Call ids of a stored conversation's assistant turns.
void collect_call_ids(const json& msgs, std::set<std::string>* ids) {
  for (const json& m : msgs)
    if (m.contains("tool_calls"))
      for (const json& c : m["tool_calls"])
        if (c.contains("id") && c["id"].is_string()) ids->insert(c["id"].get<std::string>());
}

json message_item(const std::string& id, const std::string& text, const char* status) {
  json content = json::array();
  if (std::string(status) != "in_progress")
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}});
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

json reasoning_item(const std::string& id, const std::string& text, bool done) {
  json content = json::array();
  if (done) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"id", id}, {"type", "reasoning"}, {"summary", json::array()}, {"content", content}};
}

json function_call_item(const std::string& id, const std::string& call_id, const json& name, const std::string& args,
                        const char* status) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"call_id", call_id}, {"name", name},
          {"arguments", args}};
}

// The chat request's field names in errors -> this API's.
ApiError rename_param(ApiError e) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"max_tokens", "max_output_tokens"}, {"response_format", "text.format"}, {"messages", "input"}};
  for (const auto& [from, to] : kNames) {
    if (e.param != from) continue;
    e.param = to;
    if (e.message.rfind(std::string(from) + ":", 0) == 0) e.message = to + e.message.substr(std::string(from).size());
  }
  return e;
}

}  // namespace

// --- store ---

void ResponseStore::put(const std::string& id, Entry e) {
  if (!enabled()) return;
  const size_t bytes = e.response.dump().size() + e.messages.dump().size() + id.size() + e.owner.size();
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = map_.find(id); it != map_.end()) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    map_.erase(it);
  }
  if (bytes > max_bytes_) return;
  lru_.push_front(id);
  map_[id] = Slot{std::move(e), bytes, lru_.begin()};
  bytes_ += bytes;
  while (map_.size() > max_entries_ || bytes_ > max_bytes_) {
    const std::string victim = lru_.back();
    lru_.pop_back();
    bytes_ -= map_[victim].bytes;
    map_.erase(victim);
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id, const std::string& owner) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(id);
  if (it == map_.end() || it->second.e.owner != owner) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.e;
}

bool ResponseStore::erase(const std::string& id, const std::string& owner) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(id);
  if (it == map_.end() || it->second.e.owner != owner) return false;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  map_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return map_.size();
}

// --- request ---

std::variant<ResponsesRequest, ApiError> responses_to_chat(const std::string& body, int max_json_depth,
                                                           ResponseStore& store, const std::string& owner) {
  if (json_depth(body) > max_json_depth)
    return bad_request("request body nests deeper than " + std::to_string(max_json_depth) + " levels");
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return bad_request("request body is not valid JSON");
  if (!j.is_object()) return bad_request("request body must be a JSON object");
  for (const char* k : {"background", "conversation", "prompt"})
    if (j.contains(k) && !j[k].is_null() && !(j[k].is_boolean() && !j[k].get<bool>()))
      return bad(k, "not supported by this server");
  ResponsesRequest r;
  json& chat = r.chat;
  json& echo = r.echo;
  chat = json::object();
  echo = json::object();
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return bad("model", "expected a string");
    chat["model"] = j["model"];
  }
  json instructions = nullptr;
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) return bad("instructions", "expected a string");
    instructions = j["instructions"];
  }
  echo["instructions"] = instructions;
  std::set<std::string> call_ids;
  r.messages = json::array();
  json previous = nullptr;
  if (j.contains("previous_response_id") && !j["previous_response_id"].is_null()) {
    if (!j["previous_response_id"].is_string()) return bad("previous_response_id", "expected a string");
    const std::string pid = j["previous_response_id"].get<std::string>();
    auto e = store.enabled() ? store.get(pid, owner) : std::nullopt;
    if (!e)
      return ApiError{400, "previous_response_id: no stored response with id '" + pid + "'" +
                               (store.enabled() ? "" : " (the response store is off on this server)"),
                      "invalid_request_error", "previous_response_id", "previous_response_not_found"};
    r.messages = e->messages;
    collect_call_ids(r.messages, &call_ids);
    previous = pid;
  }
  echo["previous_response_id"] = previous;
  if (!j.contains("input")) return bad("input", "required");
  if (auto e = convert_input(j["input"], &r.messages, &call_ids)) return *e;
  if (r.messages.empty()) return bad("input", "no message to answer");
  json msgs = json::array();
  if (!instructions.is_null()) msgs.push_back({{"role", "system"}, {"content", instructions}});
  for (const json& m : r.messages) msgs.push_back(m);
  chat["messages"] = std::move(msgs);

  echo["max_output_tokens"] = nullptr;
  if (j.contains("max_output_tokens") && !j["max_output_tokens"].is_null()) {
    if (!j["max_output_tokens"].is_number_integer() || j["max_output_tokens"].get<int64_t>() < 1)
      return bad("max_output_tokens", "expected an integer >= 1");
    chat["max_tokens"] = j["max_output_tokens"];
    echo["max_output_tokens"] = j["max_output_tokens"];
  }
  for (const char* k : {"temperature", "top_p"}) {
    echo[k] = 1.0;
    if (!j.contains(k) || j[k].is_null()) continue;
    if (!j[k].is_number()) return bad(k, "expected a number");
    chat[k] = j[k];
    echo[k] = j[k];
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad("stream", "expected a boolean");
    r.stream = j["stream"].get<bool>();
  }
  if (r.stream) {
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}};
  }
  if (j.contains("store") && !j["store"].is_null()) {
    if (!j["store"].is_boolean()) return bad("store", "expected a boolean");
    r.store = j["store"].get<bool>();
  }
  r.store = r.store && store.enabled();
  echo["store"] = r.store;
  echo["metadata"] = json::object();
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    const json& md = j["metadata"];
    if (!md.is_object() || md.size() > 16) return bad("metadata", "expected an object of at most 16 string values");
    for (auto it = md.begin(); it != md.end(); ++it)
      if (!it.value().is_string() || it.key().size() > 64 || it.value().get<std::string>().size() > 512)
        return bad("metadata", "keys of at most 64 and string values of at most 512 characters");
    echo["metadata"] = md;
  }
  echo["parallel_tool_calls"] = true;
  if (j.contains("parallel_tool_calls") && !j["parallel_tool_calls"].is_null()) {
    if (!j["parallel_tool_calls"].is_boolean()) return bad("parallel_tool_calls", "expected a boolean");
    echo["parallel_tool_calls"] = j["parallel_tool_calls"];
  }
  // Tools.
  json tools = json::array();
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return bad("tools", "expected an array");
    for (size_t i = 0; i < j["tools"].size(); ++i) {
      const json& t = j["tools"][i];
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) return bad(w, "expected a tool object with a 'type'");
      if (t["type"] != "function")
        return bad(w + ".type", "only function tools are supported, got '" + t["type"].get<std::string>() + "'");
      if (!t.contains("name") || !t["name"].is_string()) return bad(w + ".name", "required (a string)");
      json fn = {{"name", t["name"]}};
      if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
      if (t.contains("parameters") && !t["parameters"].is_null()) {
        if (!t["parameters"].is_object()) return bad(w + ".parameters", "expected a JSON Schema object");
        fn["parameters"] = t["parameters"];
      }
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
  }
  echo["tools"] = j.contains("tools") && j["tools"].is_array() ? j["tools"] : json::array();
  if (!tools.empty()) chat["tools"] = tools;
  echo["tool_choice"] = "auto";
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const json& tc = j["tool_choice"];
    if (tc.is_string()) {
      const std::string m = tc.get<std::string>();
      if (m != "auto" && m != "none" && m != "required")
        return bad("tool_choice", "expected 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}");
      if (m == "required" && tools.empty()) return bad("tool_choice", "'required' needs tools");
      if (!tools.empty()) chat["tool_choice"] = m;
    } else if (tc.is_object() && tc.contains("type") && tc["type"] == "function" && tc.contains("name") &&
               tc["name"].is_string()) {
      if (tools.empty()) return bad("tool_choice", "names a function but there are no tools");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return bad("tool_choice", "expected 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}");
    }
    echo["tool_choice"] = tc;
  }
  // Output format.
  echo["text"] = {{"format", {{"type", "text"}}}};
  if (j.contains("text") && !j["text"].is_null()) {
    const json& t = j["text"];
    if (!t.is_object()) return bad("text", "expected an object {format: ...}");
    if (t.contains("format") && !t["format"].is_null()) {
      const json& f = t["format"];
      if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
        return bad("text.format", "expected {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
      const std::string type = f["type"].get<std::string>();
      if (type == "json_schema") {
        if (!f.contains("schema")) return bad("text.format.schema", "required with type json_schema");
        if (f.contains("name") && !f["name"].is_string()) return bad("text.format.name", "expected a string");
        json js = {{"name", f.contains("name") ? f["name"] : json("response")}, {"schema", f["schema"]}};
        if (f.contains("strict")) js["strict"] = f["strict"];
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        return bad("text.format.type", "expected 'text', 'json_object' or 'json_schema', got '" + type + "'");
      }
      echo["text"] = {{"format", f}};
    }
  }
  echo["model"] = chat.contains("model") ? chat["model"] : json(nullptr);
  return r;
}

// --- translator ---

ResponsesTranslator::ResponsesTranslator(ResponsesRequest req, ResponseStore* store, std::string owner)
    : req_(std::move(req)), store_(store), owner_(std::move(owner)), id_(item_id("resp")), created_at_(unix_now()) {}

json ResponsesTranslator::response_object(const std::string& status) const {
  json r = {{"id", id_}, {"object", "response"}, {"created_at", created_at_}, {"status", status}};
  r["error"] = nullptr;
  r["incomplete_details"] =
      status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  for (auto it = req_.echo.begin(); it != req_.echo.end(); ++it) r[it.key()] = it.value();
  r["output"] = status == "in_progress" ? json::array() : output_;
  r["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  r["truncation"] = "disabled";
  r["usage"] = usage_;
  return r;
}

std::string ResponsesTranslator::emit(const std::string& type, json ev) {
  json out = {{"type", type}, {"sequence_number", seq_++}};
  for (auto it = ev.begin(); it != ev.end(); ++it) out[it.key()] = it.value();
  return sse_event(type, out);
}

std::string ResponsesTranslator::start_if_needed() {
  if (started_) return {};
  started_ = true;
  std::string out = emit("response.created", {{"response", response_object("in_progress")}});
  return out + emit("response.in_progress", {{"response", response_object("in_progress")}});
}

std::string ResponsesTranslator::open_item(Item kind, json item) {
  std::string out = close_item();
  item_ = kind;
  cur_ = std::move(item);
  text_.clear();
  const auto index = (int64_t)output_.size();
  out += emit("response.output_item.added", {{"output_index", index}, {"item", cur_}});
  if (kind == Item::message)
    out += emit("response.content_part.added",
                {{"item_id", cur_["id"]}, {"output_index", index}, {"content_index", 0},
                 {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}}}});
  return out;
}

std::string ResponsesTranslator::close_item() {
  if (item_ == Item::none) return {};
  std::string out;
  const auto index = (int64_t)output_.size();
  const json id = cur_["id"];
  json done;
  if (item_ == Item::message) {
    done = message_item(id.get<std::string>(), text_, finish_ == "length" ? "incomplete" : "completed");
    out += emit("response.output_text.done",
                {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
    out += emit("response.content_part.done",
                {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", done["content"][0]}});
  } else if (item_ == Item::reasoning) {
    done = reasoning_item(id.get<std::string>(), text_, true);
    out += emit("response.reasoning_text.done", {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
  } else {
    done = function_call_item(id.get<std::string>(), cur_["call_id"].get<std::string>(), cur_["name"], text_, "completed");
    out += emit("response.function_call_arguments.done",
                {{"item_id", id}, {"output_index", index}, {"name", cur_["name"]}, {"arguments", text_}});
  }
  out += emit("response.output_item.done", {{"output_index", index}, {"item", done}});
  output_.push_back(std::move(done));
  item_ = Item::none;
  return out;
}

void ResponsesTranslator::finish_and_store(const std::string& status) {
  if (!req_.store || !store_) return;
  // The conversation continues with this response's output as an assistant turn.
  ResponseStore::Entry e;
  e.owner = owner_;
  e.response = response_object(status);
  e.messages = req_.messages;
  std::string text;
  json calls = json::array();
  for (const json& it : output_) {
    if (it["type"] == "message") text += it["content"][0]["text"].get<std::string>();
    if (it["type"] == "function_call")
      calls.push_back({{"id", it["call_id"]}, {"type", "function"},
                       {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}});
  }
  json turn = {{"role", "assistant"}, {"content", text}};  // "" with calls only: templates concatenate it
  if (!calls.empty()) turn["tool_calls"] = std::move(calls);
  e.messages.push_back(std::move(turn));
  store_->put(id_, std::move(e));
}

static json usage_of(const json& u) {
  const int64_t prompt = u.value("prompt_tokens", int64_t{0}), completion = u.value("completion_tokens", int64_t{0});
  const int64_t cached =
      u.contains("prompt_tokens_details") ? u["prompt_tokens_details"].value("cached_tokens", int64_t{0}) : 0;
  return {{"input_tokens", prompt},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", completion},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", prompt + completion}};
}

std::string ResponsesTranslator::translate_body(int status, const std::string& body) {
  if (status >= 300) return rename_param(parse_openai_error(status, body)).body();
  json chat = json::parse(body, nullptr, false);
  if (chat.is_discarded() || !chat.contains("choices") || chat["choices"].empty()) return body;
  // Copies: a missing member reads as null (const operator[] would not be safe).
  json choice = chat["choices"][0];
  json msg = choice["message"];
  if (req_.echo["model"].is_null()) req_.echo["model"] = chat.value("model", "");
  finish_ = choice.value("finish_reason", "stop");
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string())
    output_.push_back(reasoning_item(item_id("rs"), msg["reasoning_content"].get<std::string>(), true));
  if (msg.contains("content") && msg["content"].is_string() && !msg["content"].get<std::string>().empty())
    // Cut by max_output_tokens only when it is the last item (no call follows).
    output_.push_back(message_item(item_id("msg"), msg["content"].get<std::string>(),
                                   finish_ == "length" && !msg.contains("tool_calls") ? "incomplete" : "completed"));
  if (msg.contains("tool_calls"))
    for (json tc : msg["tool_calls"])
      output_.push_back(function_call_item(item_id("fc"), item_id("call"), tc["function"]["name"],
                                           tc["function"].value("arguments", "{}"), "completed"));
  usage_ = usage_of(chat["usage"]);
  const std::string st = finish_ == "length" ? "incomplete" : "completed";
  finish_and_store(st);
  return json_text(response_object(st));
}

std::string ResponsesTranslator::translate_chunk(const json& chunk) {
  if (finished_) return {};
  if (chunk.contains("error")) {
    finished_ = true;
    const ApiError e = parse_openai_error(500, json_text(chunk));
    std::string out = start_if_needed();
    out += emit("error", {{"code", e.code.empty() ? json(e.type) : json(e.code)}, {"message", e.message}, {"param", nullptr}});
    json failed = response_object("failed");
    failed["error"] = {{"code", "server_error"}, {"message", e.message}};
    return out + emit("response.failed", {{"response", failed}});
  }
  if (req_.echo["model"].is_null() && chunk.contains("model")) req_.echo["model"] = chunk["model"];
  std::string out = start_if_needed();
  if (chunk.contains("usage") && chunk["usage"].is_object()) usage_ = usage_of(chunk["usage"]);
  if (!chunk.contains("choices")) return out;
  for (const json& choice : chunk["choices"]) {
    if (!choice.contains("delta")) continue;
    const json& d = choice["delta"];
    auto str = [&](const json& o, const char* k) {
      return o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
    };
    const auto index = [&] { return (int64_t)output_.size(); };
    if (const std::string r = str(d, "reasoning_content"); !r.empty()) {
      if (item_ != Item::reasoning) out += open_item(Item::reasoning, reasoning_item(item_id("rs"), "", false));
      text_ += r;
      out += emit("response.reasoning_text.delta",
                  {{"item_id", cur_["id"]}, {"output_index", index()}, {"content_index", 0}, {"delta", r}});
    }
    if (const std::string c = str(d, "content"); !c.empty()) {
      if (item_ != Item::message) out += open_item(Item::message, message_item(item_id("msg"), "", "in_progress"));
      text_ += c;
      out += emit("response.output_text.delta", {{"item_id", cur_["id"]},
                                                 {"output_index", index()},
                                                 {"content_index", 0},
                                                 {"delta", c},
                                                 {"logprobs", json::array()}});
    }
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const json& tc : d["tool_calls"]) {
        if (!tc.contains("function")) continue;
        const json& fn = tc["function"];
        if (fn.contains("name") && fn["name"].is_string())
          out += open_item(Item::function_call,
                           function_call_item(item_id("fc"), item_id("call"), fn["name"], "", "in_progress"));
        if (const std::string a = str(fn, "arguments"); !a.empty() && item_ == Item::function_call) {
          text_ += a;
          out += emit("response.function_call_arguments.delta",
                      {{"item_id", cur_["id"]}, {"output_index", index()}, {"delta", a}});
        }
      }
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) finish_ = choice["finish_reason"];
  }
  return out;
}

std::string ResponsesTranslator::translate_done() {
  if (finished_) return {};
  finished_ = true;
  std::string out = start_if_needed();
  out += close_item();
  const std::string st = finish_ == "length" ? "incomplete" : "completed";
  finish_and_store(st);
  return out + emit(st == "completed" ? "response.completed" : "response.incomplete", {{"response", response_object(st)}});
}

}  // namespace serval::server
