// Regular expression -> GBNF (grammar.h). Recursive descent bounded by
// GrammarLimits::max_nesting.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "sampler/grammar/grammar.h"
#include "sampler/grammar/grammar_internal.h"

namespace serval {

namespace {

std::string class_char(uint32_t c) {
  char buf[16];
  if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02X", c);
  else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04X", c);
  else std::snprintf(buf, sizeof buf, "\\U%08X", c);
  return buf;
}

std::string utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) s += (char)c;
  else if (c < 0x800) s += (char)(0xC0 | (c >> 6)), s += (char)(0x80 | (c & 0x3F));
  else if (c < 0x10000)
    s += (char)(0xE0 | (c >> 12)), s += (char)(0x80 | ((c >> 6) & 0x3F)), s += (char)(0x80 | (c & 0x3F));
  else
    s += (char)(0xF0 | (c >> 18)), s += (char)(0x80 | ((c >> 12) & 0x3F)), s += (char)(0x80 | ((c >> 6) & 0x3F)),
        s += (char)(0x80 | (c & 0x3F));
  return s;
}

class RegexParser {
 public:
  // json_string: the output is the body of a JSON string literal: characters
  // JSON must escape are written as escapes or left out of classes, and
  // negated shorthands (\D \W \S) and `.` keep to characters every regex
  // engine agrees on (printable ASCII for the shorthands), so a string
  // generated here matches the pattern under any validator's regex engine.
  RegexParser(std::string_view re, const GrammarLimits& lim, bool json_string = false)
      : s_(re), lim_(lim), json_(json_string) {}

  Expected<std::string> run() {
    if (s_.size() > lim_.max_source_bytes)
      return Status(StatusCode::resource_exhausted, "regex: longer than the limit of " +
                                                        std::to_string(lim_.max_source_bytes) + " bytes");
    if (!s_.empty() && s_[0] == '^') ++pos_;
    std::string e = alt(0);
    if (err_.ok() && pos_ < s_.size()) fail(s_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    if (!err_.ok()) return err_;
    return e;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  const GrammarLimits& lim_;
  bool json_ = false;
  Status err_;

  using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

  static Ranges normalize(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (auto [lo, hi] : r) {
      if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
      else out.push_back({lo, hi});
    }
    return out;
  }
  static Ranges invert(const Ranges& r) {
    Ranges out;
    uint32_t next = 0;
    for (auto [lo, hi] : r) {
      if (lo > next) out.push_back({next, lo - 1});
      next = hi + 1;
    }
    if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
    return out;
  }
  static Ranges intersect(const Ranges& a, const Ranges& b) { return invert(normalize([&] {
    Ranges u = invert(a);
    const Ranges ib = invert(b);
    u.insert(u.end(), ib.begin(), ib.end());
    return u;
  }())); }
  static bool has(const Ranges& r, uint32_t c) {
    for (auto [lo, hi] : r)
      if (c >= lo && c <= hi) return true;
    return false;
  }
  static Ranges shorthand(char e) {
    switch (e) {
      case 'd': return {{'0', '9'}};
      case 'w': return normalize({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}});
      default: return normalize({{' ', ' '}, {'\t', '\r'}});  // \t \n \v \f \r
    }
  }
  // A JSON-string expression for a set of code points.
  std::string json_class(Ranges r) {
    r = normalize(r);
    std::string alts;
    for (auto [c, esc] : {std::pair<uint32_t, const char*>{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\t', "\\t"}})
      if (has(r, c)) alts += " | " + gbnf_literal(esc);
    r = intersect(r, invert(normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})));
    std::string body;
    for (auto [lo, hi] : r) body += class_char(lo) + (hi > lo ? "-" + class_char(hi) : std::string());
    std::string out = body.empty() ? std::string() : "[" + body + "]";
    if (!alts.empty()) out = "(" + (out.empty() ? alts.substr(3) : out + alts) + ")";
    if (out.empty()) fail("a character class with no character a JSON string can hold");
    return out;
  }
  std::string literal(uint32_t cp) {
    if (!json_) return gbnf_literal(utf8(cp));
    if (cp == '"') return gbnf_literal("\\\"");
    if (cp == '\\') return gbnf_literal("\\\\");
    if (cp < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04X", cp);
      return gbnf_literal(buf);
    }
    return gbnf_literal(utf8(cp));
  }

  void fail(const std::string& m) {
    if (err_.ok()) err_ = invalid_argument("regex: at offset " + std::to_string(pos_) + ": " + m);
  }
  bool eof() const { return pos_ >= s_.size(); }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }

  bool decode(uint32_t& cp) {
    if (!next_code_point(s_, pos_, cp)) return fail("invalid UTF-8"), false;
    return true;
  }

  bool hex(int digits, uint32_t& cp) {
    if (!read_hex(s_, pos_, digits, cp)) return fail("bad hex escape"), false;
    return true;
  }

  // After a backslash: a class shorthand (returns its GBNF class body, sets
  // is_class) or one code point.
  bool escape(uint32_t& cp, std::string& cls, bool& negated) {
    cls.clear();
    negated = false;
    if (eof()) return fail("trailing backslash"), false;
    const char e = s_[pos_++];
    switch (e) {
      case 'd': cls = "0-9"; return true;
      case 'D': cls = "0-9"; negated = true; return true;
      case 'w': cls = "a-zA-Z0-9_"; return true;
      case 'W': cls = "a-zA-Z0-9_"; negated = true; return true;
      case 's': cls = " \\t\\n\\r\\x0B\\x0C"; return true;
      case 'S': cls = " \\t\\n\\r\\x0B\\x0C"; negated = true; return true;
      case 'n': cp = '\n'; return true;
      case 't': cp = '\t'; return true;
      case 'r': cp = '\r'; return true;
      case 'f': cp = '\f'; return true;
      case 'v': cp = '\v'; return true;
      case '0': cp = 0; return true;
      case 'x': return hex(2, cp);
      case 'u': return hex(4, cp);
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
          --pos_;
          fail(std::string("unsupported escape '\\") + e + "' (backreferences, anchors and classes like it are not supported)");
          return false;
        }
        cp = (unsigned char)e;
        return true;
    }
  }

