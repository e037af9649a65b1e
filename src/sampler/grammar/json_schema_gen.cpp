// JSON Schema compiler, stage 2: value sets -> GBNF (json_schema_internal.h).
// Output JSON is compact: one optional space after , : { [ and values.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "sampler/grammar/grammar_internal.h"
#include "sampler/grammar/json_schema_internal.h"

namespace serval::json_schema {

namespace {

const char* const kPrimitives[][2] = {
    {"space", "\" \"?"},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})"},
    {"string", "\"\\\"\" char* \"\\\"\" space"},
    {"int", "\"-\"? ([0-9] | [1-9] [0-9]{0,14})"},
    {"number", "int (\".\" [0-9]{0,7} [1-9])? space"},
    {"never", "\"!\" never"},
    {"date", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])"},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}"},
    {"email", "[a-z0-9._]{1,20} \"@\" [a-z0-9]{1,20} \".\" [a-z]{2,3}"},
    {"ipv4", "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]) (\".\" (\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9])){3}"},
};

constexpr int64_t kBig = 999999999999999;  // integers are generated within +-kBig (15 digits)
constexpr int64_t kFracInt = 999999;       // integer part of generated fractions (<= 6 digits, 14 significant)

std::string digits_class(char lo, char hi) {
  if (lo == hi) return std::string("\"") + lo + "\"";
  return std::string("[") + lo + "-" + hi + "]";
}

// Equal-length decimal strings x <= y: every string between them.
std::string same_len(const std::string& x, const std::string& y) {
  const size_t n = x.size();
  if (n == 0) return "\"\"";
  if (x == y) return "\"" + x + "\"";
  if (x[0] == y[0]) return "\"" + std::string(1, x[0]) + "\" " + same_len(x.substr(1), y.substr(1));
  const std::string xr = x.substr(1), yr = y.substr(1);
  const bool x_zeros = xr.find_first_not_of('0') == std::string::npos;
  const bool y_nines = yr.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  if (!x_zeros) alts.push_back("\"" + std::string(1, x[0]) + "\" " + same_len(xr, std::string(n - 1, '9')));
  const char mlo = x_zeros ? x[0] : (char)(x[0] + 1);
  const char mhi = y_nines ? y[0] : (char)(y[0] - 1);
  if (mlo <= mhi) alts.push_back(digits_class(mlo, mhi) + (n > 1 ? " [0-9]{" + std::to_string(n - 1) + "}" : ""));
  if (!y_nines) alts.push_back("\"" + std::string(1, y[0]) + "\" " + same_len(std::string(n - 1, '0'), yr));
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : " | ") + a;
  return "(" + out + ")";
}

// Non-negative a <= b.
std::string nonneg_range(int64_t a, int64_t b) {
  std::vector<std::string> alts;
  int64_t p = 1;  // 10^(d-1); up to 17 digits (callers stay within +-10^15)
  for (int d = 1; d <= 17; ++d) {
    const int64_t len_lo = d == 1 ? 0 : p, len_hi = p * 10 - 1;
    const int64_t x = std::max(a, len_lo), y = std::min(b, len_hi);
    if (x <= y) alts.push_back(same_len(std::to_string(x), std::to_string(y)));
    if (d < 17) p *= 10;
  }
  std::string out;
  for (const auto& s : alts) out += (out.empty() ? "" : " | ") + s;
  return alts.size() == 1 ? out : "(" + out + ")";
}

}  // namespace

std::string int_range_gbnf(int64_t lo, int64_t hi) {
  if (lo > hi) return "";
  std::vector<std::string> alts;
  if (lo < 0) {
    const int64_t a = hi < 0 ? -hi : 1, b = -lo;
    alts.push_back("\"-\" " + nonneg_range(a, b));
  }
  if (hi >= 0) alts.push_back(nonneg_range(std::max<int64_t>(lo, 0), hi));
  if (alts.size() == 1) return alts[0];
  return "(" + alts[0] + " | " + alts[1] + ")";
}

