// SPM, BPE and WordPiece on tiny hand-made vocabularies, where the expected
// tokens follow from the algorithm definitions by hand.
#include <gtest/gtest.h>

#include "test_helpers.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

using gguf::GgufWriter;
using gguf::Value;
using Ids = std::vector<TokenId>;

Tokenizer load(const GgufWriter& w) {
  const gguf::GgufFile f = test::parse_or_die(w);
  auto t = Tokenizer::from_gguf(f);
  if (!t.ok()) throw std::runtime_error(t.status().message());
  return std::move(t.value());
}

GgufWriter bpe_writer(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                      const char* pre = "gpt-2") {
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("gpt2"));
  w.add("tokenizer.ggml.pre", Value(pre));
  w.add("tokenizer.ggml.tokens", Value(test::string_array(tokens)));
  w.add("tokenizer.ggml.merges", Value(test::string_array(merges)));
  return w;
}

TEST(Bpe, LowestRankMergesFirst) {
  //                         0    1    2    3     4     5
  const std::vector<std::string> toks = {"a", "b", "c", "ab", "bc", "abc"};
  // "b c" outranks "a b": a|bc, then "a bc" -> abc.
  EXPECT_EQ(load(bpe_writer(toks, {"b c", "a b", "a bc"})).encode("abc", false, false), (Ids{5}));
  // "a b" outranks "b c" and "ab c" is no merge: ab|c.
  EXPECT_EQ(load(bpe_writer(toks, {"a b", "b c", "a bc"})).encode("abc", false, false), (Ids{3, 2}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  const Tokenizer t = load(bpe_writer({"a", "aa"}, {"a a"}));
  EXPECT_EQ(t.encode("aaa", false, false), (Ids{1, 0}));
  EXPECT_EQ(t.encode("aaaa", false, false), (Ids{1, 1}));
}

TEST(Bpe, SpacesAreByteEncoded) {
  // " a" is the word "Ġa" in byte-level form.
  const Tokenizer t = load(bpe_writer({"a", "\xC4\xA0", "\xC4\xA0" "a"}, {"\xC4\xA0 a"}));
  EXPECT_EQ(t.encode("a a", false, false), (Ids{0, 2}));
  EXPECT_EQ(t.decode(Ids{0, 2}), "a a");
  EXPECT_EQ(t.token_to_piece(1), " ");
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  // llama-bpe: a word that is a token is used as is, even without merges.
  const std::vector<std::string> toks = {"a", "b", "c", "abc"};
  EXPECT_EQ(load(bpe_writer(toks, {}, "llama-bpe")).encode("abc", false, false), (Ids{3}));
  EXPECT_EQ(load(bpe_writer(toks, {}, "gpt-2")).encode("abc", false, false), (Ids{0, 1, 2}));
}

TEST(Bpe, UserDefinedTokensAreSplitOutOfText) {
  GgufWriter w = bpe_writer({"a", "b", "<x>", "<", "x", ">"}, {});
  w.add("tokenizer.ggml.token_type", Value(test::i32_array({1, 1, 4, 1, 1, 1})));
  const Tokenizer t = load(w);
  EXPECT_EQ(t.encode("a<x>b", false, false), (Ids{0, 2, 1}));
  EXPECT_EQ(t.decode(Ids{0, 2, 1}), "a<x>b");
}

TEST(Bpe, ControlTokensOnlyWithParseSpecial) {
  GgufWriter w = bpe_writer({"a", "<", "x", ">", "<x>"}, {});
  w.add("tokenizer.ggml.token_type", Value(test::i32_array({1, 1, 1, 1, 3})));
  const Tokenizer t = load(w);
  EXPECT_EQ(t.encode("a<x>", false, true), (Ids{0, 4}));
  EXPECT_EQ(t.encode("a<x>", false, false), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(t.decode(Ids{0, 4}), "a");
  EXPECT_EQ(t.decode(Ids{0, 4}, true), "a<x>");
}

TEST(Bpe, LongerSpecialTokensWin) {
  // "<ab>" is taken before "<a", so the overlapping shorter match loses.
  GgufWriter w = bpe_writer({"<a", "<ab>", "b", ">", "<", "a"}, {});
  w.add("tokenizer.ggml.token_type", Value(test::i32_array({4, 4, 1, 1, 1, 1})));
  const Tokenizer t = load(w);
  EXPECT_EQ(t.encode("<a<ab>", false, false), (Ids{0, 1}));
  EXPECT_EQ(t.encode("<ab<a", false, false), (Ids{0, 2, 0}));
}

TEST(Bpe, AddSpecialFollowsMetadata) {
  GgufWriter w = bpe_writer({"a", "<bos>", "<eos>"}, {});
  w.add("tokenizer.ggml.bos_token_id", Value(uint32_t{1}));
  w.add("tokenizer.ggml.eos_token_id", Value(uint32_t{2}));
  EXPECT_EQ(load(w).encode("a", true, false), (Ids{0}));  // gpt2: no BOS by default
  w.add("tokenizer.ggml.add_bos_token", Value(true));
  w.add("tokenizer.ggml.add_eos_token", Value(true));
  const Tokenizer t = load(w);
  EXPECT_EQ(t.encode("a", true, false), (Ids{1, 0, 2}));
  EXPECT_TRUE(t.is_eog(2));
}

GgufWriter spm_writer(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                      const std::vector<int32_t>& types) {
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("llama"));
  w.add("tokenizer.ggml.tokens", Value(test::string_array(tokens)));
  w.add("tokenizer.ggml.scores", Value(test::f32_array(scores)));
  w.add("tokenizer.ggml.token_type", Value(test::i32_array(types)));
  return w;
}

TEST(Spm, HighestScoreMergesFirst) {
  //                                       0        1      2       3     4    5    6     7
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "a"};
  const std::vector<int32_t> types = {2, 3, 3, 1, 1, 1, 1, 1};
  // "ab" scores higher than "▁a": ▁|ab.
  EXPECT_EQ(load(spm_writer(toks, {0, 0, 0, -1, -1, -1, -1, -2}, types)).encode("ab", false, false), (Ids{3, 6}));
  // "▁a" scores higher: ▁a|b.
  EXPECT_EQ(load(spm_writer(toks, {0, 0, 0, -1, -1, -1, -2, -1}, types)).encode("ab", false, false), (Ids{7, 5}));
}

TEST(Spm, SpacePrefixAndByteFallback) {
  std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a"};
  std::vector<float> scores = {0, 0, 0, -1, -1};
  std::vector<int32_t> types = {2, 3, 3, 1, 1};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    toks.push_back(name);
    scores.push_back(0);
    types.push_back(6);
  }
  const Tokenizer t = load(spm_writer(toks, scores, types));
  const TokenId kByteC3 = 5 + 0xC3, kByteA9 = 5 + 0xA9;
  EXPECT_EQ(t.encode("a\xC3\xA9", true, false), (Ids{1, 3, 4, kByteC3, kByteA9}));
  EXPECT_EQ(t.decode(Ids{1, 3, 4, kByteC3, kByteA9}), "a\xC3\xA9");
  // No prefix when add_space_prefix is false.
  GgufWriter w = spm_writer(toks, scores, types);
  w.add("tokenizer.ggml.add_space_prefix", Value(false));
  EXPECT_EQ(load(w).encode("a", false, false), (Ids{4}));
  // Empty text: just BOS with add_special.
  EXPECT_EQ(t.encode("", true, false), (Ids{1}));
  EXPECT_EQ(t.encode("", false, false), Ids{});
}

