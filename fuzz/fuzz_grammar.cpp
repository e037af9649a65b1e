// Grammar compilers and matcher: the first byte picks the front end (GBNF,
// JSON Schema, regex), the rest is its source. Compile errors are fine (they
// must carry a message); an accepted grammar is then walked for a few steps
// over a small byte-level vocabulary, checking that every token the mask
// allows is accepted and that end-of-generation is allowed exactly where the
// grammar may end (or where nothing else is). The budgets (GrammarLimits) must stop blow-ups with an
// error: a crash, a sanitizer report, a timeout or an allocation past the
// libFuzzer limits is a finding.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "sampler/grammar/grammar.h"
#include "sampler/grammar/matcher.h"

using namespace serval;

namespace {

// Token 0: end of generation; 1..256: every byte; then a few multi-byte pieces.
std::shared_ptr<const TokenTrie> vocab() {
  static const auto trie = [] {
    std::vector<std::string> pieces{""};
    for (int b = 0; b < 256; ++b) pieces.emplace_back(1, (char)b);
    for (const char* p : {"{\"", "\": ", "\", \"", "true", "false", "null", "  ", "ab", "\xc3\xa9", "123"})
      pieces.emplace_back(p);
    return std::make_shared<const TokenTrie>(std::move(pieces), std::vector<TokenId>{0});
  }();
  return trie;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view src(reinterpret_cast<const char*>(data) + 1, size - 1);
  GrammarLimits limits;
  limits.max_compile_ms = 1000;
  Expected<GrammarPtr> g = data[0] % 3 == 0 ? compile_gbnf(src, limits)
                           : data[0] % 3 == 1 ? compile_json_schema(src, limits)
                                              : compile_regex(src, limits);
  if (!g.ok()) {
    fuzz::require(!g.status().message().empty(), "a compile error has a message");
    return 0;
  }
  GrammarMatcher m(*g, vocab());
  std::vector<uint64_t> mask;
  for (int step = 0; step < 16 && !m.dead(); ++step) {
    m.fill_mask(mask);
    std::vector<TokenId> allowed;
    for (TokenId t = 1; t < vocab()->n_vocab(); ++t)
      if (mask[(size_t)t / 64] >> (t % 64) & 1) allowed.push_back(t);
    // (When nothing else is allowed, end of generation is, so a dead state cannot hang a request.)
    fuzz::require((mask[0] & 1) == (m.can_end() || allowed.empty()),
                  "end of generation is allowed exactly where the grammar may end");
    if (allowed.empty()) break;
    // The input's own bytes choose the path.
    const TokenId pick = allowed[data[(size_t)step % size] % allowed.size()];
    fuzz::require(m.accept_token(pick), "a token the mask allows is accepted");
  }
  return 0;
}