std::string Compiler::primitive(const std::string& name) {
  for (const auto& p : kPrimitives)
    if (name == p[0]) {
      if (!rules_.count(name)) {
        rules_[name] = p[1];
        if (name == "string") primitive("char");
        if (name == "number") primitive("int");
        if (name == "string" || name == "number") primitive("space");
      }
      return name;
    }
  fail("", "internal: unknown primitive " + name);
  return "space";
}

std::string Compiler::add_rule(const std::string& hint, const std::string& body, bool share) {
  // A body generated before is the same rule (many properties share one
  // string or item shape): large schemas stay within the rule budget.
  if (share)
    if (auto it = rule_of_body_.find(body); it != rule_of_body_.end()) return it->second;
  std::string base;
  for (char c : hint) base += (std::isalnum((unsigned char)c) ? c : '-');
  if (base.empty()) base = "r";
  if (base.size() > 40) base.resize(40);
  base = prefix_ + base;
  std::string name = base;
  for (int i = 1; rules_.count(name) || name == prefix_ + "root"; ++i) name = base + "-" + std::to_string(i);
  out_bytes_ += name.size() + body.size() + 6;
  if (out_bytes_ > lim_.max_source_bytes)
    exhausted("the grammar exceeds the size limit of " + std::to_string(lim_.max_source_bytes) + " bytes");
  rules_[name] = body;
  if (share) rule_of_body_.emplace(body, name);
  return name;
}

bool Compiler::term_empty(const Term& t) { return materialize(t).empty(); }

std::string Compiler::rule_for(const Term& t, const std::string& hint) {
  if (auto it = term_rules_.find(t.atoms); it != term_rules_.end()) return it->second;
  if (failed() || out_of_time()) return "space";
  const std::string name = add_rule(hint, "space", /*share=*/false);  // a placeholder: the body comes below
  term_rules_[t.atoms] = name;
  const Set s = materialize(t);  // a copy: generation may materialize more terms
  rules_[name] = gen_set(s, name);
  return name;
}

std::string Compiler::gen_set(const Set& s, const std::string& hint) {
  std::vector<std::string> alts;
  primitive("space");
  for (const json& v : s.values) alts.push_back(gbnf_literal(v.dump()) + " space");
  if (s.null_ok) alts.push_back("\"null\" space");
  if (s.true_ok) alts.push_back("\"true\" space");
  if (s.false_ok) alts.push_back("\"false\" space");
  for (const auto& p : s.nums)
    if (auto g = gen_num(p); !g.empty()) alts.push_back(g);
  for (const auto& p : s.strs)
    if (auto g = gen_str(p, hint + "-str"); !g.empty()) alts.push_back(g);
  for (const auto& p : s.arrs)
    if (auto g = gen_arr(p, hint + "-arr"); !g.empty()) alts.push_back(g);
  for (const auto& p : s.objs)
    if (auto g = gen_obj(p, hint + "-obj"); !g.empty()) alts.push_back(g);
  if (alts.empty()) return primitive("never");
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : " | ") + a;
  return out;
}

