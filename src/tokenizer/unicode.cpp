#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

#include "tokenizer/unicode_tables.h"

namespace serval::unicode {

namespace tbl = serval::unicode_tables;

size_t utf8_len_from_lead(uint8_t lead) {
  // High nibble 0x0-0xB: ASCII or a stray continuation byte; 0xC-0xD: two
  // bytes; 0xE: three; 0xF: four.
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

uint32_t decode_utf8(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  size_t n = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  } else {  // continuation byte or 0xF8..0xFF
    pos += 1;
    return kReplacementChar;
  }
  if (pos + n > s.size()) {
    pos += 1;
    return kReplacementChar;
  }
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if ((b & 0xC0) != 0x80) {
      pos += 1;
      return kReplacementChar;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  pos += n;
  return cp;
}

std::vector<uint32_t> utf8_to_codepoints(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out.push_back(decode_utf8(s, pos));
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp > kMaxCodepoint) cp = kReplacementChar;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string codepoint_to_utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

namespace {

// Strict UTF-8: for lead byte b0, the allowed range of the second byte (the
// later continuation bytes are always 0x80..0xBF). Returns the sequence length,
// 0 when b0 can never start a sequence.
size_t strict_seq_len(uint8_t b0, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
    return 4;
  }
  return 0;
}

// Number of bytes at s[pos] that form a valid prefix of a strict sequence
// (the whole sequence when complete), and whether the sequence is complete.
size_t strict_prefix(std::string_view s, size_t pos, bool& complete) {
  uint8_t lo = 0, hi = 0;
  const size_t n = strict_seq_len(static_cast<uint8_t>(s[pos]), lo, hi);
  complete = false;
  if (n == 0) return 0;
  size_t i = 1;
  for (; i < n && pos + i < s.size(); ++i) {
    const auto b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t l = (i == 1) ? lo : 0x80;
    const uint8_t h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) return i;  // ill-formed after i bytes
  }
  complete = (i == n);
  return i;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last 3 bytes can belong to an unfinished sequence.
  const size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t pos = start; pos < s.size(); ++pos) {
    const auto b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation: part of something earlier
    bool complete = false;
    const size_t n = strict_prefix(s, pos, complete);
    if (!complete && n > 0 && pos + n == s.size()) return pos;  // may still complete
  }
  return s.size();
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    bool complete = false;
    const size_t n = strict_prefix(s, pos, complete);
    if (complete) {
      out.append(s.substr(pos, n));
      pos += n;
    } else {
      append_utf8(out, kReplacementChar);
      pos += std::max<size_t>(n, 1);  // one U+FFFD per maximal ill-formed subpart
    }
  }
  return out;
}

namespace {

std::array<Category, 128> make_ascii_categories() {
  std::array<Category, 128> a{};
  for (uint32_t cp = 0; cp < 128; ++cp) {
    const auto* end = tbl::kCategoryRanges + tbl::kCategoryRangesSize;
    const auto* it = std::upper_bound(tbl::kCategoryRanges, end, cp,
                                      [](uint32_t v, const tbl::CategoryRange& r) { return v < r.first; });
    a[cp] = (it - 1)->category;
  }
  return a;
}

}  // namespace

Category category(uint32_t cp) {
  static const std::array<Category, 128> ascii = make_ascii_categories();
  if (cp < 128) return ascii[cp];
  if (cp > kMaxCodepoint) return Category::C;
  const auto* end = tbl::kCategoryRanges + tbl::kCategoryRangesSize;
  const auto* it = std::upper_bound(tbl::kCategoryRanges, end, cp,
                                    [](uint32_t v, const tbl::CategoryRange& r) { return v < r.first; });
  return (it - 1)->category;  // kCategoryRanges[0].first == 0
}

bool is_whitespace(uint32_t cp) {
  // The White_Space property (PropList.txt); stable since Unicode 6.3.
  switch (cp) {
    case 0x0009: case 0x000A: case 0x000B: case 0x000C: case 0x000D:
    case 0x0020: case 0x0085: case 0x00A0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint32_t to_lower(uint32_t cp) {
  if (cp < 128) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  const auto* end = tbl::kLowercase + tbl::kLowercaseSize;
  const auto* it = std::lower_bound(tbl::kLowercase, end, cp,
                                    [](const tbl::CodepointPair& p, uint32_t v) { return p.from < v; });
  return (it != end && it->from == cp) ? it->to : cp;
}

uint32_t nfd_base(uint32_t cp) {
  if (cp < 0xC0) return cp;
  const auto* end = tbl::kNfdRanges + tbl::kNfdRangesSize;
  const auto* it = std::upper_bound(tbl::kNfdRanges, end, cp,
                                    [](uint32_t v, const tbl::NfdRange& r) { return v < r.first; });
  if (it == tbl::kNfdRanges) return cp;
  --it;
  return (cp <= it->last) ? it->base : cp;
}

namespace {

struct ByteMap {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, 512> cp_to_byte;  // the mapped code points are all < 0x144
};

ByteMap make_byte_map() {
  ByteMap m;
  m.cp_to_byte.fill(-1);
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(next++);
    m.byte_to_char[b] = codepoint_to_utf8(cp);
    m.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return m;
}

const ByteMap& byte_map() {
  static const ByteMap m = make_byte_map();
  return m;
}

}  // namespace

const std::string& byte_to_bpe_char(uint8_t byte) { return byte_map().byte_to_char[byte]; }

int bpe_char_to_byte(uint32_t cp) {
  if (cp >= byte_map().cp_to_byte.size()) return -1;
  return byte_map().cp_to_byte[cp];
}

const char* tables_version() { return tbl::kUnicodeVersion; }

}  // namespace serval::unicode
