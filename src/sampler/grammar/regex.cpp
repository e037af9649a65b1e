// Regular expression -> GBNF (grammar.h). Recursive descent bounded by
// GrammarLimits::max_nesting.
#include <string>

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
  RegexParser(std::string_view re, const GrammarLimits& lim) : s_(re), lim_(lim) {}

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
  Status err_;

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

  std::string char_class() {  // after '['
    std::string out = "[";
    if (peek() == '^') out += '^', ++pos_;
    bool first = true;
    while (!eof() && (peek() != ']' || first)) {
      first = false;
      uint32_t lo;
      std::string cls;
      bool neg = false;
      if (peek() == '\\') {
        ++pos_;
        if (!escape(lo, cls, neg)) return {};
        if (!cls.empty()) {
          if (neg) return fail("negated shorthand (\\D \\W \\S) inside [...] is not supported"), std::string();
          out += cls;
          continue;
        }
      } else if (!decode(lo)) {
        return {};
      }
      out += class_char(lo);
      if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        if (peek() == '\\') {
          ++pos_;
          if (!escape(hi, cls, neg)) return {};
          if (!cls.empty()) return fail("a class shorthand cannot end a range"), std::string();
        } else if (!decode(hi)) {
          return {};
        }
        if (hi < lo) return fail("reversed range in [...]"), std::string();
        out += "-" + class_char(hi);
      }
    }
    if (eof()) return fail("unterminated [...]"), std::string();
    ++pos_;
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
        atom = "[^\\n]";
      } else if (c == '\\') {
        ++pos_;
        uint32_t cp;
        std::string cls;
        bool neg;
        if (!escape(cp, cls, neg)) return {};
        atom = cls.empty() ? gbnf_literal(utf8(cp)) : (neg ? "[^" : "[") + cls + "]";
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return fail("quantifier without a preceding item"), std::string();
      } else if (c == '^' || c == '$') {
        return fail("anchors are only supported at the start (^) and end ($)"), std::string();
      } else {
        uint32_t cp;
        if (!decode(cp)) return {};
        atom = gbnf_literal(utf8(cp));
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