std::string Compiler::gen_num(const NumPart& in) {
  NumPart p = in;
  if (!p.excl.empty()) {
    // Stay clear of the excluded values: above the largest, else below the smallest.
    const double mx = *std::max_element(p.excl.begin(), p.excl.end());
    const double mn = *std::min_element(p.excl.begin(), p.excl.end());
    NumPart above = p, below = p;
    if (mx >= above.lo) above.lo = mx, above.lo_x = true;
    if (mn <= below.hi) below.hi = mn, below.hi_x = true;
    auto nonempty = [](const NumPart& x) { return x.lo < x.hi || (x.lo == x.hi && !x.lo_x && !x.hi_x); };
    p = nonempty(above) ? above : below;
    if (!nonempty(p)) return "";
  }
  std::vector<std::string> alts;
  const bool unbounded = std::isinf(p.lo) && std::isinf(p.hi);
  if (p.ints && p.fracs && unbounded) return primitive("number");
  if (p.ints) {
    int64_t L = -kBig, H = kBig;
    if (!std::isinf(p.lo)) {
      if (p.lo > (double)kBig) L = kBig + 1;
      else if (p.lo >= (double)-kBig) L = (int64_t)(p.lo_x ? std::floor(p.lo) + 1 : std::ceil(p.lo));
    }
    if (!std::isinf(p.hi)) {
      if (p.hi < (double)-kBig) H = -kBig - 1;
      else if (p.hi <= (double)kBig) H = (int64_t)(p.hi_x ? std::ceil(p.hi) - 1 : std::floor(p.hi));
    }
    if (L <= H) {
      if (p.mult) {
        const int64_t m = p.mult;
        if (L == -kBig && H == kBig && m <= 200) {
          // Multiples of m: a remainder automaton over the decimal digits.
          const std::string base = "mult" + std::to_string(m) + "-r";
          if (!rules_.count(base + "0")) {
            for (int64_t r = 0; r < m; ++r) {
              std::string body = r == 0 ? "\"\"" : "";
              for (int d = 0; d <= 9; ++d)
                body += std::string(body.empty() ? "" : " | ") + "\"" + std::to_string(d) + "\" " + base +
                        std::to_string((r * 10 + d) % m);
              rules_[base + std::to_string(r)] = body;
            }
          }
          std::string first;
          for (int d = 1; d <= 9; ++d)
            first += std::string(first.empty() ? "" : " | ") + "\"" + std::to_string(d) + "\" " + base + std::to_string(d % m);
          alts.push_back("(\"0\" | \"-\"? (" + first + ")) space");
        } else {
          // Bounded: the (at most 64) multiples nearest zero.
          const int64_t k_lo = (int64_t)std::ceil((double)L / (double)m), k_hi = (int64_t)std::floor((double)H / (double)m);
          std::vector<int64_t> ks;
          const int64_t center = std::clamp<int64_t>(0, k_lo, k_hi);
          for (int64_t step = 0; ks.size() < 64 && step < 64; ++step) {
            const int64_t cands[2] = {center + step, center - step};
            for (int64_t c : cands)
              if (c >= k_lo && c <= k_hi && std::find(ks.begin(), ks.end(), c) == ks.end()) ks.push_back(c);
          }
          std::string lits;
          for (int64_t k : ks) lits += (lits.empty() ? "" : " | ") + gbnf_literal(std::to_string(k * m));
          if (!lits.empty()) alts.push_back("(" + lits + ") space");
        }
      } else {
        alts.push_back(int_range_gbnf(L, H) + " space");
      }
    }
  }
  if (p.fracs) {
    const std::string frac = " \".\" [0-9]{0,7} [1-9]";
    // Non-negative: i.xxx with lo <= i and i + 1 <= hi.
    int64_t A = 0, B = kFracInt;
    if (!std::isinf(p.lo)) A = std::max<int64_t>(0, p.lo > (double)kFracInt ? kFracInt + 1 : (int64_t)std::ceil(p.lo));
    if (!std::isinf(p.hi)) B = p.hi < 1 ? -1 : std::min<int64_t>(kFracInt, (int64_t)std::floor(p.hi - 1));
    bool any = false;
    if (A <= B) alts.push_back(nonneg_range(A, B) + frac + " space"), any = true;
    // Negative: -(n.xxx) with -(n + 1) >= lo and -n <= hi.
    int64_t N0 = 0, N1 = kFracInt;
    if (!std::isinf(p.hi)) N0 = std::max<int64_t>(0, p.hi < (double)-kFracInt ? kFracInt + 1 : (int64_t)std::ceil(-p.hi));
    if (!std::isinf(p.lo)) N1 = p.lo > -1 ? -1 : std::min<int64_t>(kFracInt, (int64_t)std::floor(-p.lo - 1));
    if (N0 <= N1) alts.push_back("\"-\" " + nonneg_range(N0, N1) + frac + " space"), any = true;
    if (!any && !std::isinf(p.lo) && !std::isinf(p.hi) && p.lo >= 0 && p.hi <= (double)kFracInt) {
      // A narrow interval: a decimal prefix strictly inside it.
      for (int k = 1; k <= 6; ++k) {
        const double step = std::pow(10.0, -k);
        const double start = std::floor(p.lo / step) + 1;
        char buf[48];
        std::snprintf(buf, sizeof buf, "%.*f", k, start * step);
        char buf2[48];
        std::snprintf(buf2, sizeof buf2, "%.*f", k, (start + 1) * step);
        const double v0 = std::strtod(buf, nullptr), v1 = std::strtod(buf2, nullptr);
        if (v0 > p.lo && v1 < p.hi) {
          alts.push_back(gbnf_literal(buf) + " ([0-9]{0,6} [1-9])? space");
          break;
        }
      }
    }
  }
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : " | ") + a;
  return alts.size() > 1 ? "(" + out + ")" : out;
}

