#include "tokenizer/spm.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace serval {

namespace {

struct Symbol {
  size_t start = 0;
  size_t len = 0;    // 0 once merged into its left neighbour
  int32_t prev = -1;
  int32_t next = -1;
};

// A candidate merge of symbols[left] and symbols[right]. The lengths record
// the state it was made for: when either symbol has changed since, it is stale.
struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  size_t left_len;
  size_t right_len;
};

struct WorseCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;  // higher score first
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
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(unicode::utf8_len_from_lead(static_cast<uint8_t>(text[pos])), text.size() - pos);
    Symbol s;
    s.start = pos;
    s.len = n;
    s.prev = static_cast<int32_t>(symbols.size()) - 1;
    pos += n;
    s.next = pos == text.size() ? -1 : static_cast<int32_t>(symbols.size()) + 1;
    symbols.push_back(s);
  }
  if (symbols.empty()) return;

  std::priority_queue<Candidate, std::vector<Candidate>, WorseCandidate> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const TokenId id = vocab.find(text.substr(l.start, l.len + r.len));
    if (id == kNoToken) return;
    queue.push({vocab.tokens[static_cast<size_t>(id)].score, left, right, l.len, r.len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[c.left];
    Symbol& r = symbols[c.right];
    if (l.len != c.left_len || r.len != c.right_len || l.next != c.right || r.len == 0) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    try_add(l.prev, c.left);
    try_add(c.left, l.next);
  }

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
