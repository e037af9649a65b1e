#include "server/structured_output.h"

#include <cstdio>
#include <set>
#include <sstream>
#include <variant>
#include <vector>

namespace serval::server {

using json = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxTools = 128;
constexpr size_t kMaxChoices = 1024;

ApiError grammar_error(const Status& st, const std::string& param) {
  return bad_request(param + ": " + st.message(), param, "invalid_grammar");
}

// Tool calls as one JSON Schema: anyOf {"name": const, "arguments": parameters}
// (the keys as the call format names them). Each tool's $defs / definitions
// move to the root so its local refs resolve.
std::variant<json, ApiError> tools_schema(const json& tools, const std::string& only, const char* name_key = "name",
                                          const char* args_key = "arguments") {
  json any = json::array();
  json defs = json::object();
  for (const json& t : tools) {
    const json& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    json params = fn.contains("parameters") && !fn["parameters"].is_null()
                      ? fn["parameters"]
                      : json{{"type", "object"}, {"properties", json::object()}};
    if (!params.is_object()) return bad_request("tools: function '" + name + "': parameters must be an object", "tools");
    for (const char* key : {"$defs", "definitions"}) {
      if (!params.contains(key)) continue;
      if (!params[key].is_object()) return bad_request(std::string("tools: ") + key + " must be an object", "tools");
      for (auto& [k, v] : params[key].items()) {
        if (defs.contains(k) && defs[k] != v)
          return bad_request("tools: two tools define '" + k + "' differently in $defs", "tools");
        defs[k] = v;
      }
      params.erase(key);
    }
    any.push_back({{"type", "object"},
                   {"properties", {{name_key, {{"const", name}}}, {args_key, params}}},
                   {"required", {name_key, args_key}}});
  }
  if (any.empty()) return bad_request("tool_choice: no tool named '" + only + "' in tools", "tool_choice");
  json schema = {{"anyOf", any}};
  if (!defs.empty()) {
    schema["$defs"] = defs;
    schema["definitions"] = defs;
  }
  return schema;
}

struct NativeWrap {
  const char* prefix;
  const char* suffix;
  const char* name_key;
  const char* args_key;
};

// Formats that write the function name outside the JSON: one alternative per
// tool, `before NAME after ARGS suffix`, with each tool's own argument rules.
struct NamedWrap {
  const char* before;
  const char* after;
  const char* suffix;
  const char* first;  // how a call starts (auto: text must not)
  // Auto: text starts with this instead (Functionary v3.2 writes "all\n"
  // where the prompt's ">>>" expects a recipient); nullptr: not `first`.
  const char* text_prefix = nullptr;
};

std::optional<NamedWrap> named_wrap(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::functionary31: return NamedWrap{"<function=", ">", "</function>", "<function="};
    // The generation prompt ends with ">>>": the output starts with the recipient.
    case ToolCallFormat::functionary32: return NamedWrap{"", "\n", "", "", "all\n"};
    case ToolCallFormat::deepseek_r1:
      return NamedWrap{"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n",
                       "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜>"};
    default: return std::nullopt;
  }
}

std::optional<NativeWrap> native_wrap(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: return NativeWrap{"<tool_call>\n", "\n</tool_call>", "name", "arguments"};
    case ToolCallFormat::llama3_json: return NativeWrap{"", "", "name", "parameters"};
    case ToolCallFormat::mistral: return NativeWrap{"[TOOL_CALLS][", "]", "name", "arguments"};
    case ToolCallFormat::firefunction: return NativeWrap{" functools[", "]", "name", "arguments"};
    case ToolCallFormat::command_r7b: return NativeWrap{"<|START_ACTION|>[", "]<|END_ACTION|>", "tool_name", "parameters"};
    case ToolCallFormat::command_r: return NativeWrap{"Action: ```json\n[", "]\n```", "tool_name", "parameters"};
    default: return std::nullopt;
  }
}