std::string Compiler::gen_str(const StrPart& in, const std::string& hint) {
  StrPart p = in;
  if (!p.excl.empty()) {
    // Longer than every excluded string.
    size_t longest = 0;
    for (const auto& e : p.excl) {
      size_t n = 0;
      for (unsigned char c : e) n += (c & 0xC0) != 0x80;
      longest = std::max(longest, n);
    }
    p.min_len = std::max<uint32_t>(p.min_len, (uint32_t)std::min<size_t>(longest + 1, kUnbounded - 1));
    if (p.min_len > p.max_len) return "";
  }
  if (p.min_len > lim_.max_repetition) {
    exhausted("keyword 'minLength': " + std::to_string(p.min_len) + " exceeds the limit of " + std::to_string(lim_.max_repetition));
    return "";
  }
  primitive("space");
  if (p.patterns.size() > 1) {
    if (gen_lost_.empty()) gen_lost_ = "pattern";
    return "";
  }
  if (p.patterns.size() == 1) {
    if (p.min_len > 0 || p.max_len != kUnbounded || !p.excl.empty()) {
      if (gen_lost_.empty()) gen_lost_ = "pattern";
      return "";
    }
    auto e = regex_to_json_string_gbnf(p.patterns[0], lim_);
    if (!e.ok()) {
      fail("", "keyword 'pattern': '" + p.patterns[0] + "': " + e.status().message());
      return "";
    }
    return add_rule(hint, "\"\\\"\" " + *e + " \"\\\"\" space");
  }
  if (p.min_len == 0 && p.max_len == kUnbounded) {
    std::string body;
    if (p.format == "date") body = primitive("date");
    else if (p.format == "time") body = primitive("time");
    else if (p.format == "date-time") body = primitive("date") + " \"T\" " + primitive("time");
    else if (p.format == "uuid") body = primitive("uuid");
    else if (p.format == "email") body = primitive("email");
    else if (p.format == "ipv4") body = primitive("ipv4");
    if (!body.empty()) return add_rule(hint, "\"\\\"\" " + body + " \"\\\"\" space");
    return primitive("string");
  }
  primitive("char");
  // Unbounded: open-ended (a bounded {m,n} expands into n helper rules).
  const uint32_t hi = std::min<uint32_t>(p.max_len, std::max<uint32_t>(p.min_len, lim_.max_repetition));
  const std::string rep = "{" + std::to_string(p.min_len) + "," +
                          (p.max_len == kUnbounded ? std::string() : std::to_string(hi)) + "}";
  return add_rule(hint, "\"\\\"\" char" + rep + " \"\\\"\" space");
}

