// Byte-level BPE (tokenizer.ggml.model = gpt2).
//
// Each pre-tokenizer word is mapped byte by byte to the GPT-2 printable
// characters, cut into those characters, and then the adjacent pair with the
// lowest merge rank (tokenizer.ggml.merges order; ties: leftmost) is merged
// until no ranked pair is left. Pieces that are not tokens (only possible with
// inconsistent merges) fall back to single-byte tokens where they exist.
//
// Cost: O(m log m) per word of m characters. Immutable after load(); encode()
// is thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace serval {

class BpeModel {
 public:
  // Reads tokenizer.ggml.merges ("left right" strings; rank = index).
  // Error (invalid_file) when the key is missing or not an array of strings.
  static Expected<BpeModel> load(const gguf::GgufFile& f);
  // For tests: merges given directly.
  static BpeModel from_merges(const std::vector<std::string>& merges);

  // Rank of merging `left` and `right` (byte-level texts), -1 when unranked.
  int32_t rank(std::string_view left, std::string_view right, std::string& scratch) const;

  // Appends the tokens of one pre-tokenizer word (plain UTF-8, not yet
  // byte-encoded) to `out`.
  void encode_word(const Vocab& vocab, std::string_view word, std::vector<TokenId>& out) const;

  // Splits `text` with `pre` and encodes every word.
  void encode(const Vocab& vocab, const PreTokenizer& pre, std::string_view text, std::vector<TokenId>& out) const;

  size_t n_merges() const { return ranks_.size(); }

 private:
  void add_merge(std::string_view merge, int32_t rank);

  // Key: left + '\xff' + right (0xFF never occurs in UTF-8 text).
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;
};

}  // namespace serval
