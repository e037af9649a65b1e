// Tokenizer: text <-> token ids for the vocabularies stored in GGUF metadata
// (tokenizer.ggml.*): SentencePiece-style BPE ("llama"), byte-level BPE
// ("gpt2", with the pre-tokenizer named by tokenizer.ggml.pre) and WordPiece
// ("bert"). Behaviour matches llama.cpp's tokenizer, whose output the test
// vectors in ../shared/tokenizer-vectors come from.
//
// Ownership and threads: a Tokenizer is immutable after from_gguf() and owns
// everything it needs (it does not keep the GgufFile). Copies are cheap
// (shared, immutable state); all const methods may run concurrently.
//
// StreamingDetokenizer: one per output stream, not thread-safe; it keeps a
// pointer to its Tokenizer, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/vocab.h"

namespace serval {

class Tokenizer {
 public:
  // Errors: invalid_file (missing tokenizer.ggml.tokens / .model / .merges,
  // arrays of different lengths, special ids >= n_vocab, duplicate token
  // texts, keys of the wrong type; the message names the key and expected vs
  // actual value) or unsupported (tokenizer model or pre-tokenizer serval does
  // not implement).
  static Expected<Tokenizer> from_gguf(const gguf::GgufFile& f);

  // add_special: BOS/EOS (and SEP for BERT-like vocabs) as the metadata says.
  // parse_special: control/unknown token texts inside `text` become those
  // tokens (user-defined tokens are always recognised, as in HF tokenizers).
  // Any input is accepted: malformed UTF-8 is encoded like U+FFFD (BPE, WPM)
  // or as byte tokens (SPM). Time is O(n log n) in the text length.
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Raw bytes of one token (may be a partial UTF-8 sequence). Control and
  // unknown tokens render as "" unless render_special. Invalid ids give "".
  std::string token_to_piece(TokenId id, bool render_special = false) const;

  // Concatenated pieces, raw bytes (may end in a partial UTF-8 sequence).
  // When the vocab adds a space prefix (SPM) and ids start with BOS (not
  // rendered), the first piece after it loses its leading space, so that
  // decode(encode(text, true, ...)) == text. Vocabs with clean_spaces (GPT-2,
  // BERT, ...) also drop the spaces HF's clean_up_tokenization removes
  // (" ," -> ","). Invalid ids are skipped. whole_text: the ids are a whole
  // text (as /detokenize takes them), so the space prefix is removed also
  // when they do not start with BOS: decode(encode(text, false, ...), false,
  // true) == text. Without it a continuation keeps its leading space.
  std::string decode(std::span<const TokenId> ids, bool render_special = false, bool whole_text = false) const;

  int32_t n_vocab() const;
  VocabType type() const;
  TokenId bos() const;  // -1 when absent
  TokenId eos() const;  // -1 when absent
  bool add_bos() const;
  bool add_eos() const;
  bool is_eog(TokenId id) const;      // end of generation: eos, eot, eom, ...
  bool is_control(TokenId id) const;  // false for invalid ids
  // The vocab entry as stored ("" for invalid ids; an empty entry in the file
  // reads "[EMPTY_<id>]", as in llama.cpp, so it can never match text).
  const std::string& token_text(TokenId id) const;

  // Beyond the required API: the whole vocabulary (flags, special ids, ...).
  const Vocab& vocab() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns a stream of token ids into text that is always valid UTF-8: bytes of
// an unfinished UTF-8 sequence are held back until the next pieces complete
// it. The concatenation of all push() results and flush() equals
// decode(ids) whenever that is valid UTF-8 and has nothing for clean_spaces
// to remove (the space cleanup needs look-ahead, so streams skip it).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool render_special = false);

  // The complete UTF-8 text now available (possibly ""). Malformed bytes that
  // can no longer become valid are emitted as U+FFFD.
  std::string push(TokenId id);
  // Whatever is held back, incomplete sequences as U+FFFD; then resets the
  // pending bytes (the stream can go on).
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool render_special_;
  bool first_ = true;          // no token pushed yet
  bool strip_space_ = false;   // the first piece after a leading BOS loses a space
  std::string pending_;
};

}  // namespace serval