std::string Compiler::gen_arr(const ArrPart& in, const std::string& hint) {
  ArrPart p = in;
  primitive("space");
  uint32_t lo = p.min_items, hi = p.max_items;
  if (!p.excl.empty()) {
    size_t longest = 0;
    for (const auto& e : p.excl) longest = std::max(longest, e.size());
    lo = std::max<uint32_t>(lo, (uint32_t)longest + 1);
  }
  uint64_t assigned64 = 0;
  for (const Contains& c : p.contains) {
    if (c.min > c.max) return "";
    assigned64 += c.min;
  }
  const uint32_t assigned = (uint32_t)std::min<uint64_t>(assigned64, kUnbounded - 1);
  lo = std::max(lo, assigned);
  if (lo > hi) return "";
  if (lo > lim_.max_repetition) {
    exhausted("keyword 'minItems': " + std::to_string(lo) + " exceeds the limit of " + std::to_string(lim_.max_repetition));
    return "";
  }
  if (p.unique && hi > 1) {
    // Unique items only where every element comes from a finite set: the
    // arrays are enumerated and checked.
    const size_t max_len = std::min<size_t>(hi, 8);
    std::vector<std::vector<json>> choices;
    for (size_t i = 0; i < max_len; ++i) {
      const Set& e = materialize(arr_elem_term(p, i));
      if (!e.nums.empty() || !e.strs.empty() || !e.arrs.empty() || !e.objs.empty()) {
        fail("", "keyword 'uniqueItems': only items from a finite set (enum, const, boolean, null) can be kept unique by a grammar");
        return "";
      }
      std::vector<json> vs = e.values;
      if (e.null_ok) vs.push_back(nullptr);
      if (e.true_ok) vs.push_back(true);
      if (e.false_ok) vs.push_back(false);
      choices.push_back(std::move(vs));
    }
    Set whole;
    whole.arrs.push_back(p);
    std::vector<std::string> lits;
    json cur = json::array();
    size_t visited = 0;
    auto dfs = [&](auto&& self) -> void {
      if (++visited > 4096 || lits.size() >= 256) return;
      if (cur.size() >= lo && contains(whole, cur)) lits.push_back(gbnf_literal(cur.dump()) + " space");
      if (cur.size() >= max_len) return;
      for (const json& v : choices[cur.size()]) {
        bool dup = false;
        for (const json& x : cur) dup = dup || x == v;
        if (dup) continue;
        cur.push_back(v);
        self(self);
        cur.erase(cur.size() - 1);
      }
    };
    dfs(dfs);
    if (lits.empty()) {
      if (gen_lost_.empty()) gen_lost_ = "uniqueItems";
      return "";
    }
    std::string out;
    for (const auto& l : lits) out += (out.empty() ? "" : " | ") + l;
    return add_rule(hint, out);
  }
  // Element terms: explicit positions first (prefixes, contains), then the rest.
  size_t P = 0;
  for (const ArrLayer& L : p.layers) P = std::max(P, L.prefix.size());
  std::vector<Atom> not_c;  // every element not assigned to a contains with a maximum avoids it
  for (const Contains& c : p.contains)
    if (c.max != kUnbounded && !c.c.atoms.empty()) not_c.push_back({c.c.atoms[0].node, !c.c.atoms[0].neg});
  auto avoid_except = [&](Term t, int keep) {
    for (size_t j = 0, m = 0; j < p.contains.size(); ++j) {
      if (p.contains[j].max == kUnbounded || p.contains[j].c.atoms.empty()) continue;
      if ((int)j != keep) t = term_and(t, Term{{not_c[m]}});
      ++m;
    }
    return t;
  };
  std::vector<Term> explicit_terms;
  const size_t E = std::max<size_t>(P, assigned);
  for (size_t i = 0, ci = 0, used = 0; i < E; ++i) {
    Term t = arr_elem_term(p, i);
    int keep = -1;
    while (ci < p.contains.size() && used >= p.contains[ci].min) ++ci, used = 0;
    if (i < assigned && ci < p.contains.size()) {
      t = term_and(t, p.contains[ci].c);
      keep = (int)ci;
      ++used;
    }
    explicit_terms.push_back(avoid_except(t, keep));
  }
  const Term rest = avoid_except(arr_elem_term(p, E), -1);
  const size_t Eh = std::min<size_t>(E, hi);
  // build(i): the elements from i on.
  std::string tail;
  if (hi > Eh) {
    const uint32_t rlo = lo > Eh ? lo - (uint32_t)Eh : 0;
    const uint32_t cap = std::max<uint32_t>(rlo, lim_.max_repetition);
    const uint32_t rhi = hi == kUnbounded ? cap : std::min<uint32_t>(hi - (uint32_t)Eh, cap);
    const bool open = hi == kUnbounded;  // open-ended: {m,} (a bounded {m,n} expands into n helper rules)
    const std::string item = rule_for(rest, hint + "-item");
    if (Eh == 0) {
      // item ("," item){rlo-1, rhi-1}, optional when rlo == 0
      const std::string more = "(\",\" space " + item + ")";
      const std::string rep = "{" + std::to_string(rlo > 0 ? rlo - 1 : 0) + "," +
                              (open ? std::string() : rhi > 0 ? std::to_string(rhi - 1) : std::string("0")) + "}";
      tail = rhi == 0 ? "" : (rlo > 0 ? item + " " + more + rep : "(" + item + " " + more + rep + ")?");
    } else {
      tail = "(\",\" space " + item + "){" + std::to_string(rlo) + "," + (open ? std::string() : std::to_string(rhi)) + "}";
    }
  }
  std::string inner = tail;
  for (size_t i = Eh; i-- > 0;) {
    const std::string el = (i > 0 ? "\",\" space " : "") + rule_for(explicit_terms[i], hint + "-" + std::to_string(i)) +
                           (inner.empty() ? "" : " " + inner);
    inner = i < lo ? el : "(" + el + ")?";
  }
  return add_rule(hint, "\"[\" space " + (inner.empty() ? std::string() : inner + " ") + "\"]\" space");
}

