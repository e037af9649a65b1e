// Malformed tokenizer metadata gives a clear Status (code, key, expected vs
// actual), never a crash. Files are built in memory with GgufWriter.
#include <gtest/gtest.h>

#include "test_helpers.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

using gguf::GgufWriter;
using gguf::Value;

// A small valid SPM vocabulary: <unk> <s> </s> ▁ a b ab.
GgufWriter spm_writer() {
  GgufWriter w;
  w.add("general.architecture", Value("llama"));
  w.add("tokenizer.ggml.model", Value("llama"));
  w.add("tokenizer.ggml.tokens", Value(test::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab"})));
  w.add("tokenizer.ggml.scores", Value(test::f32_array({0, 0, 0, -1, -2, -3, -0.5f})));
  w.add("tokenizer.ggml.token_type", Value(test::i32_array({2, 3, 3, 1, 1, 1, 1})));
  return w;
}

Status load_status(const GgufWriter& w) {
  const gguf::GgufFile f = test::parse_or_die(w);
  auto t = Tokenizer::from_gguf(f);
  return t.ok() ? Status::ok_status() : t.status();
}

void expect_error(const GgufWriter& w, StatusCode code, std::initializer_list<const char*> parts) {
  const Status st = load_status(w);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.message();
  for (const char* p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
}

TEST(TokenizerValidation, ValidBaseLoads) {
  const gguf::GgufFile f = test::parse_or_die(spm_writer());
  auto t = Tokenizer::from_gguf(f);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->n_vocab(), 7);
  EXPECT_EQ(t->encode("ab", true, false), (std::vector<TokenId>{1, 3, 6}));
}

TEST(TokenizerValidation, MissingTokens) {
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("llama"));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.tokens", "missing"});
}

TEST(TokenizerValidation, MissingModel) {
  GgufWriter w;
  w.add("tokenizer.ggml.tokens", Value(test::string_array({"a"})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.model", "missing"});
}

TEST(TokenizerValidation, EmptyTokens) {
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("llama"));
  w.add("tokenizer.ggml.tokens", Value(test::string_array({})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.tokens", "at least 1", "got 0"});
}

TEST(TokenizerValidation, TokensOfWrongType) {
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("llama"));
  w.add("tokenizer.ggml.tokens", Value(test::i32_array({1, 2, 3})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.tokens", "string"});
}

TEST(TokenizerValidation, ScoresLengthMismatch) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.scores", Value(test::f32_array({0, 0, 0})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.scores", "expected 7", "got 3"});
}

TEST(TokenizerValidation, TokenTypeLengthMismatch) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.token_type", Value(test::i32_array({1, 1, 1, 1, 1, 1, 1, 1})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.token_type", "expected 7", "got 8"});
}

TEST(TokenizerValidation, ScoresOfWrongType) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.scores", Value(test::string_array({"a", "b", "c", "d", "e", "f", "g"})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.scores", "f32"});
}

TEST(TokenizerValidation, SpecialIdOutOfRange) {
  struct Case {
    const char* key;
    Value value;
    const char* got;
  };
  const Case cases[] = {
      {"tokenizer.ggml.bos_token_id", Value(uint32_t{7}), "got 7"},
      {"tokenizer.ggml.eos_token_id", Value(uint32_t{100000}), "got 100000"},
      {"tokenizer.ggml.unknown_token_id", Value(int32_t{-5}), "got -5"},
      {"tokenizer.ggml.seperator_token_id", Value(uint64_t{1} << 40), "got 1099511627776"},
      {"tokenizer.ggml.padding_token_id", Value(uint32_t{8}), "got 8"},
      {"tokenizer.ggml.eot_token_id", Value(uint32_t{9}), "got 9"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    GgufWriter w = spm_writer();
    w.add(c.key, c.value);
    expect_error(w, StatusCode::invalid_file, {c.key, "[0, 7)", c.got});
  }
}

TEST(TokenizerValidation, SpecialIdNoneSentinels) {
  // Converters write 0xFFFFFFFF (or -1) for "no such token".
  GgufWriter w = spm_writer();
  w.add("tokenizer.ggml.seperator_token_id", Value(uint32_t{0xFFFFFFFFu}));
  w.add("tokenizer.ggml.padding_token_id", Value(int32_t{-1}));
  w.add("tokenizer.ggml.eos_token_id", Value(uint32_t{0xFFFFFFFFu}));
  const gguf::GgufFile f = test::parse_or_die(w);
  auto t = Tokenizer::from_gguf(f);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->eos(), -1);
  EXPECT_EQ(t->vocab().sep, -1);
  EXPECT_EQ(t->vocab().pad, -1);
}

