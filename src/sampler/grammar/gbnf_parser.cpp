// GBNF text -> CompiledGrammar (grammar.h). A recursive-descent parser whose
// recursion is bounded by GrammarLimits::max_nesting, followed by the checks
// (undefined rules, left recursion) and the flattening into one element array.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "sampler/grammar/grammar.h"
#include "sampler/grammar/grammar_internal.h"

namespace serval {

bool CharClass::contains(uint32_t c) const {
  if (c < 128) return (ascii[c >> 6] >> (c & 63)) & 1;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                             [](uint32_t v, const std::pair<uint32_t, uint32_t>& r) { return v < r.first; });
  if (it == ranges.begin()) return false;
  --it;
  return c <= it->second;
}

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
  for (const auto& r : ranges)
    if (r.first <= hi && lo <= r.second) return true;
  return false;
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += (char)c;
    }
  }
  return out + "\"";
}

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r, bool negate) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, hi);
    else merged.push_back({lo, hi});
  }
  if (!negate) return merged;
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : merged) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

// One rule under construction: its alternatives, each a sequence of elements.
using Seq = std::vector<GrammarElem>;

class Parser {
 public:
  Parser(std::string_view src, const GrammarLimits& lim) : s_(src), lim_(lim) {
    start_ = std::chrono::steady_clock::now();
  }

  Expected<GrammarPtr> run();

 private:
  std::string_view s_;
  size_t pos_ = 0;
  const GrammarLimits& lim_;
  std::chrono::steady_clock::time_point start_;
  Status err_;
  size_t n_elems_ = 0;

  std::vector<std::vector<Seq>> rules_;
  std::vector<std::string> names_;
  std::vector<size_t> def_pos_;  // source offset + 1 of the definition; 0 = not defined yet
  std::vector<size_t> first_use_pos_;
  std::map<std::string, uint32_t, std::less<>> ids_;
  std::vector<Ranges> classes_;
  std::map<Ranges, uint32_t> class_ids_;

