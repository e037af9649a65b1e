// JSON Schema (draft 2020-12, with the draft-07 spellings items-as-array,
// additionalItems, dependencies and definitions) -> GBNF. How it works:
// json_schema_internal.h. This file: reference resolution ($id, $anchor,
// $ref, $dynamicAnchor / $dynamicRef with the dynamic scope) and the
// meaning of each keyword as a value set.
//
// Refused with an error naming the keyword: references that leave the
// document (nothing is fetched), keywords that are not JSON Schema
// vocabulary, uniqueItems over items that are not a finite set, patterns
// outside the supported regex subset, and any schema no value of which can
// be generated (unsatisfiable ones included: "oneOf": [true, true]).
// Annotations (title, description, default, examples, format, content*,
// deprecated, readOnly, writeOnly, $comment, x-* ...) are ignored, format
// being used as a generation hint where the value is otherwise a free string.
#include <algorithm>
#include <cmath>

#include "common/json_depth.h"
#include "sampler/grammar/grammar.h"
#include "sampler/grammar/grammar_internal.h"
#include "sampler/grammar/json_schema_internal.h"

namespace serval {
namespace json_schema {

namespace {

const std::set<std::string> kAnnotations = {
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$comment", "$defs", "definitions", "$vocabulary", "title",
    "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "contentMediaType",
    "contentEncoding", "contentSchema", "format", "discriminator", "$recursiveAnchor", "strict"};

const std::set<std::string> kAssertions = {
    "$ref", "$dynamicRef", "type", "const", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "prefixItems", "items", "additionalItems", "minItems",
    "maxItems", "contains", "minContains", "maxContains", "uniqueItems", "properties", "patternProperties",
    "additionalProperties", "required", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "unevaluatedItems", "unevaluatedProperties"};

// --- URIs (RFC 3986 reference resolution) ---

struct Uri {
  std::string scheme, authority, path, query, fragment;
  bool has_scheme = false, has_authority = false, has_query = false, has_fragment = false;
};

Uri parse_uri(const std::string& s) {
  Uri u;
  size_t i = 0;
  const size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 0 && std::isalpha((unsigned char)s[0])) {
    bool ok = true;
    for (size_t k = 0; k < colon; ++k) {
      const char c = s[k];
      ok = ok && (std::isalnum((unsigned char)c) || c == '+' || c == '-' || c == '.');
    }
    if (ok) u.scheme = s.substr(0, colon), u.has_scheme = true, i = colon + 1;
  }
  if (s.compare(i, 2, "//") == 0) {
    const size_t e = s.find_first_of("/?#", i + 2);
    u.authority = s.substr(i + 2, (e == std::string::npos ? s.size() : e) - i - 2);
    u.has_authority = true;
    i = e == std::string::npos ? s.size() : e;
  }
  size_t e = s.find_first_of("?#", i);
  u.path = s.substr(i, (e == std::string::npos ? s.size() : e) - i);
  i = e == std::string::npos ? s.size() : e;
  if (i < s.size() && s[i] == '?') {
    e = s.find('#', i);
    u.query = s.substr(i + 1, (e == std::string::npos ? s.size() : e) - i - 1);
    u.has_query = true;
    i = e == std::string::npos ? s.size() : e;
  }
  if (i < s.size() && s[i] == '#') u.fragment = s.substr(i + 1), u.has_fragment = true;
  return u;
}

std::string remove_dots(const std::string& in) {
  std::vector<std::string> out;
  size_t i = 0;
  const bool abs = !in.empty() && in[0] == '/';
  std::string last;
  while (i <= in.size()) {
    size_t j = in.find('/', i);
    if (j == std::string::npos) j = in.size();
    const std::string seg = in.substr(i, j - i);
    last = seg;
    if (seg == "..") {
      if (!out.empty()) out.pop_back();
    } else if (seg != "." && !(seg.empty() && i == 0 && abs)) {
      out.push_back(seg);
    }
    i = j + 1;
  }
  std::string r = abs ? "/" : "";
  for (size_t k = 0; k < out.size(); ++k) r += (k ? "/" : "") + out[k];
  if ((last == "." || last == "..") && !r.empty() && r.back() != '/') r += "/";
  return r;
}

std::string uri_string(const Uri& u) {
  std::string s;
  if (u.has_scheme) s += u.scheme + ":";
  if (u.has_authority) s += "//" + u.authority;
  s += u.path;
  if (u.has_query) s += "?" + u.query;
  if (u.has_fragment) s += "#" + u.fragment;
  return s;
}

std::string resolve_uri(const std::string& base, const std::string& ref) {
  const Uri r = parse_uri(ref), b = parse_uri(base);
  Uri t;
  if (r.has_scheme) {
    t = r;
    t.path = remove_dots(r.path);
  } else {
    if (r.has_authority) {
      t.authority = r.authority, t.has_authority = true;
      t.path = remove_dots(r.path);
      t.query = r.query, t.has_query = r.has_query;
    } else {
      if (r.path.empty()) {
        t.path = b.path;
        t.query = r.has_query ? r.query : b.query;
        t.has_query = r.has_query || b.has_query;
      } else {
        if (r.path[0] == '/') {
          t.path = remove_dots(r.path);
        } else {
          std::string merged;
          if (b.has_authority && b.path.empty()) merged = "/" + r.path;
          else {
            const size_t slash = b.path.rfind('/');
            merged = (slash == std::string::npos ? std::string() : b.path.substr(0, slash + 1)) + r.path;
          }
          t.path = remove_dots(merged);
        }
        t.query = r.query, t.has_query = r.has_query;
      }
      t.authority = b.authority, t.has_authority = b.has_authority;
    }
    t.scheme = b.scheme, t.has_scheme = b.has_scheme;
  }
  t.fragment = r.fragment, t.has_fragment = r.has_fragment;
  return uri_string(t);
}

std::string strip_fragment(const std::string& u) {
  const size_t h = u.find('#');
  return h == std::string::npos ? u : u.substr(0, h);
}

std::string percent_decode(const std::string& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit((unsigned char)s[i + 1]) && std::isxdigit((unsigned char)s[i + 2])) {
      r += (char)std::stoi(s.substr(i + 1, 2), nullptr, 16);
      i += 2;
    } else {
      r += s[i];
    }
  }
  return r;
}

