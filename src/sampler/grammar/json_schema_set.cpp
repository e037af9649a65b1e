// JSON Schema compiler, stage 1 algebra: intersection, union, complement and
// membership of value sets (json_schema_internal.h).
#include <algorithm>
#include <cmath>

#include "sampler/grammar/json_schema_internal.h"
#include "sampler/grammar/matcher.h"

namespace serval::json_schema {

Term term_and(const Term& a, const Term& b) {
  Term r;
  r.atoms.reserve(a.atoms.size() + b.atoms.size());
  std::set_union(a.atoms.begin(), a.atoms.end(), b.atoms.begin(), b.atoms.end(), std::back_inserter(r.atoms));
  return r;
}

Term term_of(uint32_t node, bool neg) {
  Term t;
  if (node == 0 && !neg) return t;  // `true`
  t.atoms.push_back({node, neg});
  return t;
}

Set Set::all() {
  Set s;
  s.null_ok = s.true_ok = s.false_ok = true;
  s.nums.emplace_back();
  s.strs.emplace_back();
  s.arrs.emplace_back();
  s.objs.emplace_back();
  return s;
}

void Set::drop_types(uint8_t types) {
  if (types & kNull) null_ok = false;
  if (types & kBool) true_ok = false_ok = false;
  if (types & kNum) nums.clear();
  if (types & kStr) strs.clear();
  if (types & kArr) arrs.clear();
  if (types & kObj) objs.clear();
  std::erase_if(values, [&](const json& v) {
    return ((types & kNum) && v.is_number()) || ((types & kStr) && v.is_string()) ||
           ((types & kArr) && v.is_array()) || ((types & kObj) && v.is_object());
  });
}

namespace {

// JSON equality as JSON Schema defines it: numbers by value, objects by keys.
bool json_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !json_equal(v, *it)) return false;
    }
    return true;
  }
  return a == b;
}

void add_value(std::vector<json>& vs, const json& v) {
  for (const json& x : vs)
    if (json_equal(x, v)) return;
  vs.push_back(v);
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  const double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d;
}

// Lower bound a wins over b (tighter)?
void tighten_lo(NumPart& r, double lo, bool x) {
  if (lo > r.lo || (lo == r.lo && x)) r.lo = lo, r.lo_x = x;
}
void tighten_hi(NumPart& r, double hi, bool x) {
  if (hi < r.hi || (hi == r.hi && x)) r.hi = hi, r.hi_x = x;
}

int64_t gcd64(int64_t a, int64_t b) {
  while (b) a %= b, std::swap(a, b);
  return a;
}

bool num_empty(const NumPart& p) {
  if (!p.ints && !p.fracs) return true;
  if (p.lo > p.hi) return true;
  if (p.lo == p.hi && (p.lo_x || p.hi_x)) return true;
  if (!p.fracs) {  // an integer must lie in the range
    const double L = std::isinf(p.lo) ? p.lo : (p.lo_x ? std::floor(p.lo) + 1 : std::ceil(p.lo));
    const double H = std::isinf(p.hi) ? p.hi : (p.hi_x ? std::ceil(p.hi) - 1 : std::floor(p.hi));
    if (L > H) return true;
  }
  return false;
}

bool merge_num(NumPart& r, const NumPart& b) {
  r.ints = r.ints && b.ints;
  r.fracs = r.fracs && b.fracs;
  tighten_lo(r, b.lo, b.lo_x);
  tighten_hi(r, b.hi, b.hi_x);
  if (b.mult) {
    if (!r.mult) {
      r.mult = b.mult;
    } else {
      const int64_t g = gcd64(r.mult, b.mult);
      const double l = (double)(r.mult / g) * (double)b.mult;
      if (l > 1e15) r.ints = false;
      else r.mult = r.mult / g * b.mult;
    }
  }
  if (r.mult) r.fracs = false;
  r.excl.insert(r.excl.end(), b.excl.begin(), b.excl.end());
  return !num_empty(r);
}

