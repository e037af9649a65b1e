// JSON Schema -> GBNF (grammar.h).
//
// Supported: type (one or a list), properties / required (declared order;
// required ones always, optional ones may be left out), additionalProperties
// (absent or false: no other keys are generated; true or a schema: any
// number of extra keys), enum, const, items, prefixItems, minItems /
// maxItems, minLength / maxLength, pattern (see regex_to_gbnf), format
// (date, time, date-time, uuid; others are annotations), anyOf / oneOf
// (alternatives; oneOf does not exclude overlaps), $ref to "#" or any JSON
// pointer into the schema ($defs, definitions), recursive schemas.
// Keywords that constrain values in ways the grammar cannot express
// (minimum, maximum, multipleOf, allOf, not, uniqueItems, ...) are rejected
// with an error naming them, rather than silently producing invalid output.
// Annotations (title, description, default, examples, $schema, $id, ...)
// are ignored. Output JSON is compact: one optional space after , : { [.
#include <chrono>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "sampler/grammar/grammar.h"
#include "sampler/grammar/grammar_internal.h"

namespace serval {

namespace {

using json = nlohmann::ordered_json;  // keeps the declared property order

const char* const kPrimitives[][2] = {
    {"space", "\" \"?"},
    {"boolean", "(\"true\" | \"false\") space"},
    {"null", "\"null\" space"},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})"},
    {"string", "\"\\\"\" char* \"\\\"\" space"},
    {"integer", "\"-\"? ([0-9] | [1-9] [0-9]{0,15}) space"},
    {"number", "\"-\"? ([0-9] | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space"},
    {"value", "object | array | string | number | boolean | null"},
    {"object", "\"{\" space (string \":\" space value (\",\" space string \":\" space value)*)? \"}\" space"},
    {"array", "\"[\" space (value (\",\" space value)*)? \"]\" space"},
    {"date", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])"},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
};

