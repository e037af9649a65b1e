// Greedy pairwise merging over a linked list of symbols (byte ranges of one
// text), shared by SPM (highest score first) and BPE (lowest rank first).
// Internal to the tokenizer layer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace serval::tokenizer_detail {

struct MergeSymbol {
  size_t start = 0;
  size_t len = 0;  // 0 once merged into its left neighbour
  int32_t prev = -1;
  int32_t next = -1;
};

// One symbol per UTF-8 character of `text` (a truncated tail is one symbol),
// linked in order.
inline std::vector<MergeSymbol> utf8_symbols(std::string_view text) {
  std::vector<MergeSymbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(unicode::utf8_len_from_lead(static_cast<uint8_t>(text[pos])), text.size() - pos);
    MergeSymbol s;
    s.start = pos;
    s.len = n;
    s.prev = static_cast<int32_t>(symbols.size()) - 1;
    pos += n;
    s.next = pos == text.size() ? -1 : static_cast<int32_t>(symbols.size()) + 1;
    symbols.push_back(s);
  }
  return symbols;
}

// A candidate merge of symbols[left] and symbols[right]. The lengths record
// the state it was made for: when either symbol has changed since, it is stale.
template <typename Priority>
struct MergeCandidate {
  Priority priority;
  int32_t left;
  int32_t right;
  size_t left_len;
  size_t right_len;
};

// Merges until no candidate is left. `pair_priority(left, right, &p)` says
// whether symbols[left] + symbols[right] may merge and with which priority;
// `worse(a, b)` is the queue order (true when a merges after b; ties must be
// broken by position for a deterministic result).
template <typename Priority, typename PairFn, typename Worse>
void merge_symbols(std::vector<MergeSymbol>& symbols, PairFn pair_priority, Worse worse) {
  using Candidate = MergeCandidate<Priority>;
  std::priority_queue<Candidate, std::vector<Candidate>, Worse> queue(worse);
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    Priority p{};
    if (!pair_priority(left, right, &p)) return;
    queue.push({p, left, right, symbols[(size_t)left].len, symbols[(size_t)right].len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    MergeSymbol& l = symbols[(size_t)c.left];
    MergeSymbol& r = symbols[(size_t)c.right];
    if (l.len != c.left_len || r.len != c.right_len || l.next != c.right || r.len == 0) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[(size_t)r.next].prev = c.left;
    try_add(l.prev, c.left);
    try_add(c.left, l.next);
  }
}

}  // namespace serval::tokenizer_detail