bool merge_str(StrPart& r, const StrPart& b) {
  r.min_len = std::max(r.min_len, b.min_len);
  r.max_len = std::min(r.max_len, b.max_len);
  for (const auto& p : b.patterns)
    if (std::find(r.patterns.begin(), r.patterns.end(), p) == r.patterns.end()) r.patterns.push_back(p);
  if (r.format.empty()) r.format = b.format;
  r.excl.insert(r.excl.end(), b.excl.begin(), b.excl.end());
  return r.min_len <= r.max_len;
}

bool merge_arr(ArrPart& r, const ArrPart& b) {
  r.layers.insert(r.layers.end(), b.layers.begin(), b.layers.end());
  r.min_items = std::max(r.min_items, b.min_items);
  r.max_items = std::min(r.max_items, b.max_items);
  r.contains.insert(r.contains.end(), b.contains.begin(), b.contains.end());
  r.unique = r.unique || b.unique;
  r.excl.insert(r.excl.end(), b.excl.begin(), b.excl.end());
  return r.min_items <= r.max_items;
}

bool merge_obj(ObjPart& r, const ObjPart& b) {
  r.layers.insert(r.layers.end(), b.layers.begin(), b.layers.end());
  for (const auto& k : b.required)
    if (std::find(r.required.begin(), r.required.end(), k) == r.required.end()) r.required.push_back(k);
  r.min_props = std::max(r.min_props, b.min_props);
  r.max_props = std::min(r.max_props, b.max_props);
  r.names.insert(r.names.end(), b.names.begin(), b.names.end());
  r.excl.insert(r.excl.end(), b.excl.begin(), b.excl.end());
  return r.min_props <= r.max_props && r.required.size() <= r.max_props;
}

template <class P, class F>
std::vector<P> product(const std::vector<P>& a, const std::vector<P>& b, F merge, bool& truncated) {
  std::vector<P> out;
  for (const P& x : a)
    for (const P& y : b) {
      P m = x;
      if (!merge(m, y)) continue;
      if (out.size() >= kMaxParts) {
        truncated = true;
        return out;
      }
      out.push_back(std::move(m));
    }
  return out;
}

template <class P>
void append_parts(std::vector<P>& a, const std::vector<P>& b, bool& truncated) {
  for (const P& p : b) {
    if (a.size() >= kMaxParts) {
      truncated = true;
      return;
    }
    a.push_back(p);
  }
}

Atom flip(Atom a) { return {a.node, !a.neg}; }

// The complement of a count bound [lo, hi] (lengths, items, properties):
// fewer than lo, or more than hi.
template <class P>
void count_complement(std::vector<P>& c, uint32_t lo, uint32_t hi, uint32_t P::*min_m, uint32_t P::*max_m) {
  if (lo > 0) {
    P x;
    x.*max_m = lo - 1;
    c.push_back(x);
  }
  if (hi != kUnbounded) {
    P x;
    x.*min_m = hi + 1;
    c.push_back(x);
  }
}

Term any_term() { return Term{}; }

}  // namespace

void Compiler::note_lost(Set& s, uint8_t types, const char* kw) {
  s.inexact |= types;
  if (s.lost.empty()) s.lost = kw;
}

Set Compiler::intersect(const Set& a, const Set& b, const char* kw) {
  Set r;
  r.null_ok = a.null_ok && b.null_ok;
  r.true_ok = a.true_ok && b.true_ok;
  r.false_ok = a.false_ok && b.false_ok;
  r.inexact = a.inexact | b.inexact;
  r.lost = !a.lost.empty() ? a.lost : b.lost;
  for (const json& v : a.values)
    if (contains(b, v)) add_value(r.values, v);
  for (const json& v : b.values)
    if (contains(a, v)) add_value(r.values, v);
  bool trunc = false;
  r.nums = product(a.nums, b.nums, merge_num, trunc);
  if (trunc) note_lost(r, kNum, kw), trunc = false;
  r.strs = product(a.strs, b.strs, merge_str, trunc);
  if (trunc) note_lost(r, kStr, kw), trunc = false;
  r.arrs = product(a.arrs, b.arrs, merge_arr, trunc);
  if (trunc) note_lost(r, kArr, kw), trunc = false;
  r.objs = product(a.objs, b.objs, merge_obj, trunc);
  if (trunc) note_lost(r, kObj, kw), trunc = false;
  if (r.empty() && !a.empty() && !b.empty() && r.lost.empty()) r.lost = kw;
  return r;
}

