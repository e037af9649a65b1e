// The vocabulary of a tokenizer as read from GGUF metadata (tokenizer.ggml.*):
// token texts, scores and attributes, the special token ids and the flags
// that steer encoding (add BOS/EOS/SEP, space prefix, ...).
//
// load_vocab() validates everything a file can get wrong (missing arrays,
// arrays of different lengths, special ids out of range, duplicate texts) and
// fills in llama.cpp's defaults for absent keys, so the encoders can trust it.
// A Vocab is immutable after loading and safe to read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/pre_tokenizer.h"

namespace serval {

using TokenId = int32_t;
constexpr TokenId kNoToken = -1;

enum class VocabType { spm, bpe, wpm };

// Token attributes (bit flags). tokenizer.ggml.token_type gives one of
// normal/unknown/control/user_defined/unused/byte per token; lstrip/rstrip are
// added for a few models whose special tokens swallow neighbouring spaces.
namespace token_attr {
constexpr uint32_t undefined = 0;
constexpr uint32_t unknown = 1u << 0;
constexpr uint32_t unused = 1u << 1;
constexpr uint32_t normal = 1u << 2;
constexpr uint32_t control = 1u << 3;
constexpr uint32_t user_defined = 1u << 4;
constexpr uint32_t byte = 1u << 5;
constexpr uint32_t lstrip = 1u << 6;  // when split out of text: eat whitespace on its left
constexpr uint32_t rstrip = 1u << 7;  // ... and on its right
}  // namespace token_attr

struct TokenData {
  std::string text;  // as stored (SPM: "▁" for space; BPE: byte-level characters)
  float score = 0.0f;
  uint32_t attr = token_attr::normal;
};

// Hash for heterogeneous lookup (find(string_view) without a copy).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Vocab {
  VocabType type = VocabType::spm;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre ("" when absent)

  std::vector<TokenData> tokens;  // index = token id
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> text_to_id;
  size_t max_token_len = 0;  // bytes

  // Special tokens, kNoToken when the model has none.
  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken;
  TokenId unk = kNoToken, sep = kNoToken, pad = kNoToken, mask = kNoToken;
  TokenId fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken;
  TokenId fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;

  bool add_bos = false;           // encode(add_special) prepends bos
  bool add_eos = false;           // ... appends eos
  bool add_sep = false;           // ... appends sep (BERT, RoBERTa-style)
  bool add_space_prefix = false;  // SPM: text gets a leading " " (then "▁")
  bool ignore_merges = false;     // BPE: a word that is a token is not merged
  bool clean_spaces = false;      // decode() removes spaces before , . ? ! 's ...

  std::vector<TokenId> eog;  // end-of-generation ids, sorted
  // Tokens split out of the text before the model runs (control, unknown and
  // user-defined ones), longest text first (ties by id).
  std::vector<TokenId> special_by_length;

  PreTokenizerSpec pre_spec;  // BPE only

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  TokenId find(std::string_view text) const {
    auto it = text_to_id.find(text);
    return it == text_to_id.end() ? kNoToken : it->second;
  }
  bool valid(TokenId id) const { return id >= 0 && id < n_tokens(); }
  uint32_t attr(TokenId id) const { return tokens[static_cast<size_t>(id)].attr; }
};

// Reads and validates the vocabulary. Errors: invalid_file (a key is missing,
// has the wrong type, or its value is inconsistent; the message names the key
// and the expected vs actual value) or unsupported (a tokenizer model or
// pre-tokenizer serval does not implement).
Expected<Vocab> load_vocab(const gguf::GgufFile& f);

}  // namespace serval
