#include "tokenizer/wpm.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace serval {

namespace {

// CJK ideograph blocks as BERT's BasicTokenizer defines them (including its
// 0x2B920 lower bound of the Extension E range, kept for compatibility).
bool is_chinese_char(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

}  // namespace

std::vector<std::string> wpm_preprocess(std::string_view text) {
  std::vector<std::string> words(1);
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t cp = unicode::nfd_base(unicode::decode_utf8(text, pos));
    if (unicode::is_whitespace(cp)) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    const unicode::Category cat = unicode::category(cp);
    if (cp == 0 || cp == unicode::kReplacementChar || cat == unicode::Category::C) continue;
    const uint32_t lower = unicode::to_lower(cp);
    if (cat == unicode::Category::P || (cp < 0x7F && cat == unicode::Category::S) || is_chinese_char(cp)) {
      if (!words.back().empty()) words.emplace_back();
      unicode::append_utf8(words.back(), lower);
      words.emplace_back();
    } else {
      unicode::append_utf8(words.back(), lower);
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

void wpm_encode(const Vocab& vocab, std::string_view text, std::vector<TokenId>& out) {
  for (const std::string& w : wpm_preprocess(text)) {
    const std::string word = "\xE2\x96\x81" + w;  // "▁": marks the start of a word
    const std::string_view sv = word;
    const size_t n = sv.size();
    const size_t first = out.size();
    for (size_t i = 0; i < n;) {
      size_t matched = 0;
      for (size_t j = std::min(n, i + vocab.max_token_len); j > i; --j) {
        const TokenId id = vocab.find(sv.substr(i, j - i));
        if (id != kNoToken) {
          out.push_back(id);
          matched = j - i;
          break;
        }
      }
      if (matched == 0) {  // the whole word becomes <unk>
        out.resize(first);
        break;
      }
      i += matched;
    }
    if (out.size() == first && vocab.unk != kNoToken) out.push_back(vocab.unk);
  }
}

}  // namespace serval
