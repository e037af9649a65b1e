#include "sampler/grammar/grammar_internal.h"

namespace serval {

bool next_code_point(std::string_view s, size_t& pos, uint32_t& cp) {
  if (pos >= s.size()) return false;
  const unsigned char c = (unsigned char)s[pos];
  const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n < 0) return false;
  cp = n == 0 ? c : n == 1 ? (c & 0x1Fu) : n == 2 ? (c & 0x0Fu) : (c & 0x07u);
  size_t p = pos + 1;
  for (int i = 0; i < n; ++i, ++p) {
    if (p >= s.size() || ((unsigned char)s[p] & 0xC0) != 0x80) return false;
    cp = (cp << 6) | ((unsigned char)s[p] & 0x3Fu);
  }
  pos = p;
  return true;
}

bool read_hex(std::string_view s, size_t& pos, int digits, uint32_t& cp) {
  cp = 0;
  for (int i = 0; i < digits; ++i) {
    const char c = pos < s.size() ? s[pos] : '\0';
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0) return false;
    cp = cp * 16 + (uint32_t)v;
    ++pos;
  }
  return true;
}

}  // namespace serval