// GBNF for any text that does not start with `p` (the empty text included),
// code point by code point.
std::string not_starting_with(const std::string& p) {
  std::vector<std::string> cps;  // p's code points as UTF-8
  for (size_t i = 0; i < p.size();) {
    const unsigned char b = (unsigned char)p[i];
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    cps.push_back(p.substr(i, n));
    i += n;
  }
  auto code_point = [](const std::string& u) {
    const unsigned char b = (unsigned char)u[0];
    uint32_t c = u.size() == 1 ? b : u.size() == 2 ? b & 0x1F : u.size() == 3 ? b & 0x0F : b & 0x07;
    for (size_t k = 1; k < u.size(); ++k) c = (c << 6) | ((unsigned char)u[k] & 0x3F);
    return c;
  };
  std::string e;
  for (size_t k = cps.size(); k-- > 0;) {
    char cls[24];
    std::snprintf(cls, sizeof cls, "[^\\U%08X]", code_point(cps[k]));
    e = "(\"\" | " + std::string(cls) + " .*" + (k + 1 < cps.size() ? " | " + gbnf_literal(cps[k]) + " " + e : "") + ")";
  }
  return e;
}

}  // namespace

bool tool_format_constrainable(ToolCallFormat f) { return native_wrap(f).has_value() || named_wrap(f).has_value(); }

namespace {

// One grammar for "NAME-outside-JSON" formats: every (selected) tool's
// argument schema compiled under its own rule prefix, shared primitives once.
Expected<GrammarPtr> named_tools_grammar(const std::vector<std::pair<std::string, std::string>>& tools, const NamedWrap& w,
                                         bool optional) {
  std::string calls, rules;
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string prefix = "t" + std::to_string(i) + "-";
    auto g = json_schema_to_gbnf_rules(tools[i].second, prefix);
    if (!g.ok()) return g.status().with_context("tools: function '" + tools[i].first + "'");
    std::string line;
    std::istringstream in(*g);
    while (std::getline(in, line))
      if (!line.empty() && seen.insert(line).second) rules += line + "\n";
    calls += (calls.empty() ? "" : " | ") + gbnf_literal(std::string(w.before) + tools[i].first + w.after) + " " +
             prefix + "root" + (*w.suffix ? " " + gbnf_literal(w.suffix) : std::string());
  }
  const std::string text_rule = w.text_prefix ? gbnf_literal(w.text_prefix) + " .*" : not_starting_with(w.first);
  std::string src = optional ? "root ::= tool-call | auto-text\nauto-text ::= " + text_rule + "\n" : "root ::= tool-call\n";
  return compile_gbnf(src + "tool-call ::= " + calls + "\n" + rules);
}

}  // namespace

namespace {

// obj[key] when it is a string, else "" (json::value(key, "") throws when the
// member exists with another type).
std::string string_member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<ApiError> check_tools(const json& tools) {
  if (!tools.is_array() || tools.empty()) return bad_request("tools: expected a non-empty array", "tools");
  if (tools.size() > kMaxTools) return bad_request("tools: at most " + std::to_string(kMaxTools) + " tools", "tools");
  for (const json& t : tools) {
    if (!t.is_object() || string_member(t, "type") != "function" || !t.contains("function") || !t["function"].is_object())
      return bad_request("tools: each tool must be {\"type\": \"function\", \"function\": {...}}", "tools");
    const json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      return bad_request("tools: each function needs a non-empty string 'name'", "tools");
  }
  return std::nullopt;
}

}  // namespace

