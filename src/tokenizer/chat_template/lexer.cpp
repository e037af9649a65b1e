#include "tokenizer/chat_template/lexer.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizer/chat_template/py_string.h"
#include "tokenizer/chat_template/value.h"
#include "tokenizer/unicode.h"

namespace serval::chat_template {

const char* describe(TokType t) {
  switch (t) {
    case TokType::data: return "template data";
    case TokType::variable_begin: return "begin of print statement";
    case TokType::variable_end: return "end of print statement";
    case TokType::block_begin: return "begin of statement block";
    case TokType::block_end: return "end of statement block";
    case TokType::name: return "name";
    case TokType::string: return "string";
    case TokType::integer: return "integer";
    case TokType::floating: return "float";
    case TokType::op: return "operator";
    case TokType::eof: return "end of template";
  }
  return "token";
}

namespace {

[[noreturn]] void lex_fail(int line, std::string msg) {
  throw TemplateError{StatusCode::invalid_argument, "syntax error: " + std::move(msg), line};
}

// Newlines normalized to \n and one trailing newline dropped
// (keep_trailing_newline=False), as jinja2's tokeniter does.
std::string normalize_source(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    char c = src[i];
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_source(source)) {}

  std::vector<Token> run() {
    toks_.reserve(src_.size() / 8 + 16);
    while (pos_ < src_.size()) root();
    Token eof;
    eof.type = TokType::eof;
    eof.line = line_;
    toks_.push_back(std::move(eof));
    return std::move(toks_);
  }

 private:
  // --- helpers --------------------------------------------------------------

  bool starts(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // Length of the Python-\s character at p (0 when it is not whitespace).
  size_t space_len(size_t p) const {
    unsigned char c = static_cast<unsigned char>(src_[p]);
    if (c < 0x80) return py::is_space(c) ? 1 : 0;
    size_t q = p;
    uint32_t cp = unicode::decode_utf8(src_, q);
    return py::is_space(cp) ? q - p : 0;
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size()) {
      size_t n = space_len(p);
      if (!n) break;
      p += n;
    }
    return p;
  }

  // Advances pos_ to p, counting lines.
  void advance(size_t p) {
    for (size_t i = pos_; i < p; ++i) {
      if (src_[i] == '\n') ++line_;
    }
    pos_ = p;
  }

  void emit(TokType t, std::string text, int line) {
    Token tok;
    tok.type = t;
    tok.line = line;
    tok.text = std::move(text);
    toks_.push_back(std::move(tok));
  }

