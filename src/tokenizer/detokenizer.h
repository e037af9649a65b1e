// Token ids -> text: the piece of each token and the clean-up decode()
// applies. StreamingDetokenizer itself is declared in tokenizer.h (part of the
// public API) and implemented in detokenizer.cpp.
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/vocab.h"

namespace serval {

// The bytes token `id` stands for, with special tokens rendered as their
// text: SPM/WPM "▁" -> " " and <0xXX> -> the byte; byte-level BPE characters
// -> their bytes; control, unknown and user-defined tokens -> their text;
// unused/undefined tokens -> "". Requires vocab.valid(id).
std::string render_piece(const Vocab& vocab, TokenId id);

// "<0xAB>" -> 0xAB (either case of hex digit); -1 for any other text.
int parse_byte_token(std::string_view text);

// HF's clean_up_tokenization_spaces, as llama.cpp applies it: removes the
// space before ? ! . , and before 's 'm 're 've, and the spaces around a lone
// apostrophe (" ' " -> "'").
void clean_up_spaces(std::string& text);

}  // namespace serval