  // [...] after the '[': the set as sorted ranges and whether it is negated.
  bool parse_class(Ranges& r, bool& neg) {
    neg = false;
    if (peek() == '^') neg = true, ++pos_;
    bool first = true;
    while (!eof() && (peek() != ']' || first)) {
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        ++pos_;
        const char e = peek();
        std::string cls;
        bool sneg = false;
        if (!escape(lo, cls, sneg)) return false;
        if (!cls.empty()) {
          if (sneg) return fail("negated shorthand (\\D \\W \\S) inside [...] is not supported"), false;
          const Ranges sh = shorthand(e);
          r.insert(r.end(), sh.begin(), sh.end());
          continue;
        }
      } else if (!decode(lo)) {
        return false;
      }
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        std::string cls;
        bool sneg = false;
        if (peek() == '\\') {
          ++pos_;
          if (!escape(hi, cls, sneg)) return false;
          if (!cls.empty()) return fail("a class shorthand cannot end a range"), false;
        } else if (!decode(hi)) {
          return false;
        }
        if (hi < lo) return fail("reversed range in [...]"), false;
      }
      r.push_back({lo, hi});
    }
    if (eof()) return fail("unterminated [...]"), false;
    ++pos_;
    r = normalize(r);
    return true;
  }

  std::string char_class() {  // after '['
    Ranges r;
    bool neg = false;
    if (!parse_class(r, neg)) return {};
    if (json_) return json_class(neg ? invert(r) : r);
    std::string out = neg ? "[^" : "[";
    for (auto [lo, hi] : r) out += class_char(lo) + (hi > lo ? "-" + class_char(hi) : std::string());
    return out + "]";
  }

  std::string alt(size_t depth) {
    if (depth > lim_.max_nesting) {
      err_ = Status(StatusCode::resource_exhausted,
                    "regex: nesting deeper than the limit of " + std::to_string(lim_.max_nesting));
      return {};
    }
    std::string out = seq(depth);
    bool multi = false;
    while (err_.ok() && peek() == '|') {
      ++pos_;
      out += " | " + seq(depth);
      multi = true;
    }
    return multi ? "(" + out + ")" : out;
  }

  std::string seq(size_t depth) {
    std::string out = "(\"\"";
    while (err_.ok() && !eof() && peek() != '|' && peek() != ')') {
      std::string atom;
      const char c = peek();
      if (c == '$' && pos_ + 1 == s_.size()) {
        ++pos_;
        break;
      }
      if (c == '(') {
        ++pos_;
        if (peek() == '?') {
          if (pos_ + 1 < s_.size() && s_[pos_ + 1] == ':') pos_ += 2;
          else return fail("only (?: ) groups are supported (no lookaround or named groups)"), std::string();
        }
        atom = "(" + alt(depth + 1) + ")";
        if (!err_.ok()) return {};
        if (peek() != ')') return fail("missing ')'"), std::string();
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        atom = char_class();
      } else if (c == '.') {
        ++pos_;
        atom = json_ ? json_class(invert({{'\n', '\n'}})) : "[^\\n]";
      } else if (c == '\\') {
        ++pos_;
        uint32_t cp;
        std::string cls;
        bool neg;
        const char e = peek();
        if (!escape(cp, cls, neg)) return {};
        if (json_ && !cls.empty()) {
          const Ranges sh = shorthand((char)std::tolower((unsigned char)e));
          atom = json_class(neg ? intersect(invert(sh), {{0x20, 0x7E}}) : sh);
        } else {
          atom = cls.empty() ? literal(cp) : (neg ? "[^" : "[") + cls + "]";
        }
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return fail("quantifier without a preceding item"), std::string();
      } else if (c == '^' || c == '$') {
        return fail("anchors are only supported at the start (^) and end ($)"), std::string();
      } else {
        uint32_t cp;
        if (!decode(cp)) return {};
        atom = literal(cp);
      }
      if (!err_.ok()) return {};
      atom += quantifier();
      out += " " + atom;
    }
    return out + ")";
  }

  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t b = pos_;
      ++pos_;
      auto num = [&](uint64_t& v) {
        if (!(peek() >= '0' && peek() <= '9')) return false;
        v = 0;
        while (peek() >= '0' && peek() <= '9') {
          v = v * 10 + (uint64_t)(peek() - '0');
          if (v > lim_.max_repetition) {
            err_ = Status(StatusCode::resource_exhausted, "regex: repetition count exceeds the limit of " +
                                                              std::to_string(lim_.max_repetition));
            return false;
          }
          ++pos_;
        }
        return true;
      };
      uint64_t m = 0, n = 0;
      if (!num(m)) return err_.ok() ? (fail("bad {m,n} quantifier"), std::string()) : std::string();
      q = "{" + std::to_string(m);
      if (peek() == ',') {
        ++pos_;
        q += ",";
        if (peek() != '}') {
          if (!num(n)) return err_.ok() ? (fail("bad {m,n} quantifier"), std::string()) : std::string();
          if (n < m) return fail("{m,n} with n < m"), std::string();
          q += std::to_string(n);
        }
      }
      if (peek() != '}') {
        pos_ = b;
        return fail("bad {m,n} quantifier"), std::string();
      }
      ++pos_;
      q += "}";
    } else {
      return {};
    }
    if (peek() == '?') ++pos_;  // lazy: same language
    else if (peek() == '+') return fail("possessive quantifiers are not supported"), std::string();
    return q;
  }
};

}  // namespace

Expected<std::string> regex_to_gbnf_expr(std::string_view regex, const GrammarLimits& limits) {
  return RegexParser(regex, limits).run();
}

Expected<std::string> regex_to_json_string_gbnf(std::string_view regex, const GrammarLimits& limits) {
  return RegexParser(regex, limits, true).run();
}

Expected<std::string> regex_to_gbnf(std::string_view regex, const GrammarLimits& limits) {
  auto e = regex_to_gbnf_expr(regex, limits);
  if (!e.ok()) return e.status();
  return "root ::= " + *e + "\n";
}

Expected<GrammarPtr> compile_regex(std::string_view regex, const GrammarLimits& limits) {
  auto g = regex_to_gbnf(regex, limits);
  if (!g.ok()) return g.status();
  return compile_gbnf(*g, limits);
}

}  // namespace serval