  // jinja2's OptionalLStrip: the text before a tag, with `-` (strip all
  // trailing whitespace) or lstrip_blocks (drop the indentation of a line
  // that holds only the tag) applied. `start` is where the text begins.
  std::string strip_text(size_t start, size_t end, char sign, bool is_variable) const {
    std::string_view text(src_.data() + start, end - start);
    if (sign == '-') return py::strip(text, std::nullopt, py::StripSide::right);
    if (sign != '+' && !is_variable) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      bool line_starting = start == 0 || src_[start - 1] == '\n';
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        size_t p = start + l_pos;
        while (p < end) {
          size_t n = space_len(p);
          if (!n) break;
          p += n;
        }
        if (p == end) return std::string(text.substr(0, l_pos));
      }
    }
    return std::string(text);
  }

  // --- root state -------------------------------------------------------------

  void root() {
    size_t p = pos_;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) {
        // The rest is data.
        emit(TokType::data, src_.substr(pos_), line_);
        advance(src_.size());
        return;
      }
      char k = src_[p + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++p;
    }
    char kind = src_[p + 1];
    char sign = 0;
    if (p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+')) sign = src_[p + 2];
    size_t open_end = p + 2 + (sign ? 1 : 0);

    // {% raw %} (tried first, as in jinja2's alternation).
    size_t raw_end = 0;
    if (kind == '%') raw_end = match_raw_begin(open_end);

    int text_line = line_;
    std::string text = strip_text(pos_, p, sign, kind == '{');
    if (!text.empty()) emit(TokType::data, std::move(text), text_line);
    advance(p);

    if (raw_end) {
      advance(raw_end);
      raw_body();
      return;
    }
    int tag_line = line_;
    advance(open_end);
    if (kind == '#') {
      comment();
    } else if (kind == '%') {
      emit(TokType::block_begin, "", tag_line);
      tag(false);
    } else {
      emit(TokType::variable_begin, "", tag_line);
      tag(true);
    }
  }

  // Matches `\s*raw\s*(-%}\s*|%})` at p; returns the end position or 0.
  size_t match_raw_begin(size_t p) const {
    size_t q = skip_spaces(p);
    if (!starts(q, "raw")) return 0;
    q = skip_spaces(q + 3);
    if (starts(q, "-%}")) return skip_spaces(q + 3);
    if (starts(q, "%}")) return q + 2;
    return 0;
  }

  void raw_body() {
    size_t start = pos_;
    size_t p = start;
    while (true) {
      p = src_.find("{%", p);
      if (p == std::string::npos) lex_fail(line_, "missing end of raw directive");
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_spaces(q);
      if (starts(q, "endraw")) {
        q = skip_spaces(q + 6);
        size_t end = 0;
        if (starts(q, "+%}")) {
          end = q + 3;
        } else if (starts(q, "-%}")) {
          end = skip_spaces(q + 3);
        } else if (starts(q, "%}")) {
          end = q + 2;
          if (end < src_.size() && src_[end] == '\n') ++end;
        }
        if (end) {
          int text_line = line_;
          std::string text = strip_text(start, p, sign, false);
          if (!text.empty()) emit(TokType::data, std::move(text), text_line);
          advance(end);
          return;
        }
      }
      p += 2;
    }
  }

  void comment() {
    size_t p = pos_;
    while (true) {
      if (p >= src_.size()) lex_fail(line_, "missing end of comment tag");
      if (starts(p, "+#}")) {
        advance(p + 3);
        return;
      }
      if (starts(p, "-#}")) {
        advance(skip_spaces(p + 3));
        return;
      }
      if (starts(p, "#}")) {
        size_t e = p + 2;
        if (e < src_.size() && src_[e] == '\n') ++e;
        advance(e);
        return;
      }
      ++p;
    }
  }

  // --- inside {{ }} / {% %} ----------------------------------------------------

  void tag(bool variable) {
    std::string balance;  // expected closing brackets
    while (true) {
      if (pos_ >= src_.size()) return;  // the parser reports the missing end
      if (balance.empty()) {
        if (variable) {
          if (starts(pos_, "-}}")) {
            emit(TokType::variable_end, "", line_);
            advance(skip_spaces(pos_ + 3));
            return;
          }
          if (starts(pos_, "}}")) {
            emit(TokType::variable_end, "", line_);
            advance(pos_ + 2);
            return;
          }
        } else {
          if (starts(pos_, "+%}")) {
            emit(TokType::block_end, "", line_);
            advance(pos_ + 3);
            return;
          }
          if (starts(pos_, "-%}")) {
            emit(TokType::block_end, "", line_);
            advance(skip_spaces(pos_ + 3));
            return;
          }
          if (starts(pos_, "%}")) {
            emit(TokType::block_end, "", line_);
            size_t e = pos_ + 2;
            if (e < src_.size() && src_[e] == '\n') ++e;
            advance(e);
            return;
          }
        }
      }
      if (size_t n = space_len(pos_)) {
        advance(skip_spaces(pos_ + n));
        continue;
      }
      if (number()) continue;
      if (name()) continue;
      if (string_literal()) continue;
      if (op(balance)) continue;
      std::string ch;
      size_t q = pos_;
      py::append_cp(ch, unicode::decode_utf8(src_, q));
      lex_fail(line_, "unexpected char " + py::repr_string(ch) + " at " + std::to_string(pos_));
    }
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  // (\d+_)*\d+ at p; returns the end or p when there is none.
  size_t digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return p;
    size_t q = p;
    while (true) {
      while (q < src_.size() && is_digit(src_[q])) ++q;
      if (q + 1 < src_.size() && src_[q] == '_' && is_digit(src_[q + 1])) {
        ++q;
        continue;
      }
      return q;
    }
  }

  bool number() {
    size_t p = pos_;
    if (!is_digit(src_[p])) return false;
    // float_re (never right after a '.').
    if (p == 0 || src_[p - 1] != '.') {
      size_t d = digits(p);
      size_t end = 0;
      // ((\.D)?e[+-]?D)
      size_t q = d;
      size_t with_frac = q;
      if (q < src_.size() && src_[q] == '.' && digits(q + 1) > q + 1) with_frac = digits(q + 1);
      for (size_t cand : {with_frac, d}) {
        if (cand < src_.size() && (src_[cand] == 'e' || src_[cand] == 'E')) {
          size_t r = cand + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          size_t de = digits(r);
          if (de > r) {
            end = de;
            break;
          }
        }
      }
      if (!end && with_frac > d) end = with_frac;  // \.D
      if (end) {
        std::string text;
        for (size_t i = p; i < end; ++i) {
          if (src_[i] != '_') text.push_back(src_[i]);
        }
        Token tok;
        tok.type = TokType::floating;
        tok.line = line_;
        tok.float_value = std::strtod(text.c_str(), nullptr);
        tok.text = std::move(text);
        toks_.push_back(std::move(tok));
        advance(end);
        return true;
      }
    }
    // integer_re
    int base = 10;
    size_t q = p;
    size_t end = p;
    auto is_base_digit = [&](char c) {
      if (base == 2) return c == '0' || c == '1';
      if (base == 8) return c >= '0' && c <= '7';
      return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    };
    if (src_[q] == '0' && q + 1 < src_.size() &&
        (src_[q + 1] == 'b' || src_[q + 1] == 'B' || src_[q + 1] == 'o' || src_[q + 1] == 'O' ||
         src_[q + 1] == 'x' || src_[q + 1] == 'X')) {
      char b = static_cast<char>(src_[q + 1] | 0x20);
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      size_t r = q + 2;
      size_t last = 0;
      while (true) {
        size_t s = r;
        if (s < src_.size() && src_[s] == '_') ++s;
        if (s < src_.size() && is_base_digit(src_[s])) {
          r = s + 1;
          last = r;
        } else {
          break;
        }
      }
      if (last) end = last;
    }
    if (end == p) {
      base = 10;
      if (src_[q] == '0') {
        // 0(_?0)*
        size_t r = q + 1;
        while (true) {
          size_t s = r;
          if (s < src_.size() && src_[s] == '_') ++s;
          if (s < src_.size() && src_[s] == '0') {
            r = s + 1;
          } else {
            break;
          }
        }
        end = r;
      } else {
        // [1-9](_?\d)*
        size_t r = q + 1;
        while (true) {
          size_t s = r;
          if (s < src_.size() && src_[s] == '_') ++s;
          if (s < src_.size() && is_digit(src_[s])) {
            r = s + 1;
          } else {
            break;
          }
        }
        end = r;
      }
    }
    std::string text;
    for (size_t i = p + (base == 10 ? 0 : 2); i < end; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    errno = 0;
    char* e = nullptr;
    unsigned long long v = std::strtoull(text.c_str(), &e, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
      lex_fail(line_, "integer literal too large: " + text);
    }
    Token tok;
    tok.type = TokType::integer;
    tok.line = line_;
    tok.int_value = static_cast<int64_t>(v);
    tok.text = std::move(text);
    toks_.push_back(std::move(tok));
    advance(end);
    return true;
  }

  bool name_char(size_t p, bool first, size_t& len) const {
    unsigned char c = static_cast<unsigned char>(src_[p]);
    if (c < 0x80) {
      len = 1;
      return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
    }
    size_t q = p;
    uint32_t cp = unicode::decode_utf8(src_, q);
    len = q - p;
    unicode::Category cat = unicode::category(cp);
    if (cat == unicode::Category::L) return true;
    return !first && (cat == unicode::Category::N || cat == unicode::Category::M);
  }

  bool name() {
    size_t len = 0;
    if (!name_char(pos_, true, len)) return false;
    size_t q = pos_ + len;
    while (q < src_.size() && name_char(q, false, len)) q += len;
    emit(TokType::name, src_.substr(pos_, q - pos_), line_);
    advance(q);
    return true;
  }

  bool string_literal() {
    char quote = src_[pos_];
    if (quote != '\'' && quote != '"') return false;
    size_t q = pos_ + 1;
    while (q < src_.size() && src_[q] != quote) {
      if (src_[q] == '\\') {
        if (q + 1 >= src_.size()) return false;
        // Skip the backslash and the whole (possibly multi-byte) next char.
        q += 1;
        size_t r = q;
        unicode::decode_utf8(src_, r);
        q = r;
      } else {
        ++q;
      }
    }
    if (q >= src_.size()) return false;  // unterminated: "unexpected char"
    int line = line_;
    std::string value = unescape(std::string_view(src_).substr(pos_ + 1, q - pos_ - 1), line);
    emit(TokType::string, std::move(value), line);
    advance(q + 1);
    return true;
  }

  static int hexval(uint32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  }

  // Python's .encode("ascii", "backslashreplace").decode("unicode-escape").
  static std::string unescape(std::string_view raw, int line) {
    std::vector<uint32_t> cps = py::to_cps(raw);
    std::string out;
    out.reserve(raw.size());
    size_t n = cps.size();
    for (size_t i = 0; i < n; ++i) {
      uint32_t c = cps[i];
      if (c != '\\') {
        py::append_cp(out, c);
        continue;
      }
      ++i;  // the lexer guarantees a character after a backslash
      uint32_t e = cps[i];
      if (e >= 0x80) {
        // backslashreplace turned the character into an escape whose
        // backslash now pairs with ours: a literal backslash, then the
        // escape's text.
        char buf[16];
        if (e <= 0xFF) {
          std::snprintf(buf, sizeof buf, "\\x%02x", e);
        } else if (e <= 0xFFFF) {
          std::snprintf(buf, sizeof buf, "\\u%04x", e);
        } else {
          std::snprintf(buf, sizeof buf, "\\U%08x", e);
        }
        out += buf;
        continue;
      }
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          size_t want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (size_t k = 0; k < want; ++k) {
            if (i + 1 + k >= n || hexval(cps[i + 1 + k]) < 0) {
              const char* what = e == 'x' ? "truncated \\xXX escape" : e == 'u' ? "truncated \\uXXXX escape"
                                                                                 : "truncated \\UXXXXXXXX escape";
              lex_fail(line, what);
            }
            v = v * 16 + static_cast<uint32_t>(hexval(cps[i + 1 + k]));
          }
          if (v > 0x10FFFF) lex_fail(line, "illegal Unicode character");
          i += want;
          py::append_cp(out, v);
          break;
        }
        case 'N': lex_fail(line, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && i + 1 < n && cps[i + 1] >= '0' && cps[i + 1] <= '7'; ++k) {
              v = v * 8 + (cps[++i] - '0');
            }
            py::append_cp(out, v);
          } else {
            out.push_back('\\');
            py::append_cp(out, e);
          }
      }
    }
    return out;
  }

  bool op(std::string& balance) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* o : kTwo) {
      if (starts(pos_, o)) {
        emit(TokType::op, o, line_);
        advance(pos_ + 2);
        return true;
      }
    }
    char c = src_[pos_];
    static const std::string_view kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == std::string_view::npos) return false;
    if (c == '{') balance.push_back('}');
    if (c == '(') balance.push_back(')');
    if (c == '[') balance.push_back(']');
    if (c == '}' || c == ')' || c == ']') {
      if (balance.empty()) lex_fail(line_, std::string("unexpected '") + c + "'");
      char want = balance.back();
      balance.pop_back();
      if (want != c) lex_fail(line_, std::string("unexpected '") + c + "', expected '" + want + "'");
    }
    emit(TokType::op, std::string(1, c), line_);
    advance(pos_ + 1);
    return true;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace serval::chat_template