const json* json_pointer(const json* cur, const std::string& ptr) {
  size_t i = 0;
  while (i < ptr.size()) {
    if (ptr[i] != '/') return nullptr;
    size_t j = ptr.find('/', i + 1);
    if (j == std::string::npos) j = ptr.size();
    std::string tok = ptr.substr(i + 1, j - i - 1);
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

const char* const kRootBase = "serval:///schema.json";

}  // namespace

Compiler::Compiler(const json& root, const GrammarLimits& lim, std::string rule_prefix)
    : lim_(lim), root_(root), prefix_(std::move(rule_prefix)) {
  start_ = std::chrono::steady_clock::now();
  static const json kTrue = true, kFalse = false;
  nodes_.push_back({&kTrue, kRootBase, 0});
  nodes_.push_back({&kFalse, kRootBase, 0});
  sets_.resize(2);
  in_progress_.resize(2);
  scopes_.emplace_back();
  scope_ids_[{}] = 0;
}

void Compiler::fail(const std::string& where, const std::string& m) {
  if (err_.ok()) err_ = invalid_argument("json_schema: " + (where.empty() ? std::string() : "at " + where + ": ") + m);
}

void Compiler::exhausted(const std::string& m) {
  if (err_.ok()) err_ = Status(StatusCode::resource_exhausted, "json_schema: " + m);
}

bool Compiler::out_of_time() {
  if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count() <= lim_.max_compile_ms)
    return false;
  exhausted("compile time exceeds the limit of " + std::to_string((int)lim_.max_compile_ms) + " ms");
  return true;
}