const std::set<std::string> kUnsupported = {
    "allOf", "not", "if", "then", "else", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "patternProperties", "propertyNames", "minProperties", "maxProperties", "uniqueItems",
    "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};

class Converter {
 public:
  Converter(const json& root, const GrammarLimits& lim) : root_(root), lim_(lim) {
    start_ = std::chrono::steady_clock::now();
  }

  Expected<std::string> run() {
    const std::string body = visit(root_, "root", "", 0);
    if (!err_.ok()) return err_;
    std::string out = "root ::= " + body + "\n";
    for (const auto& [name, def] : rules_) out += name + " ::= " + def + "\n";
    if (out.size() > lim_.max_source_bytes) return too_big();
    return out;
  }

 private:
  const json& root_;
  const GrammarLimits& lim_;
  std::chrono::steady_clock::time_point start_;
  Status err_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;  // $ref -> rule name
  size_t out_bytes_ = 0;

  Status too_big() {
    return Status(StatusCode::resource_exhausted, "json_schema: the grammar exceeds the size limit of " +
                                                      std::to_string(lim_.max_source_bytes) + " bytes");
  }
  std::string fail(const std::string& path, const std::string& m) {
    if (err_.ok()) err_ = invalid_argument("json_schema: at " + (path.empty() ? std::string("#") : path) + ": " + m);
    return "space";
  }
  std::string exhausted(const std::string& path, const std::string& m) {
    if (err_.ok())
      err_ = Status(StatusCode::resource_exhausted, "json_schema: at " + (path.empty() ? std::string("#") : path) + ": " + m);
    return "space";
  }

  std::string primitive(const std::string& name) {
    for (const auto& p : kPrimitives)
      if (name == p[0]) {
        if (!rules_.count(name)) {
          rules_[name] = p[1];
          // Dependencies.
          if (name == "string" || name == "object") primitive("char");
          if (name == "value" || name == "object" || name == "array") {
            for (const char* d : {"object", "array", "string", "number", "boolean", "null"}) primitive(d);
          }
          if (name != "char" && name != "date" && name != "time" && name != "uuid") primitive("space");
        }
        return name;
      }
    return fail("", "internal: unknown primitive " + name);
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    std::string base;
    for (char c : hint) base += (std::isalnum((unsigned char)c) ? c : '-');
    if (base.empty()) base = "r";
    if (base.size() > 40) base.resize(40);
    std::string name = base;
    for (int i = 1; rules_.count(name) || name == "root"; ++i) name = base + "-" + std::to_string(i);
    out_bytes_ += name.size() + body.size() + 6;
    if (out_bytes_ > lim_.max_source_bytes) {
      if (err_.ok()) err_ = too_big();
    }
    rules_[name] = body;
    return name;
  }

  const json* resolve(const std::string& ref) {
    if (ref.empty() || ref[0] != '#') return nullptr;
    const json* cur = &root_;
    size_t i = 1;
    while (i < ref.size()) {
      if (ref[i] != '/') return nullptr;
      size_t j = ref.find('/', i + 1);
      if (j == std::string::npos) j = ref.size();
      std::string tok = ref.substr(i + 1, j - i - 1);
      for (size_t k; (k = tok.find("~1")) != std::string::npos;) tok.replace(k, 2, "/");
      for (size_t k; (k = tok.find("~0")) != std::string::npos;) tok.replace(k, 2, "~");
      if (cur->is_object()) {
        auto it = cur->find(tok);
        if (it == cur->end()) return nullptr;
        cur = &*it;
      } else if (cur->is_array()) {
        if (tok.empty() || tok.size() > 9 || tok.find_first_not_of("0123456789") != std::string::npos) return nullptr;
        const size_t idx = std::stoul(tok);
        if (idx >= cur->size()) return nullptr;
        cur = &(*cur)[idx];
      } else {
        return nullptr;
      }
      i = j;
    }
    return cur;
  }

  uint32_t count(const json& s, const char* key, const std::string& path, uint32_t dflt) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_unsigned()) return fail(path, std::string(key) + ": expected a non-negative integer"), 0;
    const uint64_t v = it->get<uint64_t>();
    if (v > lim_.max_repetition)
      return exhausted(path, std::string(key) + " " + std::to_string(v) + " exceeds the limit of " +
                                 std::to_string(lim_.max_repetition)),
             0;
    return (uint32_t)v;
  }

  // "x" repeated between lo and hi (hi < 0: unbounded) times, separated by sep.
  static std::string repeat_sep(const std::string& x, const std::string& sep, uint32_t lo, int64_t hi) {
    if (hi == 0) return "\"\"";
    const std::string more = "(" + sep + " " + x + ")";
    std::string rest;
    const uint32_t rlo = lo > 0 ? lo - 1 : 0;
    if (hi < 0) rest = more + "{" + std::to_string(rlo) + ",}";
    else rest = more + "{" + std::to_string(rlo) + "," + std::to_string(hi - 1) + "}";
    const std::string one = x + " " + rest;
    return lo == 0 ? "(" + one + ")?" : one;
  }

  std::string visit(const json& s, const std::string& hint, const std::string& path, size_t depth) {
    if (!err_.ok()) return "space";
    if (depth > lim_.max_nesting)
      return exhausted(path, "schema nesting exceeds the limit of " + std::to_string(lim_.max_nesting));
    if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count() > lim_.max_compile_ms)
      return exhausted(path, "compile time exceeds the limit of " + std::to_string((int)lim_.max_compile_ms) + " ms");
    if (s.is_boolean()) return s.get<bool>() ? primitive("value") : fail(path, "the schema 'false' matches nothing");
    if (!s.is_object()) return fail(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items())
      if (kUnsupported.count(k)) return fail(path, "keyword '" + k + "' is not supported for constrained decoding");

    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) return fail(path, "$ref: expected a string");
      const std::string ref = it->get<std::string>();
      if (auto r = refs_.find(ref); r != refs_.end()) return r->second;
      const json* target = resolve(ref);
      if (!target) return fail(path, "$ref '" + ref + "' does not resolve (only local refs '#...' are supported)");
      std::string hint_name = "ref" + ref.substr(ref.rfind('/') == std::string::npos ? 1 : ref.rfind('/'));
      const std::string name = add_rule(hint_name, "space");
      refs_[ref] = name;
      rules_[name] = visit(*target, name, ref, depth + 1);
      return name;
    }
    if (auto it = s.find("const"); it != s.end()) return gbnf_literal(it->dump()) + " space";
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return fail(path, "enum: expected a non-empty array");
      std::string alts;
      for (const json& v : *it) alts += (alts.empty() ? "" : " | ") + gbnf_literal(v.dump());
      primitive("space");
      return "(" + alts + ") space";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) {
        if (!it->is_array() || it->empty()) return fail(path, std::string(key) + ": expected a non-empty array");
        std::string alts;
        for (size_t i = 0; i < it->size(); ++i)
          alts += (i ? " | " : "") + visit((*it)[i], hint + "-" + std::to_string(i),
                                           path + "/" + key + "/" + std::to_string(i), depth + 1);
        return add_rule(hint, alts);
      }
    }
    std::string type;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_array()) {
        std::string alts;
        for (const json& t : *it) {
          if (!t.is_string()) return fail(path, "type: expected strings");
          json sub = s;
          sub["type"] = t;
          alts += (alts.empty() ? "" : " | ") + visit(sub, hint + "-" + t.get<std::string>(), path, depth + 1);
        }
        if (alts.empty()) return fail(path, "type: expected a non-empty list");
        return "(" + alts + ")";
      }
      if (!it->is_string()) return fail(path, "type: expected a string or a list of strings");
      type = it->get<std::string>();
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      type = "object";
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      type = "array";
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      type = "string";
    }
    if (type.empty()) return primitive("value");
    if (type == "object") return object(s, hint, path, depth);
    if (type == "array") return array(s, hint, path, depth);
    if (type == "string") return string(s, hint, path);
    if (type == "number" || type == "integer" || type == "boolean" || type == "null") return primitive(type);
    return fail(path, "type: unknown type '" + type + "'");
  }

  std::string string(const json& s, const std::string& hint, const std::string& path) {
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return fail(path, "pattern: expected a string");
      std::string re = it->get<std::string>();
      auto e = regex_to_gbnf_expr(re, lim_);
      if (!e.ok()) {
        if (err_.ok()) err_ = e.status().with_context("json_schema: at " + (path.empty() ? std::string("#") : path) + ": pattern");
        return "space";
      }
      primitive("space");
      return add_rule(hint, "\"\\\"\" " + *e + " \"\\\"\" space");
    }
    if (auto it = s.find("format"); it != s.end() && it->is_string()) {
      const std::string f = it->get<std::string>();
      std::string body;
      if (f == "date") body = primitive("date");
      else if (f == "time") body = primitive("time");
      else if (f == "date-time") body = primitive("date") + " \"T\" " + primitive("time");
      else if (f == "uuid") body = primitive("uuid");
      if (!body.empty()) {
        primitive("space");
        return add_rule(hint, "\"\\\"\" " + body + " \"\\\"\" space");
      }
    }
    const uint32_t lo = count(s, "minLength", path, 0);
    const int64_t hi = s.contains("maxLength") ? (int64_t)count(s, "maxLength", path, 0) : -1;
    if (hi >= 0 && hi < lo) return fail(path, "maxLength < minLength");
    if (lo == 0 && hi < 0) return primitive("string");
    primitive("char");
    primitive("space");
    const std::string rep = "{" + std::to_string(lo) + "," + (hi < 0 ? std::string() : std::to_string(hi)) + "}";
    return add_rule(hint, "\"\\\"\" char" + rep + " \"\\\"\" space");
  }

  std::string array(const json& s, const std::string& hint, const std::string& path, size_t depth) {
    primitive("space");
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) return fail(path, "prefixItems: expected an array");
      std::string body = "\"[\" space";
      for (size_t i = 0; i < it->size(); ++i)
        body += std::string(i ? " \",\" space " : " ") +
                visit((*it)[i], hint + "-" + std::to_string(i), path + "/prefixItems/" + std::to_string(i), depth + 1);
      return add_rule(hint, body + " \"]\" space");
    }
    std::string item = "value";
    if (auto it = s.find("items"); it != s.end()) item = visit(*it, hint + "-item", path + "/items", depth + 1);
    else primitive("value");
    const uint32_t lo = count(s, "minItems", path, 0);
    const int64_t hi = s.contains("maxItems") ? (int64_t)count(s, "maxItems", path, 0) : -1;
    if (!err_.ok()) return "space";
    if (hi >= 0 && hi < lo) return fail(path, "maxItems < minItems");
    return add_rule(hint, "\"[\" space " + repeat_sep(item, "\",\" space", lo, hi) + " \"]\" space");
  }

  std::string object(const json& s, const std::string& hint, const std::string& path, size_t depth) {
    primitive("space");
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return fail(path, "required: expected an array of strings");
      for (const json& r : *it) {
        if (!r.is_string()) return fail(path, "required: expected an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    struct Kv {
      std::string expr;
      bool required;
    };
    std::vector<Kv> kvs;
    std::set<std::string> declared;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return fail(path, "properties: expected an object");
      for (const auto& [k, v] : it->items()) {
        declared.insert(k);
        const std::string val = visit(v, hint + "-" + k, path + "/properties/" + k, depth + 1);
        kvs.push_back({gbnf_literal(json(k).dump()) + " space \":\" space " + val, required.count(k) > 0});
      }
    }
    for (const std::string& r : required)
      if (!declared.count(r)) kvs.push_back({gbnf_literal(json(r).dump()) + " space \":\" space " + primitive("value"), true});
    std::string extra;  // one additional key-value pair, or empty
    if (auto it = s.find("additionalProperties"); it != s.end() && !(it->is_boolean() && !it->get<bool>())) {
      const std::string val = it->is_boolean() ? primitive("value") : visit(*it, hint + "-extra", path + "/additionalProperties", depth + 1);
      extra = primitive("string") + " \":\" space " + val;
    }
    if (!err_.ok()) return "space";
    // Declared order; required pairs always, optional ones may be skipped.
    // tail(i): the pairs after i, each preceded by ",".
    const std::string extra_tail = extra.empty() ? "" : " (\",\" space " + extra + ")*";
    std::vector<std::string> tail(kvs.size() + 1);
    tail[kvs.size()] = extra_tail.empty() ? "\"\"" : extra_tail;
    for (size_t i = kvs.size(); i-- > 0;) {
      const std::string pair = "\",\" space " + kvs[i].expr;
      const std::string body = kvs[i].required ? pair + " " + tail[i + 1] : "(" + pair + ")? " + tail[i + 1];
      tail[i] = i + 1 < kvs.size() || !extra_tail.empty() ? add_rule(hint + "-tail", body) : body;
    }
    // The first pair present has no comma: it is the first required one, or
    // any optional one before it.
    std::string inner;
    bool has_required = false;
    for (size_t i = 0; i < kvs.size(); ++i) {
      inner += (inner.empty() ? "" : " | ") + kvs[i].expr + " " + tail[i + 1];
      if (kvs[i].required) {
        has_required = true;
        break;
      }
    }
    if (!has_required && !extra.empty()) inner += (inner.empty() ? "" : " | ") + extra + extra_tail;
    std::string body = "\"{\" space ";
    if (!inner.empty()) body += has_required ? "(" + inner + ")" : "(" + inner + ")?";
    return add_rule(hint, body + " \"}\" space");
  }
};

}  // namespace