std::variant<StructuredOutput, ApiError> parse_structured_output(const json& body, bool chat, GrammarCache& cache,
                                                                 ToolCallFormat native) {
  StructuredOutput out;
  auto get = [&](const char* key) -> const json* {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  // Each source: (param name, cache key, compile).
  struct Source {
    std::string param, key;
    std::function<Expected<GrammarPtr>()> compile;
  };
  std::vector<Source> sources;
  auto string_field = [&](const char* key, const char* kind, Expected<GrammarPtr> (*fn)(std::string_view, const GrammarLimits&))
      -> std::optional<ApiError> {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) return bad_request(std::string(key) + ": expected a string", key);
    std::string text = v->get<std::string>();
    sources.push_back({key, std::string(kind) + '\0' + text, [fn, text] { return fn(text, GrammarLimits{}); }});
    return std::nullopt;
  };
  auto gbnf = [](std::string_view t, const GrammarLimits& l) { return compile_gbnf(t, l); };
  auto regex = [](std::string_view t, const GrammarLimits& l) { return compile_regex(t, l); };
  for (const char* key : {"grammar", "guided_grammar"})
    if (auto e = string_field(key, "gbnf", +gbnf)) return *e;
  for (const char* key : {"regex", "guided_regex"})
    if (auto e = string_field(key, "regex", +regex)) return *e;
  for (const char* key : {"choice", "guided_choice"}) {
    const json* v = get(key);
    if (!v) continue;
    if (!v->is_array() || v->empty() || v->size() > kMaxChoices)
      return bad_request(std::string(key) + ": expected an array of 1 to " + std::to_string(kMaxChoices) + " strings", key);
    std::vector<std::string> choices;
    for (const json& c : *v) {
      if (!c.is_string()) return bad_request(std::string(key) + ": expected an array of strings", key);
      choices.push_back(c.get<std::string>());
    }
    sources.push_back({key, "choice\0" + v->dump(), [choices] { return compile_choice(choices); }});
  }
  auto schema_source = [&](const std::string& param, const json& schema) {
    const std::string text = schema.dump();
    sources.push_back({param, "schema\0" + text, [text] { return compile_json_schema(text); }});
  };
  if (const json* v = get("guided_json")) schema_source("guided_json", *v);
  if (const json* rf = get("response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      return bad_request("response_format: expected an object with a string 'type'", "response_format");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_object") {
      sources.push_back({"response_format", "json_object", [] { return compile_json_object(); }});
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return bad_request("response_format.json_schema: expected an object {name, schema, strict}", "response_format");
      if (js->contains("name") && !(*js)["name"].is_string())
        return bad_request("response_format.json_schema.name: expected a string", "response_format");
      if (js->contains("strict") && !(*js)["strict"].is_null() && !(*js)["strict"].is_boolean())
        return bad_request("response_format.json_schema.strict: expected a boolean", "response_format");
      auto sc = js->find("schema");
      if (sc == js->end() || !(sc->is_object() || sc->is_boolean()))
        return bad_request("response_format.json_schema.schema: expected a JSON Schema object", "response_format");
      schema_source("response_format", *sc);
    } else if (type != "text") {
      return bad_request("response_format.type: expected 'text', 'json_object' or 'json_schema', got '" + type + "'",
                         "response_format");
    }
  }
  if (const json* tools = get("tools")) {
    if (!chat) return bad_request("tools: only supported on /v1/chat/completions", "tools");
    if (auto e = check_tools(*tools)) return *e;
    std::string mode = "auto", only;
    if (const json* tc = get("tool_choice")) {
      if (tc->is_string()) {
        mode = tc->get<std::string>();
        if (mode != "auto" && mode != "none" && mode != "required")
          return bad_request("tool_choice: expected 'auto', 'none', 'required' or {\"type\": \"function\", ...}, got '" +
                                 mode + "'",
                             "tool_choice");
      } else if (tc->is_object() && string_member(*tc, "type") == "function" && tc->contains("function") &&
                 (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
                 (*tc)["function"]["name"].is_string()) {
        mode = "required";
        only = (*tc)["function"]["name"].get<std::string>();
      } else {
        return bad_request("tool_choice: expected 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                           "tool_choice");
      }
    }
    if (mode != "none" && named_wrap(native)) {
      // The name outside the JSON: per-tool argument grammars.
      out.tools = mode == "auto" ? ToolMode::optional : ToolMode::required;
      out.tool_format = native;
      std::vector<std::pair<std::string, std::string>> selected;
      for (const json& t : *tools) {
        const json& fn = t["function"];
        const std::string name = fn["name"].get<std::string>();
        out.tool_names.insert(name);
        if (!only.empty() && name != only) continue;
        json params = fn.contains("parameters") && !fn["parameters"].is_null()
                          ? fn["parameters"]
                          : json{{"type", "object"}, {"properties", json::object()}};
        if (!params.is_object()) return bad_request("tools: function '" + name + "': parameters must be an object", "tools");
        selected.push_back({name, params.dump()});
      }
      if (selected.empty()) return bad_request("tool_choice: no tool named '" + only + "' in tools", "tool_choice");
      std::string key = std::string("named-tools\0", 12) + mode + '\0' + tool_call_format_name(native);
      for (const auto& [n, p] : selected) key += '\0' + n + '\0' + p;
      const NamedWrap w = *named_wrap(native);
      const bool optional = mode == "auto";
      sources.push_back({"tools", key, [selected, w, optional] { return named_tools_grammar(selected, w, optional); }});
    } else if (mode != "none") {
      const std::optional<NativeWrap> wrap = native_wrap(native);
      auto schema = wrap ? tools_schema(*tools, only, wrap->name_key, wrap->args_key) : tools_schema(*tools, only);
      if (auto* e = std::get_if<ApiError>(&schema)) return *e;
      const std::string text = std::get<json>(schema).dump();
      const bool optional = mode == "auto";
      out.tools = optional ? ToolMode::optional : ToolMode::required;
      for (const json& t : *tools) out.tool_names.insert(t["function"]["name"].get<std::string>());
      if (wrap) {
        out.tool_format = native;
        const NativeWrap w = *wrap;
        sources.push_back({"tools", std::string("tools\0", 6) + mode + '\0' + tool_call_format_name(native) + '\0' + text,
                           [text, optional, w]() -> Expected<GrammarPtr> {
                             auto g = json_schema_to_gbnf(text);
                             if (!g.ok()) return g.status();
                             // The call in the template's own format; with "auto", or text
                             // that does not start like one.
                             const std::string call = (*w.prefix ? gbnf_literal(w.prefix) + " " : std::string()) +
                                                      "tool-json" + (*w.suffix ? " " + gbnf_literal(w.suffix) : std::string());
                             const std::string first = *w.prefix ? std::string(w.prefix) : std::string("{");
                             std::string src = optional ? "root ::= tool-call | auto-text\nauto-text ::= " +
                                                              not_starting_with(first) + "\ntool-call ::= " + call + "\n"
                                                        : "root ::= " + call + "\n";
                             return compile_gbnf(src + "tool-json" + g->substr(4));
                           }});
      } else {
      sources.push_back({"tools", std::string("tools\0", 6) + mode + '\0' + text, [text, optional]() -> Expected<GrammarPtr> {
                           if (!optional) return compile_json_schema(text);
                           auto g = json_schema_to_gbnf(text);
                           if (!g.ok()) return g.status();
                           // A call, or text that does not start with '{'.
                           std::string src = "root ::= tool-call | auto-text\nauto-text ::= ([^{] .*)?\ntool-call" +
                                             g->substr(4);
                           return compile_gbnf(src);
                         }});
      }
    }
  } else if (get("tool_choice")) {
    const json* tc = get("tool_choice");
    if (!(tc->is_string() && (tc->get<std::string>() == "none" || tc->get<std::string>() == "auto")))
      return bad_request("tool_choice: requires tools", "tool_choice");
  }
  if (sources.empty()) return out;
  if (sources.size() > 1)
    return bad_request("only one of response_format (json), grammar, regex, choice and tools may constrain the output; got " +
                           sources[0].param + " and " + sources[1].param,
                       sources[1].param);
  auto g = cache.get(sources[0].key, sources[0].compile);
  if (!g.ok()) return grammar_error(g.status(), sources[0].param);
  out.grammar = *g;
  out.source = sources[0].param;
  return out;
}

std::optional<json> parse_tool_call(const std::string& text, const std::string& id) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("arguments"))
    return std::nullopt;
  return json{{"id", id},
              {"type", "function"},
              {"function", {{"name", j["name"]}, {"arguments", j["arguments"].dump()}}}};
}

}  // namespace serval::server