  bool failed() const { return !err_.ok(); }
  bool fail(const std::string& m) {
    if (err_.ok()) err_ = invalid_argument("grammar: line " + std::to_string(line()) + ": " + m);
    return false;
  }
  bool over_budget(const std::string& what, size_t limit) {
    if (err_.ok())
      err_ = Status(StatusCode::resource_exhausted,
                    "grammar: " + what + " exceeds the limit of " + std::to_string(limit));
    return false;
  }
  size_t line_at(size_t pos) const {
    return 1 + (size_t)std::count(s_.begin(), s_.begin() + (long)std::min(pos, s_.size()), '\n');
  }
  size_t line() const { return line_at(pos_); }
  bool eof() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }

  bool check_time() {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    if (ms > lim_.max_compile_ms) return over_budget("compile time (ms)", (size_t)lim_.max_compile_ms);
    return true;
  }

  uint32_t rule_id(std::string_view name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = (uint32_t)rules_.size();
    ids_.emplace(std::string(name), id);
    rules_.emplace_back();
    names_.emplace_back(name);
    def_pos_.push_back(0);
    first_use_pos_.push_back(pos_);
    return id;
  }
  uint32_t new_rule(const std::string& base) {
    std::string name = base.substr(0, base.find('~')) + "~" + std::to_string(rules_.size());
    const uint32_t id = rule_id(name);
    def_pos_[id] = pos_ + 1;
    return id;
  }
  uint32_t class_id(Ranges r) {
    auto it = class_ids_.find(r);
    if (it != class_ids_.end()) return it->second;
    const uint32_t id = (uint32_t)classes_.size();
    classes_.push_back(r);
    class_ids_.emplace(std::move(r), id);
    return id;
  }
  bool add_elems(size_t n) {
    n_elems_ += n;
    if (n_elems_ > lim_.max_elements) return over_budget("grammar size (elements)", lim_.max_elements);
    if (rules_.size() > lim_.max_rules) return over_budget("number of rules", lim_.max_rules);
    if (classes_.size() > lim_.max_classes) return over_budget("number of character classes", lim_.max_classes);
    return true;
  }

  static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  void skip_space(bool newline_ok) {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t') ++pos_;
      else if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) ++pos_;
      else break;
    }
  }

  std::string_view parse_name() {
    const size_t b = pos_;
    while (!eof() && is_word(peek())) ++pos_;
    return s_.substr(b, pos_ - b);
  }

  // One UTF-8 code point of the source.
  bool decode_utf8(uint32_t& cp) {
    if (!next_code_point(s_, pos_, cp)) return fail("invalid UTF-8 in the grammar");
    return true;
  }

  bool parse_hex(int digits, uint32_t& cp) {
    if (!read_hex(s_, pos_, digits, cp)) return fail("expected " + std::to_string(digits) + " hex digits in an escape");
    if (cp > kMaxCodePoint) return fail("code point out of range in an escape");
    return true;
  }

  // A character of a literal or class, escapes resolved.
  bool parse_char(uint32_t& cp) {
    if (eof()) return fail("unexpected end of input");
    if (peek() != '\\') return decode_utf8(cp);
    ++pos_;
    const char e = peek();
    ++pos_;
    switch (e) {
      case 'x': return parse_hex(2, cp);
      case 'u': return parse_hex(4, cp);
      case 'U': return parse_hex(8, cp);
      case 't': cp = '\t'; return true;
      case 'r': cp = '\r'; return true;
      case 'n': cp = '\n'; return true;
      case '\\': case '"': case '[': case ']': case '-': case '^': case '/': cp = (uint32_t)e; return true;
      default: --pos_; return fail(std::string("unknown escape '\\") + e + "'");
    }
  }

  bool parse_alternates(uint32_t rule, size_t depth);

  bool parse_sequence(Seq& seq, const std::string& rule_name, size_t depth) {
    size_t last_start = seq.size();
    while (!eof()) {
      if (!check_time()) return false;
      const char c = peek();
      if (c == '"') {
        ++pos_;
        last_start = seq.size();
        while (peek() != '"') {
          if (eof() || peek() == '\n') return fail("unterminated string literal");
          uint32_t cp;
          if (!parse_char(cp)) return false;
          seq.push_back({GrammarElem::term, class_id({{cp, cp}})});
          if (!add_elems(1)) return false;
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        bool neg = false;
        if (peek() == '^') neg = true, ++pos_;
        Ranges r;
        while (peek() != ']') {
          if (eof()) return fail("unterminated character class");
          uint32_t lo, hi;
          if (!parse_char(lo)) return false;
          hi = lo;
          if (peek() == '-' && peek(1) != ']') {
            ++pos_;
            if (!parse_char(hi)) return false;
            if (hi < lo) return fail("character range is reversed");
          }
          r.push_back({lo, hi});
          if (r.size() > 4096) return over_budget("ranges in one character class", 4096);
        }
        ++pos_;
        last_start = seq.size();
        seq.push_back({GrammarElem::term, class_id(normalize(std::move(r), neg))});
        if (!add_elems(1)) return false;
      } else if (c == '.') {
        ++pos_;
        last_start = seq.size();
        seq.push_back({GrammarElem::term, class_id({{0, kMaxCodePoint}})});
        if (!add_elems(1)) return false;
      } else if (is_word(c)) {
        const std::string_view name = parse_name();
        if (!failed() && peek() == ':' ) return fail("missing newline before rule '" + std::string(name) + "'");
        last_start = seq.size();
        seq.push_back({GrammarElem::ref, rule_id(name)});
        if (!add_elems(1)) return false;
      } else if (c == '(') {
        if (depth + 1 > lim_.max_nesting) return over_budget("nesting depth of ( ) groups", lim_.max_nesting);
        ++pos_;
        skip_space(true);
        const uint32_t sub = new_rule(rule_name);
        if (!parse_alternates(sub, depth + 1)) return false;
        if (peek() != ')') return fail("expected ')'");
        ++pos_;
        last_start = seq.size();
        seq.push_back({GrammarElem::ref, sub});
        if (!add_elems(1)) return false;
      } else if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        if (!repeat(seq, last_start, c == '+' ? 1 : 0, c == '?' ? 1 : -1, rule_name)) return false;
      } else if (c == '{') {
        ++pos_;
        skip_space(true);
        uint64_t m = 0;
        int64_t n = -1;
        if (!parse_int(m)) return false;
        skip_space(true);
        if (peek() == ',') {
          ++pos_;
          skip_space(true);
          if (peek() != '}') {
            uint64_t nn;
            if (!parse_int(nn)) return false;
            n = (int64_t)nn;
            if (n < (int64_t)m) return fail("repetition {m,n} with n < m");
          }
        } else {
          n = (int64_t)m;
        }
        skip_space(true);
        if (peek() != '}') return fail("expected '}' after a repetition count");
        ++pos_;
        if (!repeat(seq, last_start, (int)m, (int)n, rule_name)) return false;
      } else {
        break;
      }
      skip_space(depth > 0);
    }
    return !failed();
  }

  bool parse_int(uint64_t& v) {
    if (!(peek() >= '0' && peek() <= '9')) return fail("expected a number in a repetition");
    v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (uint64_t)(peek() - '0');
      if (v > lim_.max_repetition) return over_budget("repetition count", lim_.max_repetition);
      ++pos_;
    }
    return true;
  }

  // seq[last_start..] is the item x; replaces it by x{min,max} (max < 0: unbounded).
  bool repeat(Seq& seq, size_t last_start, int min, int max, const std::string& rule_name) {
    if (last_start >= seq.size()) return fail("repetition operator without a preceding item");
    Seq item(seq.begin() + (long)last_start, seq.end());
    seq.resize(last_start);
    if (item.size() > 1) {  // repeat one reference, not a long literal
      const uint32_t wrap = new_rule(rule_name);
      rules_[wrap].push_back(item);
      item.assign(1, {GrammarElem::ref, wrap});
    }
    for (int i = 0; i < min; ++i) seq.push_back(item[0]);
    if (!add_elems((size_t)min)) return false;
    const int n_opt = max < 0 ? 1 : max - min;
    uint32_t last = 0;
    for (int i = 0; i < n_opt; ++i) {
      const uint32_t r = new_rule(rule_name);
      Seq alt = item;
      if (max < 0) alt.push_back({GrammarElem::ref, r});
      else if (i > 0) alt.push_back({GrammarElem::ref, last});
      rules_[r].push_back(std::move(alt));
      rules_[r].push_back({});
      last = r;
      if (!add_elems(4)) return false;
      if ((i & 255) == 0 && !check_time()) return false;
    }
    if (n_opt > 0) seq.push_back({GrammarElem::ref, last});
    return true;
  }

  bool parse_rule() {
    const size_t name_pos = pos_;
    const std::string_view name = parse_name();
    if (name.empty()) return fail("expected a rule name");
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") return fail("expected '::=' after rule name '" + std::string(name) + "'");
    pos_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name);
    if (def_pos_[id] != 0) return fail("rule '" + std::string(name) + "' is defined twice");
    def_pos_[id] = name_pos + 1;
    if (!parse_alternates(id, 0)) return false;
    if (!eof() && peek() != '\n' && peek() != '\r') return fail(std::string("unexpected character '") + peek() + "'");
    return true;
  }

  Status check_and_flatten(CompiledGrammar& g);
};

