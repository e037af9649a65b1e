#include "tokenizer/detokenizer.h"

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace serval {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // "▁"

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos, kSpaceMark.size()) == kSpaceMark) {
      out += ' ';
      pos += kSpaceMark.size();
    } else {
      out += text[pos++];
    }
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Byte-level BPE text -> bytes. A character outside the 256-entry mapping
// (malformed vocab) is kept as its own UTF-8.
std::string bpe_chars_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t cp = unicode::decode_utf8(text, pos);
    const int b = unicode::bpe_char_to_byte(cp);
    if (b >= 0) out += static_cast<char>(b);
    else unicode::append_utf8(out, cp);
  }
  return out;
}

}  // namespace

int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const int hi = hex_digit(t[3]);
  const int lo = hex_digit(t[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

std::string render_piece(const Vocab& vocab, TokenId id) {
  const TokenData& t = vocab.tokens[static_cast<size_t>(id)];
  constexpr uint32_t kAsText = token_attr::control | token_attr::unknown | token_attr::user_defined;
  if (t.attr & kAsText) return t.text;
  switch (vocab.type) {
    case VocabType::spm:
    case VocabType::wpm:
      if (t.attr & token_attr::normal) return unescape_spaces(t.text);
      if (t.attr & token_attr::byte) {
        const int b = parse_byte_token(t.text);
        return b >= 0 ? std::string(1, static_cast<char>(b)) : t.text;
      }
      return {};
    case VocabType::bpe:
      if (t.attr & token_attr::normal) return bpe_chars_to_bytes(t.text);
      return {};
  }
  return {};
}

void clean_up_spaces(std::string& text) {
  if (text.size() < 2) return;
  // 1. " ?" " !" " ." " ," -> drop the space.
  std::string a;
  a.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char x = text[i];
    if (i > 0 && text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a += x;
  }
  // 2. " ' " -> "'".
  std::string b;
  b.reserve(a.size());
  b += a[0];
  char prev = a[0];  // the character before a[i], '\0' once removed
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && prev == ' ' && a[i + 1] == ' ') {
      b.pop_back();  // the space before
      b += x;
      ++i;           // and the space after
      prev = '\0';
      continue;
    }
    b += x;
    prev = x;
  }
  // 3. " 's" " 'm" " 're" " 've" -> drop the space (but not before 't 'd 'll).
  std::string c;
  c.reserve(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const char x = b[i];
    if (i > 0 && b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
      if (x1 == 's' || x1 == 'm' || (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) c.pop_back();
    }
    c += x;
  }
  text = std::move(c);
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool render_special)
    : tok_(&tok), render_special_(render_special) {}

std::string StreamingDetokenizer::push(TokenId id) {
  std::string piece = tok_->token_to_piece(id, render_special_);
  if (first_) {
    first_ = false;
    const Vocab& v = tok_->vocab();
    // Same rule as decode(): after a leading BOS the space prefix is removed.
    strip_space_ = v.add_space_prefix && !render_special_ && v.bos != kNoToken && id == v.bos;
  } else if (strip_space_ && !piece.empty()) {
    if (piece[0] == ' ') piece.erase(0, 1);
    strip_space_ = false;
  }
  pending_ += piece;
  const size_t n = unicode::utf8_complete_prefix(pending_);
  std::string out = unicode::sanitize_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out = unicode::sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace serval