std::string Compiler::gen_obj(const ObjPart& p, const std::string& hint) {
  primitive("space");
  if (!p.excl.empty()) {
    if (gen_lost_.empty()) gen_lost_ = "not";
    return "";
  }
  // Keys: every declared one (all layers), then required ones declared nowhere.
  std::vector<std::string> keys;
  auto add_key = [&](const std::string& k) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  };
  bool patterns = false;
  for (const ObjLayer& L : p.layers) {
    for (const auto& kv : L.props) add_key(kv.first);
    patterns = patterns || !L.patterns.empty();
  }
  for (const auto& k : p.required) add_key(k);
  Term names;
  for (const Term& t : p.names) names = term_and(names, t);
  struct Key {
    std::string name;
    Term term;
    bool required;
  };
  std::vector<Key> usable;
  size_t n_required = 0;
  for (const auto& k : keys) {
    const bool req = std::find(p.required.begin(), p.required.end(), k) != p.required.end();
    Term t = obj_key_term(p, k);
    const bool ok = (names.any() || contains_term(names, json(k), 0)) && !term_empty(t);
    if (!ok) {
      if (req) return "";
      continue;
    }
    usable.push_back({k, t, req});
    n_required += req;
  }
  if (failed()) return "";
  if (n_required > p.max_props) return "";
  // Undeclared keys: longer than every declared one, so never one of them.
  // They are generated only where additionalProperties / unevaluatedProperties
  // asks for them explicitly, in free-form objects (no declared keys), or
  // where minProperties cannot be met otherwise: a schema that declares
  // properties and merely allows others gets its declared keys (as OpenAI's
  // structured outputs and llama.cpp do).
  Term other;
  bool explicit_other = false;
  for (const ObjLayer& L : p.layers) other = term_and(other, L.other), explicit_other = explicit_other || L.has_other;
  bool extras = !patterns && names.any() && p.max_props == kUnbounded && !term_empty(other);
  const bool extras_on_request = extras && (explicit_other || keys.empty());  // keys.empty(): a free-form object
  size_t longest = 0;
  for (const auto& k : keys) longest = std::max(longest, k.size());
  // Property counts: optional keys are capped (maxProperties) or promoted (minProperties).
  if (p.max_props != kUnbounded) {
    size_t room = p.max_props - n_required;
    std::vector<Key> kept;
    for (auto& k : usable)
      if (k.required || room > 0) {
        if (!k.required) --room;
        kept.push_back(std::move(k));
      }
    usable = std::move(kept);
  }
  uint32_t min_extras = 0;
  if (p.min_props > n_required) {
    size_t need = p.min_props - n_required;
    for (auto& k : usable)
      if (!k.required && need > 0) k.required = true, --need;
    if (need > 1 || (need == 1 && !extras)) {
      if (gen_lost_.empty()) gen_lost_ = "minProperties";
      return "";
    }
    min_extras = (uint32_t)need;
  }
  if (!extras_on_request && min_extras == 0) extras = false;
  std::string extra;
  if (extras) {
    primitive("char");
    const std::string key = "\"\\\"\" char{" + std::to_string(longest + 1) + "," + std::to_string(longest + 12) + "} \"\\\"\" space";
    extra = add_rule(hint + "-key", key) + " \":\" space " + rule_for(other, hint + "-extra");
  }
  std::vector<std::pair<std::string, bool>> kvs;
  for (const auto& k : usable)
    kvs.push_back({gbnf_literal(json(k.name).dump()) + " space \":\" space " + rule_for(k.term, hint + "-" + k.name), k.required});
  if (failed()) return "";
  // Declared order; required pairs always, optional ones may be skipped.
  // tail(i): the pairs after i, each preceded by ",".
  std::string extra_tail;
  if (!extra.empty()) extra_tail = min_extras ? " (\",\" space " + extra + ")+" : " (\",\" space " + extra + ")*";
  bool any_required = false;
  for (const auto& kv : kvs) any_required = any_required || kv.second;
  std::vector<std::string> tail(kvs.size() + 1);
  tail[kvs.size()] = extra_tail.empty() ? "\"\"" : extra_tail;
  for (size_t i = kvs.size(); i-- > 0;) {
    const std::string pair = "\",\" space " + kvs[i].first;
    const std::string body = kvs[i].second ? pair + " " + tail[i + 1] : "(" + pair + ")? " + tail[i + 1];
    tail[i] = i + 1 < kvs.size() || !extra_tail.empty() ? add_rule(hint + "-tail", body) : body;
  }
  // The first pair present has no comma: the first required one, or any
  // optional one before it, or (with no required pair) an extra one.
  std::string inner;
  for (size_t i = 0; i < kvs.size(); ++i) {
    if (min_extras && !any_required) break;  // an extra pair must come; it comes last
    inner += (inner.empty() ? "" : " | ") + kvs[i].first + " " + tail[i + 1];
    if (kvs[i].second) break;
  }
  if (!any_required && !extra.empty()) {
    const std::string more = " (\",\" space " + extra + ")*";
    if (min_extras) {
      // Optional declared pairs, then at least one extra.
      std::string opt;
      for (size_t i = kvs.size(); i-- > 0;) opt = "(" + kvs[i].first + " \",\" space)? " + opt;
      inner = opt + extra + more;
    } else {
      inner += (inner.empty() ? "" : " | ") + extra + more;
    }
  }
  std::string body = "\"{\" space ";
  if (!inner.empty()) body += any_required || min_extras ? "(" + inner + ")" : "(" + inner + ")?";
  return add_rule(hint, body + " \"}\" space");
}

}  // namespace serval::json_schema