Set Compiler::unite(Set a, const Set& b, const char* kw) {
  a.null_ok |= b.null_ok;
  a.true_ok |= b.true_ok;
  a.false_ok |= b.false_ok;
  a.inexact |= b.inexact;
  if (a.lost.empty()) a.lost = b.lost;
  for (const json& v : b.values) {
    if (a.values.size() >= kMaxValues) {
      note_lost(a, kAllTypes, kw);
      break;
    }
    add_value(a.values, v);
  }
  bool trunc = false;
  append_parts(a.nums, b.nums, trunc);
  if (trunc) note_lost(a, kNum, kw), trunc = false;
  append_parts(a.strs, b.strs, trunc);
  if (trunc) note_lost(a, kStr, kw), trunc = false;
  append_parts(a.arrs, b.arrs, trunc);
  if (trunc) note_lost(a, kArr, kw), trunc = false;
  append_parts(a.objs, b.objs, trunc);
  if (trunc) note_lost(a, kObj, kw), trunc = false;
  return a;
}

// The complement: the intersection, over s's parts, of each part's
// complement (itself a union covering every other type), and of the
// complements of its flags and values.
Set Compiler::complement(const Set& s, const char* kw) {
  Set r = Set::all();
  r.null_ok = !s.null_ok;
  r.true_ok = !s.true_ok;
  r.false_ok = !s.false_ok;
  uint8_t lost = 0;
  std::vector<json> candidates;  // values some part leaves out: in the complement unless s has them otherwise
  bool trunc = false;

  for (const NumPart& p : s.nums) {
    std::vector<NumPart> c;
    auto kind = [](bool ints, bool fracs) {
      NumPart x;
      x.ints = ints, x.fracs = fracs;
      return x;
    };
    if (!p.ints) c.push_back(kind(true, false));
    if (!p.fracs) c.push_back(kind(false, true));
    const NumPart kinds = kind(p.ints, p.fracs);
    if (!std::isinf(p.lo)) {
      NumPart x = kinds;
      x.hi = p.lo, x.hi_x = !p.lo_x;
      c.push_back(x);
    }
    if (!std::isinf(p.hi)) {
      NumPart x = kinds;
      x.lo = p.hi, x.lo_x = !p.hi_x;
      c.push_back(x);
    }
    if (p.mult) lost |= kNum;
    for (double d : p.excl) candidates.push_back(json(d));
    r.nums = product(r.nums, c, merge_num, trunc);
  }
  for (const StrPart& p : s.strs) {
    std::vector<StrPart> c;
    count_complement(c, p.min_len, p.max_len, &StrPart::min_len, &StrPart::max_len);
    if (!p.patterns.empty()) lost |= kStr;
    for (const auto& e : p.excl) candidates.push_back(json(e));
    r.strs = product(r.strs, c, merge_str, trunc);
  }
  for (const ArrPart& p : s.arrs) {
    std::vector<ArrPart> c;
    count_complement(c, p.min_items, p.max_items, &ArrPart::min_items, &ArrPart::max_items);
    for (const ArrLayer& L : p.layers) {
      for (size_t i = 0; i < L.prefix.size(); ++i)
        for (const Atom& a : L.prefix[i].atoms) {
          ArrPart x;
          ArrLayer nl;
          nl.prefix.assign(i, any_term());
          nl.prefix.push_back(Term{{flip(a)}});
          nl.evaluates = false;
          x.layers.push_back(std::move(nl));
          x.min_items = (uint32_t)i + 1;
          c.push_back(std::move(x));
        }
      if (!L.items.any()) {
        // A violation right after the prefix; violations further on are not
        // represented.
        for (const Atom& a : L.items.atoms) {
          ArrPart x;
          ArrLayer nl;
          nl.prefix.assign(L.prefix.size(), any_term());
          nl.prefix.push_back(Term{{flip(a)}});
          nl.evaluates = false;
          x.layers.push_back(std::move(nl));
          x.min_items = (uint32_t)L.prefix.size() + 1;
          c.push_back(std::move(x));
        }
        lost |= kArr;
      }
    }
    for (const Contains& k : p.contains) {
      if (k.min >= 1 && k.c.atoms.size() == 1) {
        ArrPart x;
        ArrLayer nl;
        nl.items = Term{{flip(k.c.atoms[0])}};
        nl.evaluates = false;
        x.layers.push_back(std::move(nl));
        c.push_back(std::move(x));
      }
      if (k.min > 1 || k.max != kUnbounded || k.c.atoms.size() != 1) lost |= kArr;
    }
    if (p.unique) lost |= kArr;
    for (const auto& e : p.excl) candidates.push_back(e);
    r.arrs = product(r.arrs, c, merge_arr, trunc);
  }
  for (const ObjPart& p : s.objs) {
    std::vector<ObjPart> c;
    count_complement(c, p.min_props, p.max_props, &ObjPart::min_props, &ObjPart::max_props);
    for (const auto& k : p.required) {
      ObjPart x;
      ObjLayer nl;
      nl.props.push_back({k, term_of(1)});
      nl.evaluates = false;
      x.layers.push_back(std::move(nl));
      c.push_back(std::move(x));
    }
    for (const ObjLayer& L : p.layers) {
      for (const auto& [k, t] : L.props)
        for (const Atom& a : t.atoms) {
          ObjPart x;
          ObjLayer nl;
          nl.props.push_back({k, Term{{flip(a)}}});
          nl.evaluates = false;
          x.layers.push_back(std::move(nl));
          x.required.push_back(k);
          c.push_back(std::move(x));
        }
      for (const auto& pt : L.patterns)
        if (!pt.second.any()) lost |= kObj;
      if (!L.other.any()) lost |= kObj;
    }
    if (!p.names.empty()) lost |= kObj;
    for (const auto& e : p.excl) candidates.push_back(e);
    r.objs = product(r.objs, c, merge_obj, trunc);
  }
  if (trunc) lost |= kAllTypes & ~(kNull | kBool);

  // Values of s are not in the complement: numbers and strings become
  // exclusions of the parts; arrays and objects ones too.
  for (const json& v : s.values) {
    if (v.is_number())
      for (auto& p : r.nums) p.excl.push_back(v.get<double>());
    else if (v.is_string())
      for (auto& p : r.strs) p.excl.push_back(v.get<std::string>());
    else if (v.is_array())
      for (auto& p : r.arrs) p.excl.push_back(v);
    else if (v.is_object())
      for (auto& p : r.objs) p.excl.push_back(v);
  }
  for (const json& v : candidates)
    if (!contains(s, v)) add_value(r.values, v);

  // A type whose values s dropped has no known complement: none of it.
  const uint8_t dark = s.inexact;
  r.drop_types(dark);
  r.inexact = dark | lost;
  if (r.inexact) r.lost = !s.lost.empty() ? s.lost : kw;
  return r;
}

