#include "tokenizer/chat_template/py_string.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "tokenizer/unicode.h"

namespace serval::chat_template::py {

std::vector<uint32_t> to_cps(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      out.push_back(c);
      ++pos;
    } else {
      out.push_back(unicode::decode_utf8(s, pos));
    }
  }
  return out;
}

void append_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    unicode::append_utf8(out, cp);
  }
}

std::string from_cps(const uint32_t* cps, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) append_cp(out, cps[i]);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (char c : s) {
    // Count every byte that is not a UTF-8 continuation byte.
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

bool is_space(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_printable(uint32_t cp) {
  if (cp == 0x20) return true;
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  unicode::Category c = unicode::category(cp);
  return c != unicode::Category::C && c != unicode::Category::Z;
}

bool is_alpha(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return unicode::category(cp) == unicode::Category::L;
}

bool is_digit(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return unicode::category(cp) == unicode::Category::N;
}

bool is_alnum(uint32_t cp) { return is_alpha(cp) || is_digit(cp); }

bool is_linebreak(uint32_t cp) {
  switch (cp) {
    case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x85: case 0x2028: case 0x2029:
      return true;
    default:
      return false;
  }
}

uint32_t to_lower(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  return unicode::to_lower(cp);
}

namespace {

// Uppercase as the inverse of the simple lowercase mapping (the first
// code point that lowercases to cp), plus the letters whose uppercase is not
// such an inverse. Built once, on first use.
const std::unordered_map<uint32_t, uint32_t>& upper_table() {
  static const std::unordered_map<uint32_t, uint32_t> table = [] {
    std::unordered_map<uint32_t, uint32_t> t;
    for (uint32_t cp = 0x80; cp < 0x20000; ++cp) {
      uint32_t lo = unicode::to_lower(cp);
      if (lo != cp && lo >= 0x80) t.emplace(lo, cp);  // first (lowest) upper wins
    }
    t[0x00B5] = 0x039C;  // MICRO SIGN -> GREEK CAPITAL MU
    t[0x0131] = 0x0049;  // dotless i -> I
    t[0x017F] = 0x0053;  // long s -> S
    t[0x03C2] = 0x03A3;  // final sigma -> SIGMA
    t[0x00FF] = 0x0178;  // y with diaeresis
    t.erase(0x00DF);     // sharp s has no simple uppercase (full: "SS")
    return t;
  }();
  return table;
}

}  // namespace

uint32_t to_upper(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  const auto& t = upper_table();
  auto it = t.find(cp);
  return it == t.end() ? cp : it->second;
}

bool is_cased(uint32_t cp) { return to_lower(cp) != cp || to_upper(cp) != cp; }
bool is_lower_cp(uint32_t cp) { return to_upper(cp) != cp; }
bool is_upper_cp(uint32_t cp) { return to_lower(cp) != cp; }

namespace {

// Full case mappings (SpecialCasing.txt) of the common letters whose
// uppercase/titlecase/lowercase is not a single code point.
bool append_full_upper(std::string& out, uint32_t cp, bool title) {
  switch (cp) {
    case 0x00DF: out += title ? "Ss" : "SS"; return true;
    case 0xFB00: out += title ? "Ff" : "FF"; return true;
    case 0xFB01: out += title ? "Fi" : "FI"; return true;
    case 0xFB02: out += title ? "Fl" : "FL"; return true;
    case 0xFB03: out += title ? "Ffi" : "FFI"; return true;
    case 0xFB04: out += title ? "Ffl" : "FFL"; return true;
    case 0xFB05:
    case 0xFB06: out += title ? "St" : "ST"; return true;
    case 0x0149: out += title ? "\xCA\xBCN" : "\xCA\xBCN"; return true;
    default: return false;
  }
}

void append_lower_full(std::string& out, uint32_t cp) {
  if (cp == 0x0130) {
    out += "i\xCC\x87";  // LATIN CAPITAL I WITH DOT ABOVE lowercases to two code points
    return;
  }
  append_cp(out, to_lower(cp));
}

void append_upper_full(std::string& out, uint32_t cp, bool title = false) {
  if (!append_full_upper(out, cp, title)) append_cp(out, to_upper(cp));
}

}  // namespace

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out.push_back(static_cast<char>(to_lower(static_cast<unsigned char>(c))));
    return out;
  }
  for (uint32_t cp : to_cps(s)) append_lower_full(out, cp);
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out.push_back(static_cast<char>(to_upper(static_cast<unsigned char>(c))));
    return out;
  }
  for (uint32_t cp : to_cps(s)) append_upper_full(out, cp);
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (uint32_t cp : to_cps(s)) {
    if (prev_cased) {
      append_lower_full(out, cp);
    } else {
      append_upper_full(out, cp, true);
    }
    prev_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool first = true;
  for (uint32_t cp : to_cps(s)) {
    if (first) {
      append_upper_full(out, cp, true);
    } else {
      append_lower_full(out, cp);
    }
    first = false;
  }
  return out;
}

