// Pre-tokenizer of byte-level BPE vocabularies: splits text into words with a
// sequence of regexes chosen by `tokenizer.ggml.pre` (the HF tokenizer.json
// "Split" pre-tokenizers), before the merges run inside each word.
//
// Semantics follow llama.cpp's unicode_regex_split, which the test vectors
// were checked against:
//   * the text is decoded to code points (malformed bytes become U+FFFD);
//   * each regex further splits every piece produced by the previous one:
//     the matches and the gaps between them all become pieces (nothing is
//     dropped), and matching never looks across a piece boundary;
//   * \p{L} \p{N} \p{P} \p{S} \p{M} use our Unicode tables; \s is ASCII
//     whitespace plus every non-ASCII White_Space code point.
// Regexes run on PCRE2 (32-bit code units, JIT when available) over a
// "collapsed" subject where each non-ASCII code point is replaced by a code for
// its category, so the category classes become plain character classes.
//
// Thread safety: immutable after create(); split() may run concurrently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace serval {

// What a `tokenizer.ggml.pre` name selects (besides the regexes, a few
// vocab flags that llama.cpp ties to the same name).
struct PreTokenizerSpec {
  std::string name;                  // canonical name, for diagnostics
  std::vector<std::string> regexes;  // applied in order
  bool ignore_merges = false;        // a word that is a whole token skips merging
  bool clean_spaces = true;          // decode() removes " ," style spaces
  std::optional<bool> add_bos;       // overrides the default of the vocab type
  bool no_bos = false;               // the model has no BOS token at all
  bool add_sep = false;              // append SEP with add_special (RoBERTa-style)
};

// `name` is the value of tokenizer.ggml.pre; "" (absent) and "default" select
// the default splitter. Unknown names, and names whose pre-tokenizer needs
// code beyond regexes (kimi-k2, afmoe), give an `unsupported` Status.
Expected<PreTokenizerSpec> lookup_pre_tokenizer(std::string_view name);

class PreTokenizer {
 public:
  // Compiles the regexes. Error (invalid_argument) for a regex PCRE2 rejects,
  // or one that mixes \p{..} classes with non-ASCII characters.
  static Expected<PreTokenizer> create(const std::vector<std::string>& regexes);

  // The words of `text`, as UTF-8 (not yet byte-encoded). Their concatenation
  // is `text` with malformed bytes replaced by U+FFFD. Empty text: no words.
  std::vector<std::string> split(std::string_view text) const;

  struct Regex;  // one compiled regex (pre_tokenizer.cpp)

 private:
  std::vector<std::shared_ptr<const Regex>> regexes_;
  bool any_collapsed_ = false;
  bool any_raw_ = false;
};

// Exposed for tests: rewrites a regex for the subject encoding described
// above. `collapsed` is set when the regex uses \p{..} classes.
Expected<std::string> translate_regex(std::string_view regex, bool& collapsed);

}  // namespace serval