Term Compiler::obj_key_term(const ObjPart& p, const std::string& key) {
  Term r;
  for (const ObjLayer& L : p.layers) {
    bool matched = false;
    for (const auto& [k, t] : L.props)
      if (k == key) {
        r = term_and(r, t);
        matched = true;
      }
    for (const auto& [pat, t] : L.patterns)
      if (regex_search(pat, key)) {
        r = term_and(r, t);
        matched = true;
      }
    if (!matched) r = term_and(r, L.other);
  }
  return r;
}

Term Compiler::arr_elem_term(const ArrPart& p, size_t i) {
  Term r;
  for (const ArrLayer& L : p.layers) r = term_and(r, i < L.prefix.size() ? L.prefix[i] : L.items);
  return r;
}

bool Compiler::contains_term(const Term& t, const json& v, int depth) {
  if (t.any()) return true;
  return contains(materialize(t), v, depth + 1);
}

bool Compiler::contains(const Set& s, const json& v, int depth) {
  if (depth > 64 || failed()) return false;
  if (v.is_null()) return s.null_ok;
  if (v.is_boolean()) return v.get<bool>() ? s.true_ok : s.false_ok;
  for (const json& x : s.values)
    if (json_equal(x, v)) return true;
  if (v.is_number()) {
    const double d = v.get<double>();
    const bool integral = is_integral(v);
    for (const NumPart& p : s.nums) {
      if (integral ? !p.ints : !p.fracs) continue;
      if (d < p.lo || (d == p.lo && p.lo_x) || d > p.hi || (d == p.hi && p.hi_x)) continue;
      if (p.mult && std::fmod(d, (double)p.mult) != 0) continue;
      if (std::find(p.excl.begin(), p.excl.end(), d) != p.excl.end()) continue;
      return true;
    }
    return false;
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    const size_t n = code_points(str);
    for (const StrPart& p : s.strs) {
      if (n < p.min_len || n > p.max_len) continue;
      if (std::find(p.excl.begin(), p.excl.end(), str) != p.excl.end()) continue;
      bool ok = true;
      for (const auto& pat : p.patterns) ok = ok && regex_search(pat, str);
      if (ok) return true;
    }
    return false;
  }
  if (v.is_array()) {
    for (const ArrPart& p : s.arrs) {
      if (v.size() < p.min_items || v.size() > p.max_items) continue;
      bool ok = true;
      for (const json& e : p.excl) ok = ok && !json_equal(e, v);
      for (size_t i = 0; ok && i < v.size(); ++i) ok = contains_term(arr_elem_term(p, i), v[i], depth);
      for (const Contains& c : p.contains) {
        if (!ok) break;
        uint32_t k = 0;
        for (const json& e : v) k += contains_term(c.c, e, depth);
        ok = k >= c.min && k <= c.max;
      }
      if (ok && p.unique)
        for (size_t i = 0; ok && i < v.size(); ++i)
          for (size_t j = i + 1; ok && j < v.size(); ++j) ok = !json_equal(v[i], v[j]);
      if (ok) return true;
    }
    return false;
  }
  if (v.is_object()) {
    for (const ObjPart& p : s.objs) {
      if (v.size() < p.min_props || v.size() > p.max_props) continue;
      bool ok = true;
      for (const json& e : p.excl) ok = ok && !json_equal(e, v);
      for (const auto& k : p.required) ok = ok && v.contains(k);
      for (auto it = v.begin(); ok && it != v.end(); ++it) {
        ok = contains_term(obj_key_term(p, it.key()), it.value(), depth);
        for (const Term& nt : p.names) ok = ok && contains_term(nt, json(it.key()), depth);
      }
      if (ok) return true;
    }
    return false;
  }
  return false;
}