bool islower(std::string_view s) {
  bool cased = false;
  for (uint32_t cp : to_cps(s)) {
    if (is_upper_cp(cp)) return false;
    if (is_lower_cp(cp)) cased = true;
  }
  return cased;
}

bool isupper(std::string_view s) {
  bool cased = false;
  for (uint32_t cp : to_cps(s)) {
    if (is_lower_cp(cp)) return false;
    if (is_upper_cp(cp)) cased = true;
  }
  return cased;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  std::vector<uint32_t> cps = to_cps(s);
  std::vector<uint32_t> set;
  if (chars) set = to_cps(*chars);
  auto strippable = [&](uint32_t cp) {
    if (!chars) return is_space(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (side != StripSide::right) {
    while (b < e && strippable(cps[b])) ++b;
  }
  if (side != StripSide::left) {
    while (e > b && strippable(cps[e - 1])) --e;
  }
  return from_cps(cps.data() + b, e - b);
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep) {
    std::vector<uint32_t> cps = to_cps(s);
    size_t i = 0, n = cps.size();
    while (i < n) {
      while (i < n && is_space(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(from_cps(cps.data() + i, n - i));  // the remainder, as is
        return out;
      }
      size_t j = i;
      while (j < n && !is_space(cps[j])) ++j;
      out.push_back(from_cps(cps.data() + i, j - i));
      i = j;
    }
    return out;
  }
  size_t pos = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
    size_t f = s.find(*sep, pos);
    if (f == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, f - pos));
    pos = f + sep->size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, -1);
  std::vector<std::string> out;
  if (!sep) {
    std::vector<uint32_t> cps = to_cps(s);
    int64_t i = static_cast<int64_t>(cps.size());
    while (i > 0) {
      while (i > 0 && is_space(cps[i - 1])) --i;
      if (i <= 0) break;
      if (static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(from_cps(cps.data(), static_cast<size_t>(i)));  // the remainder, as is
        break;
      }
      int64_t j = i;
      while (j > 0 && !is_space(cps[j - 1])) --j;
      out.push_back(from_cps(cps.data() + j, i - j));
      i = j;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t f = s.rfind(*sep, end - sep->size());
    if (f == std::string_view::npos) break;
    out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
    end = f;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::vector<uint32_t> cps = to_cps(s);
  size_t i = 0, start = 0, n = cps.size();
  while (i < n) {
    if (is_linebreak(cps[i])) {
      size_t eol = i + 1;
      if (cps[i] == '\r' && i + 1 < n && cps[i + 1] == '\n') eol = i + 2;
      out.push_back(from_cps(cps.data() + start, (keepends ? eol : i) - start));
      i = start = eol;
    } else {
      ++i;
    }
  }
  if (start < n) out.push_back(from_cps(cps.data() + start, n - start));
  return out;
}

std::string replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count) {
  std::string out;
  if (old_s.empty()) {
    // Python inserts `new` before every code point and at the end.
    std::vector<uint32_t> cps = to_cps(s);
    int64_t done = 0;
    for (uint32_t cp : cps) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      append_cp(out, cp);
    }
    if (count < 0 || done < count) out += new_s;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(old_s, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(new_s);
    pos = f + old_s.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  size_t f = reverse ? s.rfind(sub) : s.find(sub);
  if (f == std::string_view::npos) return -1;
  return static_cast<int64_t>(cp_count(s.substr(0, f)));
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(cp_count(s)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while (true) {
    size_t f = s.find(sub, pos);
    if (f == std::string_view::npos) break;
    ++n;
    pos = f + sub.size();
  }
  return n;
}

SliceRange slice_range(int64_t n, std::optional<int64_t> start_o, std::optional<int64_t> stop_o, int64_t step) {
  SliceRange r;
  r.step = step;
  int64_t start, stop;
  if (!start_o) {
    start = step < 0 ? n - 1 : 0;
  } else {
    start = *start_o;
    if (start < 0) {
      start += n;
      if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= n) {
      start = step < 0 ? n - 1 : n;
    }
  }
  if (!stop_o) {
    stop = step < 0 ? -1 : n;
  } else {
    stop = *stop_o;
    if (stop < 0) {
      stop += n;
      if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= n) {
      stop = step < 0 ? n - 1 : n;
    }
  }
  r.start = start;
  if (step < 0) {
    r.count = stop < start ? (start - stop - 1) / (-step) + 1 : 0;
  } else {
    r.count = start < stop ? (stop - start - 1) / step + 1 : 0;
  }
  return r;
}

std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) {
  if (is_ascii(s)) {
    SliceRange r = slice_range(static_cast<int64_t>(s.size()), start, stop, step);
    std::string out;
    out.reserve(static_cast<size_t>(r.count));
    for (int64_t k = 0, i = r.start; k < r.count; ++k, i += r.step) out.push_back(s[static_cast<size_t>(i)]);
    return out;
  }
  std::vector<uint32_t> cps = to_cps(s);
  SliceRange r = slice_range(static_cast<int64_t>(cps.size()), start, stop, step);
  std::string out;
  for (int64_t k = 0, i = r.start; k < r.count; ++k, i += r.step) append_cp(out, cps[static_cast<size_t>(i)]);
  return out;
}

std::optional<std::string> index(std::string_view s, int64_t i) {
  if (is_ascii(s)) {
    int64_t n = static_cast<int64_t>(s.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return std::nullopt;
    return std::string(1, s[static_cast<size_t>(i)]);
  }
  std::vector<uint32_t> cps = to_cps(s);
  int64_t n = static_cast<int64_t>(cps.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  std::string out;
  append_cp(out, cps[static_cast<size_t>(i)]);
  return out;
}

std::string center(std::string_view s, int64_t width) {
  int64_t n = static_cast<int64_t>(cp_count(s));
  if (width <= n) return std::string(s);
  int64_t marg = width - n;
  // CPython: left = marg / 2 + (marg & width & 1)
  int64_t left = marg / 2 + (marg & width & 1);
  int64_t right = marg - left;
  std::string out(static_cast<size_t>(left), ' ');
  out.append(s);
  out.append(static_cast<size_t>(right), ' ');
  return out;
}

std::string repr_string(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(quote);
  char buf[16];
  for (uint32_t cp : to_cps(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else if (cp < 0x7F) {
      out.push_back(static_cast<char>(cp));
    } else if (is_printable(cp)) {
      append_cp(out, cp);
    } else if (cp <= 0xFF) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else if (cp <= 0xFFFF) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  bool neg = false;
  if (!sci.empty() && sci[0] == '-') {
    neg = true;
    sci.remove_prefix(1);
  }
  size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) {
    if (c != '.') digits.push_back(c);
  }
  int exp10 = 0;
  std::from_chars(sci.data() + epos + 1 + (sci[epos + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp10);
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  int nd = static_cast<int>(digits.size());
  std::string out = neg ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    int e = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    out += eb;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace serval::chat_template::py