Expected<std::string> json_schema_to_gbnf(std::string_view schema_json, const GrammarLimits& limits) {
  if (schema_json.size() > limits.max_source_bytes)
    return Status(StatusCode::resource_exhausted, "json_schema: larger than the limit of " +
                                                      std::to_string(limits.max_source_bytes) + " bytes");
  // Depth is checked before parsing so that no parser recursion is deep.
  const int max_depth = json_nesting_depth(schema_json);
  if ((size_t)max_depth > 2 * limits.max_nesting + 2)
    return Status(StatusCode::resource_exhausted, "json_schema: nesting exceeds the limit of " +
                                                      std::to_string(limits.max_nesting));
  json schema = json::parse(schema_json, nullptr, false);
  if (schema.is_discarded()) return invalid_argument("json_schema: not valid JSON");
  return Converter(schema, limits).run();
}

Expected<GrammarPtr> compile_json_schema(std::string_view schema_json, const GrammarLimits& limits) {
  auto g = json_schema_to_gbnf(schema_json, limits);
  if (!g.ok()) return g.status();
  auto c = compile_gbnf(*g, limits);
  if (!c.ok()) return c.status().with_context("json_schema");
  return c;
}

Expected<GrammarPtr> compile_json_object(const GrammarLimits& limits) {
  return compile_json_schema("{\"type\":\"object\",\"additionalProperties\":true}", limits);
}

}  // namespace serval