TEST(Spm, SpecialTokenRestartsSpacePrefix) {
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "\xE2\x96\x81" "a"};
  const Tokenizer t = load(spm_writer(toks, {0, 0, 0, -1, -1, -0.5f}, {2, 3, 3, 1, 1, 1}));
  // Like llama.cpp: each text fragment after a special token gets " " again.
  EXPECT_EQ(t.encode("a</s>a", false, true), (Ids{5, 2, 5}));
}

GgufWriter wpm_writer() {
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("bert"));
  //                                                      0        1        2        3        4
  w.add("tokenizer.ggml.tokens", Value(test::string_array({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                           // 5           6          7      8       9
                                                           "\xE2\x96\x81hello", "\xE2\x96\x81un", "aff", "able",
                                                           "\xE2\x96\x81,",
                                                           // 10                11              12
                                                           "\xE2\x96\x81" "cafe", "\xE2\x96\x81!", "\xE2\x96\x81\xE4\xB8\xAD"})));
  w.add("tokenizer.ggml.token_type", Value(test::i32_array({3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1})));
  w.add("tokenizer.ggml.unknown_token_id", Value(uint32_t{1}));
  w.add("tokenizer.ggml.cls_token_id", Value(uint32_t{2}));
  w.add("tokenizer.ggml.seperator_token_id", Value(uint32_t{3}));
  return w;
}

TEST(Wpm, GreedyLongestMatchWithUnknownWords) {
  const Tokenizer t = load(wpm_writer());
  EXPECT_EQ(t.type(), VocabType::wpm);
  // Lowercase, accents stripped (é -> e), punctuation split off, unknown word -> [UNK].
  EXPECT_EQ(t.encode("Hello, unaffable CAF\xC3\x89 xyz!", true, false), (Ids{2, 5, 9, 6, 7, 8, 10, 1, 11, 3}));
  EXPECT_EQ(t.encode("hello", false, false), (Ids{5}));
  // CJK ideographs are words of their own; a control character is dropped.
  EXPECT_EQ(t.encode("\xE4\xB8\xAD\x01hello", false, false), (Ids{12, 5}));
  // Decoding cleans " ," and " !".
  EXPECT_EQ(t.decode(Ids{5, 9, 11}), " hello,!");
}

TEST(CleanUpSpaces, MatchesHfRules) {
  auto clean = [](std::string s) {
    clean_up_spaces(s);
    return s;
  };
  EXPECT_EQ(clean("Hello , world !"), "Hello, world!");
  EXPECT_EQ(clean("a . b ?"), "a. b?");
  EXPECT_EQ(clean("it ' s"), "it's");
  EXPECT_EQ(clean("he 's here"), "he's here");
  EXPECT_EQ(clean("I 'm we 're you 've"), "I'm we're you've");
  EXPECT_EQ(clean("don 't I 'd we 'll"), "don 't I 'd we 'll");  // left as HF leaves them
  // " ' " collapses once; the removed space does not count for the next one.
  EXPECT_EQ(clean(" ' ' "), "'' ");
  EXPECT_EQ(clean(" ,"), ",");
  EXPECT_EQ(clean("x  ,"), "x ,");  // only the space right before goes
}

}  // namespace
}  // namespace serval
