// Tokenizer on the real stories260K vocabulary (SentencePiece BPE with byte
// fallback). Invariants for any input bytes:
//  - encode gives ids in [0, n_vocab), for every flag combination;
//  - round trip: decode(encode(text, add_special=true, parse_special=false))
//    == text for valid UTF-8 without U+2581 (SPM writes spaces as U+2581, so a
//    literal one decodes as a space, as in llama.cpp and sentencepiece; decode
//    drops the space prefix encode adds after BOS), and without BOS
//    decode(ids, false, whole_text=true) == text;
//  - the streaming detokenizer's output is valid UTF-8 and, when decode() is
//    valid UTF-8, equal to it.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.h"

using namespace serval;

namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = (unsigned char)s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const auto d = (unsigned char)s[i + k];
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // keep executions fast; length is not the point here
  const Tokenizer& tok = fuzz::stories_tokenizer();
  const int32_t n_vocab = tok.n_vocab();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  for (int flags = 0; flags < 4; ++flags) {
    const bool add_special = flags & 1, parse_special = flags & 2;
    const auto ids = tok.encode(text, add_special, parse_special);
    for (TokenId id : ids) fuzz::require(id >= 0 && id < n_vocab, "encode: id out of range");
    const std::string dec = tok.decode(ids);
    if (!parse_special && valid_utf8(text) && text.find("\xe2\x96\x81") == std::string_view::npos) {
      // With BOS, decode drops the space prefix; without, decode as a whole text does.
      const std::string whole = add_special ? dec : tok.decode(ids, false, /*whole_text=*/true);
      fuzz::require(whole == text, "round trip: '" + std::string(text) + "' -> '" + whole + "'");
    }

    StreamingDetokenizer sd(tok);
    std::string streamed;
    for (TokenId id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    fuzz::require(valid_utf8(streamed), "streaming output is valid UTF-8");
    if (valid_utf8(dec)) fuzz::require(streamed == dec, "streaming == decode for valid UTF-8");
  }
  // Arbitrary id sequences (including invalid ids) decode without crashing.
  std::vector<TokenId> ids;
  for (size_t i = 0; i + 2 <= size && ids.size() < 256; i += 2)
    ids.push_back((TokenId)(int16_t)(data[i] | (data[i + 1] << 8)));
  (void)tok.decode(ids, true);
  StreamingDetokenizer sd(tok, true);
  std::string streamed;
  for (TokenId id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  fuzz::require(valid_utf8(streamed), "streaming output of any ids is valid UTF-8");
  return 0;
}