// Every subschema's base URI, $id resources, $anchors and $dynamicAnchors.
void Compiler::index(const json& s, const std::string& base_in, size_t depth) {
  if (failed()) return;
  if (depth > lim_.max_nesting) return exhausted("schema nesting exceeds the limit of " + std::to_string(lim_.max_nesting));
  if (!s.is_object()) {
    bases_[&s] = base_in;
    return;
  }
  std::string base = base_in;
  if (auto it = s.find("$id"); it != s.end() && it->is_string()) {
    base = strip_fragment(resolve_uri(base_in, it->get<std::string>()));
    uris_.emplace(base, &s);
  }
  if (depth == 0) uris_.emplace(base, &s);
  if (base != base_in || depth == 0) resource_of_[&s] = base;
  bases_[&s] = base;
  const std::string resource = strip_fragment(base);
  if (auto it = s.find("$anchor"); it != s.end() && it->is_string()) uris_[resource + "#" + it->get<std::string>()] = &s;
  if (auto it = s.find("$dynamicAnchor"); it != s.end() && it->is_string()) {
    uris_.emplace(resource + "#" + it->get<std::string>(), &s);
    dyn_anchors_[{resource, it->get<std::string>()}] = &s;
  }
  for (const char* k : {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
    if (auto it = s.find(k); it != s.end() && it->is_object())
      for (const auto& [name, sub] : it->items())
        if (sub.is_object() || sub.is_boolean()) index(sub, base, depth + 1);
  for (const char* k : {"items", "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
                        "not", "if", "then", "else", "contains", "propertyNames"})
    if (auto it = s.find(k); it != s.end()) {
      if (it->is_array())
        for (const json& sub : *it) index(sub, base, depth + 1);
      else
        index(*it, base, depth + 1);
    }
  for (const char* k : {"allOf", "anyOf", "oneOf", "prefixItems"})
    if (auto it = s.find(k); it != s.end() && it->is_array())
      for (const json& sub : *it) index(sub, base, depth + 1);
}

const json* Compiler::resolve_ref(const std::string& ref, const std::string& base, std::string& target_base) {
  const std::string abs = resolve_uri(base, ref);
  const std::string doc = strip_fragment(abs);
  const size_t h = abs.find('#');
  const std::string frag = h == std::string::npos ? std::string() : abs.substr(h + 1);
  auto it = uris_.find(doc);
  if (it == uris_.end()) return nullptr;
  const json* target = it->second;
  if (!frag.empty()) {
    if (frag[0] == '/') {
      target = json_pointer(target, percent_decode(frag));
    } else {
      auto a = uris_.find(doc + "#" + frag);
      target = a == uris_.end() ? nullptr : a->second;
    }
  }
  if (!target) return nullptr;
  auto b = bases_.find(target);
  target_base = b == bases_.end() ? doc : b->second;
  return target;
}

uint32_t Compiler::enter_scope(uint32_t scope, const std::string& resource) {
  // Only resources with dynamic anchors matter to $dynamicRef; the first
  // (outermost) entry of a resource is the one that counts.
  bool has_dyn = false;
  for (auto it = dyn_anchors_.lower_bound({resource, ""}); it != dyn_anchors_.end() && it->first.first == resource; ++it)
    has_dyn = true;
  if (!has_dyn) return scope;
  const auto& cur = scopes_[scope];
  if (std::find(cur.begin(), cur.end(), resource) != cur.end()) return scope;
  std::vector<std::string> next = cur;
  next.push_back(resource);
  auto [it, inserted] = scope_ids_.emplace(next, (uint32_t)scopes_.size());
  if (inserted) scopes_.push_back(std::move(next));
  return it->second;
}

uint32_t Compiler::node_for(const json* s, const std::string& base, uint32_t scope) {
  if (s->is_boolean()) return s->get<bool>() ? 0 : 1;
  auto key = std::make_tuple(s, base, scope);
  auto [it, inserted] = node_ids_.emplace(key, (uint32_t)nodes_.size());
  if (inserted) {
    nodes_.push_back({s, base, scope});
    sets_.emplace_back();
    in_progress_.push_back(0);
  }
  return it->second;
}

uint32_t Compiler::child(uint32_t parent, const json& s) {
  const Node& p = nodes_[parent];
  auto b = bases_.find(&s);
  const std::string base = b == bases_.end() ? p.base : b->second;
  uint32_t scope = p.scope;
  if (auto r = resource_of_.find(&s); r != resource_of_.end()) scope = enter_scope(scope, r->second);
  return node_for(&s, base, scope);
}

const Set& Compiler::set_of(uint32_t node) {
  static const Set kAll = Set::all(), kNone = Set::none();
  if (node == 0) return kAll;
  if (node == 1 || failed()) return kNone;
  if (sets_[node]) return *sets_[node];
  if (in_progress_[node]) {
    fail("", "keyword '$ref': the schema refers to itself in place (a reference cycle that never descends into a value)");
    return kNone;
  }
  if (set_depth_ > lim_.max_nesting) {
    exhausted("schema nesting (through $ref) exceeds the limit of " + std::to_string(lim_.max_nesting));
    return kNone;
  }
  in_progress_[node] = 1;
  ++set_depth_;
  Set s = compute_set(node);
  --set_depth_;
  in_progress_[node] = 0;
  sets_[node] = std::make_unique<Set>(std::move(s));
  return *sets_[node];
}

const Set& Compiler::materialize(const Term& t) {
  static const Set kAll = Set::all(), kNone = Set::none();
  if (t.any()) return kAll;
  if (failed()) return kNone;
  if (auto it = term_sets_.find(t.atoms); it != term_sets_.end()) return *it->second;
  Set r;
  bool first = true;
  for (const Atom& a : t.atoms) {
    Set s = a.neg ? complement(set_of(a.node), "not") : set_of(a.node);
    r = first ? std::move(s) : intersect(r, s, "allOf");
    first = false;
  }
  auto p = std::make_unique<Set>(std::move(r));
  const Set& ref = *p;
  term_sets_.emplace(t.atoms, std::move(p));
  return ref;
}

namespace {

bool as_count(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) return out = v.get<uint64_t>(), true;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= 0 && std::floor(d) == d && d < 1e18) return out = (uint64_t)d, true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return out = (uint64_t)v.get<int64_t>(), true;
  return false;
}

Set without_type(uint8_t types) {
  Set s = Set::all();
  s.drop_types(types);
  return s;
}

}  // namespace

