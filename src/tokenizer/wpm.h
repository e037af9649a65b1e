// WordPiece (tokenizer.ggml.model = bert), as llama.cpp runs it on converted
// BERT vocabularies, where word-initial pieces carry a "▁" prefix and
// continuation pieces have lost their "##".
//
// Preprocessing: each code point is replaced by the first code point of its
// NFD decomposition (which drops accents of precomposed letters) and
// lowercased; whitespace separates words; control characters, NUL and U+FFFD
// are dropped; punctuation, ASCII symbols and CJK ideographs become words of
// their own. Each word, prefixed with "▁", is then matched greedily
// longest-first against the vocabulary; a word with any unmatched position
// becomes a single <unk>.
//
// Cost: O(n * max_token_len) lookups. Thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace serval {

// The words of `text` after BERT preprocessing (UTF-8).
std::vector<std::string> wpm_preprocess(std::string_view text);

// Appends the tokens of `text` to `out`.
void wpm_encode(const Vocab& vocab, std::string_view text, std::vector<TokenId>& out);

}  // namespace serval
