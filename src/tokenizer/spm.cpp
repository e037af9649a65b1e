#include "tokenizer/spm.h"
#include "tokenizer/symbol_merge.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace serval {

namespace {

using Symbol = tokenizer_detail::MergeSymbol;
using Candidate = tokenizer_detail::MergeCandidate<float>;

struct WorseCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;  // higher score first
    return a.left > b.left;                             // then leftmost
  }
};

void push_byte_fallback(const Vocab& vocab, unsigned char byte, std::vector<TokenId>& out) {
  char name[8];
  std::snprintf(name, sizeof name, "<0x%02X>", byte);
  TokenId id = vocab.find(name);
  if (id == kNoToken) id = vocab.find(std::string_view(reinterpret_cast<const char*>(&byte), 1));
  if (id == kNoToken) id = vocab.unk;
  if (id != kNoToken) out.push_back(id);
}

}  // namespace

std::string spm_escape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (const char ch : text) {
    if (ch == ' ') out += "\xE2\x96\x81";
    else out += ch;
  }
  return out;
}

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<TokenId>& out) {
  std::vector<Symbol> symbols = tokenizer_detail::utf8_symbols(text);
  if (symbols.empty()) return;

  tokenizer_detail::merge_symbols<float>(
      symbols,
      [&](int32_t left, int32_t right, float* score) {
        const Symbol& l = symbols[(size_t)left];
        const Symbol& r = symbols[(size_t)right];
        const TokenId id = vocab.find(text.substr(l.start, l.len + r.len));
        if (id == kNoToken) return false;
        *score = vocab.tokens[static_cast<size_t>(id)].score;
        return true;
      },
      WorseCandidate{});

  // Symbol 0 is never merged away, so the chain starts there.
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string_view piece = text.substr(s.start, s.len);
    const TokenId id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (const char ch : piece) push_byte_fallback(vocab, static_cast<unsigned char>(ch), out);
  }
}

}  // namespace serval