// The keywords that constrain one type (numbers, strings, arrays, objects):
// every other type passes them.
Set Compiler::local_set(const Node& n, const json& s) {
  Set r = Set::all();
  const uint32_t self = node_for(n.schema, n.base, n.scope);
  auto count = [&](const char* k, uint32_t dflt, uint32_t& out) {
    auto it = s.find(k);
    out = dflt;
    if (it == s.end()) return;
    uint64_t v;
    if (!as_count(*it, v)) return fail("", "keyword '" + std::string(k) + "': expected a non-negative integer");
    out = (uint32_t)std::min<uint64_t>(v, kUnbounded - 1);
  };
  // Numbers.
  if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
      s.contains("exclusiveMaximum") || s.contains("multipleOf")) {
    NumPart p;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}) {
      auto it = s.find(k);
      if (it == s.end()) continue;
      if (!it->is_number()) {
        // draft-04 boolean exclusiveMinimum / exclusiveMaximum.
        if (it->is_boolean() && (std::string(k) == "exclusiveMinimum" || std::string(k) == "exclusiveMaximum")) continue;
        fail("", "keyword '" + std::string(k) + "': expected a number");
        return r;
      }
      const double d = it->get<double>();
      const std::string key = k;
      if (key == "minimum") p.lo = std::max(p.lo, d), p.lo_x = s.value("exclusiveMinimum", json()).is_boolean() && s["exclusiveMinimum"].get<bool>();
      else if (key == "maximum") p.hi = std::min(p.hi, d), p.hi_x = s.value("exclusiveMaximum", json()).is_boolean() && s["exclusiveMaximum"].get<bool>();
      else if (key == "exclusiveMinimum") { if (d >= p.lo) p.lo = d, p.lo_x = true; }
      else if (key == "exclusiveMaximum") { if (d <= p.hi) p.hi = d, p.hi_x = true; }
      else {
        if (!(d > 0) || !std::isfinite(d)) return fail("", "keyword 'multipleOf': expected a number > 0"), r;
        // Integer multiples of d: d = p / 2^j exactly (dyadic) makes k*M/d
        // exact in floating point, as validators compute it.
        int j = 0;
        double scaled = d;
        while (std::floor(scaled) != scaled && j < 30) scaled *= 2, ++j;
        if (std::floor(scaled) != scaled || scaled > 1e15) {
          p.ints = false;
          note_lost(r, kNum, "multipleOf");
        } else {
          int64_t num = (int64_t)scaled, den = (int64_t)1 << j;
          int64_t a = num, b = den;
          while (b) a %= b, std::swap(a, b);
          p.mult = num / a;
          if (d != std::floor(d)) note_lost(r, kNum, "multipleOf");  // fractional multiples are not generated
        }
        p.fracs = false;
      }
    }
    r.nums = {p};
  }
  // Strings.
  if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) {
    StrPart p;
    count("minLength", 0, p.min_len);
    count("maxLength", kUnbounded, p.max_len);
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return fail("", "keyword 'pattern': expected a string"), r;
      p.patterns.push_back(it->get<std::string>());
    }
    r.strs = {p};
  }
  // Arrays.
  const bool legacy_items = s.contains("items") && s["items"].is_array();
  if (s.contains("prefixItems") || s.contains("items") || s.contains("minItems") || s.contains("maxItems") ||
      s.contains("contains") || s.contains("uniqueItems")) {
    ArrPart p;
    ArrLayer L;
    bool layer = false;
    const json* prefix = s.contains("prefixItems") ? &s["prefixItems"] : legacy_items ? &s["items"] : nullptr;
    if (prefix) {
      if (!prefix->is_array()) return fail("", "keyword 'prefixItems': expected an array of schemas"), r;
      for (const json& sub : *prefix) L.prefix.push_back(term_of(child(self, sub)));
      layer = true;
    }
    const json* rest = legacy_items ? (s.contains("additionalItems") ? &s["additionalItems"] : nullptr)
                                    : (s.contains("items") ? &s["items"] : nullptr);
    if (rest) {
      L.items = term_of(child(self, *rest));
      L.has_items = true;
      layer = true;
    }
    if (layer) p.layers.push_back(std::move(L));
    count("minItems", 0, p.min_items);
    count("maxItems", kUnbounded, p.max_items);
    if (auto it = s.find("contains"); it != s.end()) {
      Contains c;
      c.c = term_of(child(self, *it));
      count("minContains", 1, c.min);
      count("maxContains", kUnbounded, c.max);
      if (c.min > 0 || c.max != kUnbounded) p.contains.push_back(c);
    }
    if (auto it = s.find("uniqueItems"); it != s.end()) {
      if (!it->is_boolean()) return fail("", "keyword 'uniqueItems': expected a boolean"), r;
      p.unique = it->get<bool>();
    }
    r.arrs = {p};
  }
  // Objects.
  if (s.contains("properties") || s.contains("patternProperties") || s.contains("additionalProperties") ||
      s.contains("required") || s.contains("minProperties") || s.contains("maxProperties") ||
      s.contains("propertyNames")) {
    ObjPart p;
    ObjLayer L;
    bool layer = false;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return fail("", "keyword 'properties': expected an object"), r;
      for (const auto& [k, v] : it->items()) L.props.push_back({k, term_of(child(self, v))});
      layer = true;
    }
    if (auto it = s.find("patternProperties"); it != s.end()) {
      if (!it->is_object()) return fail("", "keyword 'patternProperties': expected an object"), r;
      for (const auto& [k, v] : it->items()) {
        regex_search(k, "");  // refuses a pattern outside the supported subset
        L.patterns.push_back({k, term_of(child(self, v))});
      }
      layer = true;
    }
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      L.other = term_of(child(self, *it));
      L.has_other = true;
      layer = true;
    }
    if (layer) p.layers.push_back(std::move(L));
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return fail("", "keyword 'required': expected an array of strings"), r;
      for (const json& k : *it) {
        if (!k.is_string()) return fail("", "keyword 'required': expected an array of strings"), r;
        if (std::find(p.required.begin(), p.required.end(), k.get<std::string>()) == p.required.end())
          p.required.push_back(k.get<std::string>());
      }
    }
    count("minProperties", 0, p.min_props);
    count("maxProperties", kUnbounded, p.max_props);
    if (auto it = s.find("propertyNames"); it != s.end()) p.names.push_back(term_of(child(self, *it)));
    r.objs = {p};
  }
  return r;
}

