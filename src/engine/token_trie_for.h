// The grammar matcher's view of a tokenizer's vocabulary: each token's
// output bytes (control tokens: none) and the end-of-generation tokens.
#pragma once

#include <memory>

#include "sampler/grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace serval {

std::shared_ptr<const TokenTrie> token_trie_for(const Tokenizer& tok);

}  // namespace serval
