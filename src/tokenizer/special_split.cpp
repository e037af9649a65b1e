#include "tokenizer/special_split.h"

#include <algorithm>

namespace serval {

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

SpecialSplitter::SpecialSplitter(const Vocab& vocab) {
  trie_.emplace_back();
  for (size_t i = 0; i < vocab.special_by_length.size(); ++i) {
    const std::string& text = vocab.tokens[static_cast<size_t>(vocab.special_by_length[i])].text;
    uint32_t node = 0;
    for (const char ch : text) {
      const auto b = static_cast<uint8_t>(ch);
      auto& kids = trie_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), b,
                                 [](const std::pair<uint8_t, uint32_t>& p, uint8_t v) { return p.first < v; });
      if (it != kids.end() && it->first == b) {
        node = it->second;
      } else {
        const auto child = static_cast<uint32_t>(trie_.size());
        kids.insert(it, {b, child});  // `kids` is not used after trie_ grows
        trie_.emplace_back();
        node = child;
      }
    }
    trie_[node].special = static_cast<int32_t>(i);  // texts are unique
  }
}

std::vector<Fragment> SpecialSplitter::split(const Vocab& vocab, std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({kNoToken, 0, text.size()});
  const std::vector<TokenId>& specials = vocab.special_by_length;
  if (specials.empty()) return frags;

  // Which special tokens occur anywhere in the text.
  std::vector<bool> occurs(specials.size(), false);
  size_t n_occurring = 0;
  for (size_t i = 0; i < text.size() && n_occurring < specials.size(); ++i) {
    uint32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto b = static_cast<uint8_t>(text[j]);
      const auto& kids = trie_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), b,
                                 [](const std::pair<uint8_t, uint32_t>& p, uint8_t v) { return p.first < v; });
      if (it == kids.end() || it->first != b) break;
      node = it->second;
      const int32_t s = trie_[node].special;
      if (s >= 0 && !occurs[static_cast<size_t>(s)]) {
        occurs[static_cast<size_t>(s)] = true;
        ++n_occurring;
      }
    }
  }
  if (n_occurring == 0) return frags;

  std::vector<Fragment> next;
  for (size_t si = 0; si < specials.size(); ++si) {
    if (!occurs[si]) continue;
    const TokenId id = specials[si];
    const TokenData& tok = vocab.tokens[static_cast<size_t>(id)];
    if (!parse_special && (tok.attr & (token_attr::control | token_attr::unknown))) continue;
    const std::string_view needle = tok.text;

    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t off = f.offset;
      size_t len = f.length;
      while (len > 0) {
        const size_t hit = text.substr(off, len).find(needle);
        if (hit == std::string_view::npos) {
          next.push_back({kNoToken, off, len});
          break;
        }
        size_t left = hit;
        if (tok.attr & token_attr::lstrip) {
          while (left > 0 && is_ascii_space(text[off + left - 1])) --left;
        }
        if (left > 0) next.push_back({kNoToken, off, left});
        next.push_back({id, off + hit, needle.size()});
        size_t right_off = off + hit + needle.size();
        size_t right_len = off + len - right_off;
        if (tok.attr & token_attr::rstrip) {
          while (right_len > 0 && is_ascii_space(text[right_off])) {
            ++right_off;
            --right_len;
          }
        }
        off = right_off;
        len = right_len;
      }
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace serval