bool Parser::parse_alternates(uint32_t rule, size_t depth) {
  const std::string name = names_[rule];
  for (;;) {
    Seq seq;
    if (!parse_sequence(seq, name, depth)) return false;
    rules_[rule].push_back(std::move(seq));
    if (peek() != '|') break;
    ++pos_;
    skip_space(true);
  }
  return true;
}

Status Parser::check_and_flatten(CompiledGrammar& g) {
  const size_t n = rules_.size();
  auto rit = ids_.find("root");
  if (rit == ids_.end() || def_pos_[rit->second] == 0) return invalid_argument("grammar: no 'root' rule");
  for (size_t r = 0; r < n; ++r)
    if (def_pos_[r] == 0)
      return invalid_argument("grammar: line " + std::to_string(line_at(first_use_pos_[r])) + ": rule '" + names_[r] +
                              "' is used but not defined");
  // Nullable rules (can match ""), by fixpoint.
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    if (!check_time()) return err_;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq& alt : rules_[r]) {
        bool all = true;
        for (const GrammarElem& e : alt)
          if (e.kind != GrammarElem::ref || !nullable[e.value]) { all = false; break; }
        if (all) { nullable[r] = 1; changed = true; break; }
      }
    }
  }
  // Left-recursion: a cycle in "r may start with s" (s after nullable refs).
  std::vector<std::vector<uint32_t>> first(n);
  for (size_t r = 0; r < n; ++r)
    for (const Seq& alt : rules_[r])
      for (const GrammarElem& e : alt) {
        if (e.kind != GrammarElem::ref) break;
        first[r].push_back(e.value);
        if (!nullable[e.value]) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the DFS path, 2 done
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (size_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    stack.push_back({(uint32_t)s, 0});
    color[s] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i < first[r].size()) {
        const uint32_t t = first[r][i++];
        if (color[t] == 1) {
          // Helper rules are named "<rule>~N": report the rule they belong to.
          const std::string& nm = names_[t];
          return invalid_argument("grammar: rule '" + nm.substr(0, nm.find('~')) + "' is left-recursive");
        }
        if (color[t] == 0) {
          color[t] = 1;
          stack.push_back({t, 0});
        }
      } else {
        color[r] = 2;
        stack.pop_back();
      }
    }
  }
  // Shortest completion of each rule, in code points, by fixpoint. A rule
  // with none matches no finite string: alternatives that use one can never
  // complete, so they are dropped (the matcher then never enters a branch
  // that cannot end); a root with none is an error.
  constexpr uint32_t kInf = CompiledGrammar::kNoEnd;
  auto seq_min = [&](const Seq& alt, const std::vector<uint32_t>& ml) {
    uint64_t sum = 0;
    for (const GrammarElem& e : alt) {
      const uint32_t m = e.kind == GrammarElem::ref ? ml[e.value] : (classes_[e.value].empty() ? kInf : 1u);
      if (m == kInf) return kInf;
      sum += m;
    }
    return (uint32_t)std::min<uint64_t>(sum, kInf - 1);
  };
  std::vector<uint32_t> min_len(n, kInf);
  for (bool changed = true; changed;) {
    changed = false;
    if (!check_time()) return err_;
    for (size_t r = 0; r < n; ++r)
      for (const Seq& alt : rules_[r]) {
        const uint32_t m = seq_min(alt, min_len);
        if (m < min_len[r]) { min_len[r] = m; changed = true; }
      }
  }
  if (min_len[rit->second] == kInf)
    return invalid_argument("grammar: rule 'root' matches no finite string (every alternative recurses forever or uses an empty class)");
  for (size_t r = 0; r < n; ++r)
    std::erase_if(rules_[r], [&](const Seq& alt) { return seq_min(alt, min_len) == kInf; });
  // Flatten.
  g.rule_alts.resize(n);
  g.rule_min = min_len;
  g.rule_names = names_;
  for (size_t r = 0; r < n; ++r)
    for (const Seq& alt : rules_[r]) {
      g.rule_alts[r].push_back((uint32_t)g.elems.size());
      g.elems.insert(g.elems.end(), alt.begin(), alt.end());
      g.elems.push_back({GrammarElem::end, 0});
    }
  // min_rest[p]: the shortest completion from element p to its alternative's end.
  g.min_rest.assign(g.elems.size(), 0);
  for (size_t p = g.elems.size(); p-- > 0;) {
    const GrammarElem& e = g.elems[p];
    if (e.kind == GrammarElem::end) continue;
    const uint32_t m = e.kind == GrammarElem::ref ? min_len[e.value] : 1u;
    g.min_rest[p] = (uint32_t)std::min<uint64_t>((uint64_t)m + g.min_rest[p + 1], kInf - 1);
  }
  g.classes.resize(classes_.size());
  for (size_t c = 0; c < classes_.size(); ++c) {
    CharClass& cc = g.classes[c];
    cc.ranges = classes_[c];
    for (auto [lo, hi] : cc.ranges)
      for (uint32_t x = lo; x <= hi && x < 128; ++x) cc.ascii[x >> 6] |= 1ull << (x & 63);
  }
  g.root = rit->second;
  return {};
}