void Compiler::apply_unevaluated(Set& r, const Node& n, const json& s) {
  const uint32_t self = node_for(n.schema, n.base, n.scope);
  if (auto it = s.find("unevaluatedItems"); it != s.end()) {
    const Term ut = term_of(child(self, *it));
    for (ArrPart& p : r.arrs) {
      size_t P = 0;
      bool all = false;
      for (const ArrLayer& L : p.layers)
        if (L.evaluates) P = std::max(P, L.prefix.size()), all = all || L.has_items;
      if (all) continue;
      ArrLayer L;
      L.prefix.assign(P, Term{});
      L.items = ut;
      L.has_items = true;
      p.layers.push_back(std::move(L));
    }
    const size_t own = s.contains("prefixItems") && s["prefixItems"].is_array() ? s["prefixItems"].size() : 0;
    const bool own_items = s.contains("items");
    std::erase_if(r.values, [&](const json& v) {
      if (!v.is_array() || own_items) return false;
      for (size_t i = own; i < v.size(); ++i)
        if (!contains_term(ut, v[i], 0)) return true;
      return false;
    });
  }
  if (auto it = s.find("unevaluatedProperties"); it != s.end()) {
    const Term ut = term_of(child(self, *it));
    for (ObjPart& p : r.objs) {
      bool all = false;
      ObjLayer L;
      for (const ObjLayer& x : p.layers) {
        if (!x.evaluates) continue;
        all = all || x.has_other;
        for (const auto& kv : x.props) L.props.push_back({kv.first, Term{}});
        for (const auto& kv : x.patterns) L.patterns.push_back({kv.first, Term{}});
      }
      if (all) continue;
      L.other = ut;
      L.has_other = true;
      p.layers.push_back(std::move(L));
    }
    const json* props = s.contains("properties") && s["properties"].is_object() ? &s["properties"] : nullptr;
    const json* pats = s.contains("patternProperties") && s["patternProperties"].is_object() ? &s["patternProperties"] : nullptr;
    const bool own_other = s.contains("additionalProperties");
    std::erase_if(r.values, [&](const json& v) {
      if (!v.is_object() || own_other) return false;
      for (const auto& [k, x] : v.items()) {
        if (props && props->contains(k)) continue;
        bool matched = false;
        if (pats)
          for (const auto& [pat, sub] : pats->items()) matched = matched || regex_search(pat, k);
        if (matched) continue;
        if (!contains_term(ut, x, 0)) return true;
      }
      return false;
    });
  }
}

