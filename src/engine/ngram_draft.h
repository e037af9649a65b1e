// Prompt-lookup (n-gram) drafting: the draft for a sequence is what followed
// the most recent earlier occurrence of its longest matching suffix. No second
// model; it pays off when the output copies from the input (editing, quoting,
// code changes, "repeat this passage").
//
// Free function; thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "serval/types.h"

namespace serval {

// For n from n_max down to n_min (1 <= n_min <= n_max): if the last n tokens of
// `history` (prompt + generated, the newest sampled token last) also occur
// ending earlier in it, the draft is the k tokens that followed their most
// recent such occurrence; where that runs into the end of the history the
// repeating span continues periodically (history[len + j] := history[e + j]).
// Empty when no suffix of n_min or more tokens recurs. O(n_max * history).
std::vector<TokenId> ngram_draft(std::span<const TokenId> history, int32_t n_min, int32_t n_max, int32_t k);

}  // namespace serval