// --- regex probes: does a pattern match (search semantics) a literal string?

bool Compiler::regex_search(const std::string& pattern, const std::string& text) {
  auto it = regexes_.find(pattern);
  if (it == regexes_.end()) {
    auto probe = std::make_unique<RegexProbe>();
    std::string body = pattern;
    const bool anchored_start = !body.empty() && body[0] == '^';
    const bool anchored_end = body.size() >= 1 && body.back() == '$' && (body.size() < 2 || body[body.size() - 2] != '\\');
    auto e = regex_to_gbnf(body, lim_);
    if (!e.ok()) {
      probe->status = e.status();
    } else {
      std::string expr = e->substr(std::string("root ::= ").size());
      while (!expr.empty() && expr.back() == '\n') expr.pop_back();
      const std::string any = "[\\x00-\\U0010FFFF]*";
      auto g = compile_gbnf("root ::= " + std::string(anchored_start ? "" : any + " ") + "(" + expr + ")" +
                                (anchored_end ? "" : " " + any) + "\n",
                            lim_);
      if (g.ok()) probe->grammar = *g;
      else probe->status = g.status();
    }
    it = regexes_.emplace(pattern, std::move(probe)).first;
  }
  const RegexProbe& p = *it->second;
  if (!p.grammar) {
    fail("", "keyword 'pattern' / 'patternProperties': '" + pattern + "': " + p.status.message());
    return false;
  }
  static const auto empty_trie = std::make_shared<const TokenTrie>(std::vector<std::string>{}, std::vector<TokenId>{});
  GrammarMatcher m(p.grammar, empty_trie);
  return m.accept_bytes(text) && m.can_end();
}

}  // namespace serval::json_schema