Set Compiler::compute_set(uint32_t node) {
  const Node n = nodes_[node];
  const json& s = *n.schema;
  if (s.is_boolean()) return s.get<bool>() ? Set::all() : Set::none();
  if (!s.is_object()) {
    fail("", "a schema must be an object or a boolean (found in 'properties', 'items' or another keyword)");
    return Set::none();
  }
  if (out_of_time()) return Set::none();
  for (const auto& [k, v] : s.items()) {
    if (kAnnotations.count(k) || kAssertions.count(k) || k.rfind("x-", 0) == 0) continue;
    if (k == "$recursiveRef")
      return fail("", "keyword '$recursiveRef' (draft 2019-09) is not supported; use $dynamicRef"), Set::none();
    fail("", "keyword '" + k + "' is not JSON Schema vocabulary that constrained decoding knows; remove it or use an x- prefix");
    return Set::none();
  }
  Set r = Set::all();
  auto meet = [&](const Set& x, const char* kw) {
    const bool was_empty = r.empty();
    r = intersect(r, x, kw);
    if (r.empty() && !was_empty && r.lost.empty()) r.lost = kw;
  };

  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) return fail("", "keyword '$ref': expected a string"), Set::none();
    std::string tb;
    const json* t = resolve_ref(it->get<std::string>(), n.base, tb);
    if (!t)
      return fail("", "keyword '$ref': '" + it->get<std::string>() +
                          "' does not resolve inside this schema (remote references are not fetched)"),
             Set::none();
    uint32_t scope = n.scope;
    if (auto ro = resource_of_.find(t); ro != resource_of_.end()) scope = enter_scope(scope, ro->second);
    else scope = enter_scope(scope, strip_fragment(tb));
    meet(set_of(node_for(t, tb, scope)), "$ref");
  }
  if (auto it = s.find("$dynamicRef"); it != s.end()) {
    if (!it->is_string()) return fail("", "keyword '$dynamicRef': expected a string"), Set::none();
    const std::string ref = it->get<std::string>();
    std::string tb;
    const json* t = resolve_ref(ref, n.base, tb);
    if (!t)
      return fail("", "keyword '$dynamicRef': '" + ref + "' does not resolve inside this schema (remote references are not fetched)"),
             Set::none();
    // A fragment naming a $dynamicAnchor of the initial target: the
    // outermost resource in the dynamic scope with that anchor wins.
    const size_t h = ref.find('#');
    const std::string name = h == std::string::npos ? std::string() : ref.substr(h + 1);
    if (!name.empty() && name[0] != '/' && t->is_object() && t->value("$dynamicAnchor", json()) == json(name)) {
      for (const std::string& res : scopes_[n.scope]) {
        auto d = dyn_anchors_.find({res, name});
        if (d != dyn_anchors_.end()) {
          t = d->second;
          tb = bases_.count(t) ? bases_[t] : res;
          break;
        }
      }
    }
    uint32_t scope = n.scope;
    if (auto ro = resource_of_.find(t); ro != resource_of_.end()) scope = enter_scope(scope, ro->second);
    meet(set_of(node_for(t, tb, scope)), "$dynamicRef");
  }
  if (auto it = s.find("type"); it != s.end()) {
    std::vector<std::string> types;
    if (it->is_string()) types.push_back(it->get<std::string>());
    else if (it->is_array())
      for (const json& t : *it) {
        if (!t.is_string()) return fail("", "keyword 'type': expected a string or a list of strings"), Set::none();
        types.push_back(t.get<std::string>());
      }
    else return fail("", "keyword 'type': expected a string or a list of strings"), Set::none();
    uint8_t keep = 0;
    bool integer_only = false;
    for (const auto& t : types) {
      if (t == "null") keep |= kNull;
      else if (t == "boolean") keep |= kBool;
      else if (t == "number") keep |= kNum;
      else if (t == "integer") keep |= kNum, integer_only = true;
      else if (t == "string") keep |= kStr;
      else if (t == "array") keep |= kArr;
      else if (t == "object") keep |= kObj;
      else return fail("", "keyword 'type': unknown type '" + t + "'"), Set::none();
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    Set ts = without_type((uint8_t)(kAllTypes & ~keep));
    if (integer_only && !has_number)
      for (auto& p : ts.nums) p.fracs = false;
    meet(ts, "type");
  }
  if (auto it = s.find("const"); it != s.end()) {
    Set c;
    if (it->is_null()) c.null_ok = true;
    else if (it->is_boolean()) (it->get<bool>() ? c.true_ok : c.false_ok) = true;
    else c.values.push_back(*it);
    meet(c, "const");
  }
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array()) return fail("", "keyword 'enum': expected an array"), Set::none();
    if (it->size() > kMaxValues) return exhausted("enum: more than " + std::to_string(kMaxValues) + " values"), Set::none();
    Set c;
    for (const json& v : *it) {
      if (v.is_null()) c.null_ok = true;
      else if (v.is_boolean()) (v.get<bool>() ? c.true_ok : c.false_ok) = true;
      else c.values.push_back(v);
    }
    meet(c, "enum");
  }
  meet(local_set(n, s), "type-specific keywords");
  if (failed()) return Set::none();

  auto dependent = [&](const std::string& key, const Set& then, const char* kw) {
    Set x = without_type(kObj);  // not an object: nothing to depend on
    ObjPart lacking;
    ObjLayer L;
    L.props.push_back({key, term_of(1)});
    L.evaluates = false;
    lacking.layers.push_back(std::move(L));
    Set lack;
    lack.objs.push_back(std::move(lacking));
    Set with;
    ObjPart req;
    req.required.push_back(key);
    with.objs.push_back(std::move(req));
    with = intersect(with, then, kw);
    meet(unite(unite(x, lack, kw), with, kw), kw);
  };
  auto dep_required = [&](const json& m, const char* kw) {
    for (const auto& [k, v] : m.items()) {
      if (!v.is_array()) return fail("", "keyword '" + std::string(kw) + "': expected arrays of property names");
      Set then;
      ObjPart req;
      for (const json& d : v) {
        if (!d.is_string()) return fail("", "keyword '" + std::string(kw) + "': expected arrays of property names");
        req.required.push_back(d.get<std::string>());
      }
      then.objs.push_back(std::move(req));
      dependent(k, then, kw);
    }
  };
  if (auto it = s.find("dependentRequired"); it != s.end()) {
    if (!it->is_object()) return fail("", "keyword 'dependentRequired': expected an object"), Set::none();
    dep_required(*it, "dependentRequired");
  }
  if (auto it = s.find("dependentSchemas"); it != s.end()) {
    if (!it->is_object()) return fail("", "keyword 'dependentSchemas': expected an object"), Set::none();
    for (const auto& [k, v] : it->items()) dependent(k, set_of(child(node, v)), "dependentSchemas");
  }
  if (auto it = s.find("dependencies"); it != s.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (v.is_array()) {
        json one = json::object();
        one[k] = v;
        dep_required(one, "dependencies");
      } else {
        dependent(k, set_of(child(node, v)), "dependencies");
      }
    }
  }
  if (auto it = s.find("allOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) return fail("", "keyword 'allOf': expected a non-empty array"), Set::none();
    for (const json& sub : *it) meet(set_of(child(node, sub)), "allOf");
  }
  if (auto it = s.find("anyOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) return fail("", "keyword 'anyOf': expected a non-empty array"), Set::none();
    Set u;
    for (const json& sub : *it) u = unite(std::move(u), set_of(child(node, sub)), "anyOf");
    meet(u, "anyOf");
  }
  if (auto it = s.find("oneOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) return fail("", "keyword 'oneOf': expected a non-empty array"), Set::none();
    if (it->size() > 64) return exhausted("oneOf: more than 64 alternatives"), Set::none();
    std::vector<Set> alts, comps;
    for (const json& sub : *it) alts.push_back(set_of(child(node, sub)));
    for (const Set& a : alts) comps.push_back(complement(a, "oneOf"));
    Set u;
    for (size_t i = 0; i < alts.size() && !failed(); ++i) {
      Set x = alts[i];
      for (size_t j = 0; j < alts.size(); ++j)
        if (j != i) x = intersect(x, comps[j], "oneOf");
      u = unite(std::move(u), x, "oneOf");
    }
    if (u.empty() && u.lost.empty()) u.lost = "oneOf";
    meet(u, "oneOf");
  }
  if (auto it = s.find("not"); it != s.end()) meet(complement(set_of(child(node, *it)), "not"), "not");
  if (auto it = s.find("if"); it != s.end()) {
    const Set& i = set_of(child(node, *it));
    Set t = s.contains("then") ? set_of(child(node, s["then"])) : Set::all();
    Set e = s.contains("else") ? set_of(child(node, s["else"])) : Set::all();
    meet(unite(intersect(i, t, "then"), intersect(complement(i, "if"), e, "else"), "if"), "if");
  }
  apply_unevaluated(r, n, s);
  if (auto it = s.find("format"); it != s.end() && it->is_string())
    for (auto& p : r.strs)
      if (p.format.empty()) p.format = it->get<std::string>();
  return r;
}

Expected<std::string> Compiler::run() {
  index(root_, kRootBase, 0);
  if (failed()) return err_;
  const std::string root_base = bases_.count(&root_) ? bases_[&root_] : std::string(kRootBase);
  const uint32_t scope = enter_scope(0, strip_fragment(root_base));
  const uint32_t root = node_for(&root_, root_base, scope);
  const Set& rs = set_of(root);
  if (failed()) return err_;
  std::string body = rule_for(term_of(root), "root-value");
  if (failed()) return err_;
  if (rs.empty() || body == "never") {
    const std::string kw = !gen_lost_.empty() ? gen_lost_ : rs.lost;
    if (!kw.empty())
      return invalid_argument("json_schema: keyword '" + kw + "': no JSON value satisfying the schema can be generated" +
                              (rs.inexact ? " (the keyword cannot be compiled exactly into a grammar)" : " (unsatisfiable)"));
    return invalid_argument("json_schema: no JSON value satisfies the schema (it is the boolean schema 'false')");
  }
  std::string out = prefix_ + "root ::= " + body + "\n";
  for (const auto& [name, def] : rules_) out += name + " ::= " + def + "\n";
  if (out.size() > lim_.max_source_bytes)
    return Status(StatusCode::resource_exhausted, "json_schema: the grammar exceeds the size limit of " +
                                                      std::to_string(lim_.max_source_bytes) + " bytes");
  return out;
}

}  // namespace json_schema

Expected<std::string> json_schema_to_gbnf_rules(std::string_view schema_json, const std::string& rule_prefix,
                                                const GrammarLimits& limits) {
  if (schema_json.size() > limits.max_source_bytes)
    return Status(StatusCode::resource_exhausted, "json_schema: larger than the limit of " +
                                                      std::to_string(limits.max_source_bytes) + " bytes");
  // Depth is checked before parsing so that no parser recursion is deep.
  const int max_depth = json_nesting_depth(schema_json);
  if ((size_t)max_depth > 2 * limits.max_nesting + 2)
    return Status(StatusCode::resource_exhausted, "json_schema: nesting exceeds the limit of " +
                                                      std::to_string(limits.max_nesting));
  json_schema::json schema = json_schema::json::parse(schema_json, nullptr, false);
  if (schema.is_discarded()) return invalid_argument("json_schema: not valid JSON");
  return json_schema::Compiler(schema, limits, rule_prefix).run();
}

Expected<std::string> json_schema_to_gbnf(std::string_view schema_json, const GrammarLimits& limits) {
  return json_schema_to_gbnf_rules(schema_json, "", limits);
}

Expected<GrammarPtr> compile_json_schema(std::string_view schema_json, const GrammarLimits& limits) {
  auto g = json_schema_to_gbnf(schema_json, limits);
  if (!g.ok()) return g.status();
  auto c = compile_gbnf(*g, limits);
  if (!c.ok()) {
    if (c.status().message().find("matches no finite string") != std::string::npos)
      return invalid_argument("json_schema: keyword '$ref': the recursive schema has no finite instance");
    return c.status().with_context("json_schema");
  }
  return c;
}

Expected<GrammarPtr> compile_json_object(const GrammarLimits& limits) {
  return compile_json_schema("{\"type\":\"object\",\"additionalProperties\":true}", limits);
}

}  // namespace serval
