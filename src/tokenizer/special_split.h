// Splits special tokens out of raw text before the model-specific encoder
// runs on the pieces in between.
//
// Which tokens: user-defined tokens always (HF tokenizers treat "added
// tokens" that way, e.g. MPT's runs of spaces); control and unknown tokens
// only with parse_special. Order: longest token text first; each token takes
// its occurrences, left to right and non-overlapping, out of the text pieces
// that are still raw (this precedence is llama.cpp's, which the reference
// vectors follow). A token with the lstrip/rstrip attribute also removes the
// ASCII whitespace next to it on that side.
//
// Cost: one trie walk over the text to find which special tokens occur at
// all, then one substring search per occurring token over the remaining raw
// text: O(n * depth + k * n) for k distinct special tokens present.
//
// Immutable after construction; split() is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/vocab.h"

namespace serval {

struct Fragment {
  TokenId token = kNoToken;  // kNoToken: raw text [offset, offset + length)
  size_t offset = 0;
  size_t length = 0;
};

class SpecialSplitter {
 public:
  SpecialSplitter() = default;
  explicit SpecialSplitter(const Vocab& vocab);

  // Fragments of `text` in order; raw fragments are never empty. `vocab` must
  // be the one given to the constructor.
  std::vector<Fragment> split(const Vocab& vocab, std::string_view text, bool parse_special) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // sorted by byte
    int32_t special = -1;  // index into vocab.special_by_length ending here
  };
  std::vector<Node> trie_;  // trie_[0] is the root
};

}  // namespace serval