TEST(TokenizerValidation, SpecialIdOfWrongType) {
  GgufWriter w = spm_writer();
  w.add("tokenizer.ggml.bos_token_id", Value("1"));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.bos_token_id", "integer"});
}

TEST(TokenizerValidation, FlagOfWrongType) {
  GgufWriter w = spm_writer();
  w.add("tokenizer.ggml.add_bos_token", Value(uint32_t{1}));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.add_bos_token", "bool"});
}

TEST(TokenizerValidation, DuplicateTokenText) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.tokens", Value(test::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "a"})));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.tokens", "'a'", "4", "6"});
}

// A BYTE-typed token must read <0xHH>: "<0x-1>" and friends are refused
// rather than guessed at by byte fallback and rendering.
TEST(TokenizerValidation, MalformedByteTokenText) {
  for (const char* bad : {"<0x-1>", "<0xZZ>", "<0x100>", "<0x>", "<0x0A", "0x0A>", "<0X0A>", "<0x 1>"}) {
    GgufWriter w = spm_writer();
    w.set("tokenizer.ggml.tokens", Value(test::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", bad})));
    w.set("tokenizer.ggml.token_type", Value(test::i32_array({2, 3, 3, 1, 1, 1, 6})));
    SCOPED_TRACE(bad);
    expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.tokens", "token 6", bad, "BYTE"});
  }
  // The same texts as NORMAL tokens are fine, and so are well-formed byte tokens in either case.
  for (const char* text : {"<0x-1>", "<0x0a>", "<0xFF>"}) {
    GgufWriter w = spm_writer();
    w.set("tokenizer.ggml.tokens", Value(test::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", text})));
    w.set("tokenizer.ggml.token_type", Value(test::i32_array({2, 3, 3, 1, 1, 1, text[3] == '-' ? 1 : 6})));
    EXPECT_TRUE(load_status(w).ok()) << text << ": " << load_status(w).message();
  }
}

TEST(TokenizerValidation, UnsupportedModel) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.model", Value("t5"));
  expect_error(w, StatusCode::unsupported, {"tokenizer.ggml.model", "t5"});
}

TEST(TokenizerValidation, Gpt2WithoutMerges) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.model", Value("gpt2"));
  expect_error(w, StatusCode::invalid_file, {"tokenizer.ggml.merges", "missing"});
}

TEST(TokenizerValidation, UnknownPreTokenizer) {
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.model", Value("gpt2"));
  w.add("tokenizer.ggml.merges", Value(test::string_array({"a b"})));
  w.add("tokenizer.ggml.pre", Value("no-such-pre"));
  expect_error(w, StatusCode::unsupported, {"tokenizer.ggml.pre", "no-such-pre"});
}

TEST(TokenizerValidation, DefaultIdsOutsideSmallVocabAreDropped) {
  // SPM defaults bos=1/eos=2; with two tokens there is no eos.
  GgufWriter w;
  w.add("tokenizer.ggml.model", Value("llama"));
  w.add("tokenizer.ggml.tokens", Value(test::string_array({"<unk>", "<s>"})));
  const gguf::GgufFile f = test::parse_or_die(w);
  auto t = Tokenizer::from_gguf(f);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), -1);
  EXPECT_FALSE(t->add_eos());
}

TEST(TokenizerValidation, EmptyTokenTextIsRenamed) {
  // An empty text would match everywhere when special tokens are split out.
  GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.tokens", Value(test::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", ""})));
  w.set("tokenizer.ggml.token_type", Value(test::i32_array({2, 3, 3, 1, 1, 1, 4})));
  const gguf::GgufFile f = test::parse_or_die(w);
  auto t = Tokenizer::from_gguf(f);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->token_text(6), "[EMPTY_6]");
  EXPECT_EQ(t->encode("ab", false, true), (std::vector<TokenId>{3, 4, 5}));
}

}  // namespace
}  // namespace serval