Expected<GrammarPtr> Parser::run() {
  if (s_.size() > lim_.max_source_bytes)
    return Status(StatusCode::resource_exhausted, "grammar: source of " + std::to_string(s_.size()) +
                                                      " bytes exceeds the limit of " + std::to_string(lim_.max_source_bytes));
  skip_space(true);
  while (!eof()) {
    if (!parse_rule()) break;
    skip_space(true);
  }
  if (failed()) return err_;
  auto g = std::make_shared<CompiledGrammar>();
  g->source = std::string(s_);
  Status st = check_and_flatten(*g);
  if (!st.ok()) return st;
  return GrammarPtr(std::move(g));
}

}  // namespace

Expected<GrammarPtr> compile_gbnf(std::string_view text, const GrammarLimits& limits) {
  Parser p(text, limits);
  return p.run();
}

Expected<GrammarPtr> compile_choice(const std::vector<std::string>& choices, const GrammarLimits& limits) {
  if (choices.empty()) return invalid_argument("choice: expected at least one string");
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) g += " | ";
    g += gbnf_literal(choices[i]);
    if (g.size() > limits.max_source_bytes)
      return Status(StatusCode::resource_exhausted, "choice: the choices exceed the limit of " +
                                                        std::to_string(limits.max_source_bytes) + " bytes");
  }
  return compile_gbnf(g, limits);
}

}  // namespace serval
