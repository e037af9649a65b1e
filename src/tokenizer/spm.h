// SentencePiece-style BPE over scored pieces (tokenizer.ggml.model = llama).
//
// The text is cut into UTF-8 characters; then, repeatedly, the adjacent pair
// whose concatenation is a vocabulary entry with the highest score is merged
// (ties: leftmost pair first). Characters left that are not in the vocabulary
// fall back to byte tokens "<0xXX>" (or, failing that, the single-byte token,
// or <unk>).
//
// Cost: O(n log n) in the text length. Thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace serval {

// Replaces every ' ' by "▁" (U+2581), SentencePiece's visible space.
std::string spm_escape_spaces(std::string_view text);

// Appends the tokens of `text` to `out`. `text` is already prepared: spaces
// replaced by "▁" (U+2581) and the optional space prefix added.
void spm_encode(const Vocab& vocab, std::string_view text, std::vector<TokenId>& out);

}  // namespace serval
