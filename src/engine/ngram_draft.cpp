#include "engine/ngram_draft.h"

#include <algorithm>

namespace serval {

std::vector<TokenId> ngram_draft(std::span<const TokenId> history, int32_t n_min, int32_t n_max, int32_t k) {
  const auto len = static_cast<int64_t>(history.size());
  if (k <= 0 || n_min < 1 || n_max < n_min) return {};
  for (int64_t n = std::min<int64_t>(n_max, len - 1); n >= n_min; --n) {
    const auto suffix = history.subspan(static_cast<size_t>(len - n));
    // Occurrences ending at e (exclusive) < len, most recent first. The draft
    // continues the text as it went on after e: token len + j is guessed as
    // token e + j, which for e + j >= len is itself a drafted token (a
    // repeating span continues with its period len - e).
    for (int64_t e = len - 1; e >= n; --e) {
      if (!std::equal(suffix.begin(), suffix.end(), history.begin() + (e - n))) continue;
      std::vector<TokenId> draft;
      draft.reserve(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = e + j;
        draft.push_back(src < len ? history[static_cast<size_t>(src)] : draft[static_cast<size_t>(src - len)]);
      }
      return draft;
    }
  }
  return {};
}

}  // namespace serval
