// stories260K (llama SPM, 512 tokens) against llama.cpp's golden prompts and
// continuations in ../shared/golden/stories260K-greedy.json.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_helpers.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

class Stories : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto f = gguf::GgufFile::open(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto t = Tokenizer::from_gguf(f.value());
    ASSERT_TRUE(t.ok()) << t.status().message();
    tok_ = new Tokenizer(std::move(t.value()));
    std::ifstream in(test::shared_path("golden/stories260K-greedy.json"));
    golden_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete golden_;
    tok_ = nullptr;
    golden_ = nullptr;
  }
  static const Tokenizer& tok() { return *tok_; }
  static const nlohmann::json& cases() { return (*golden_)["cases"]; }

 private:
  static Tokenizer* tok_;
  static nlohmann::json* golden_;
};

Tokenizer* Stories::tok_ = nullptr;
nlohmann::json* Stories::golden_ = nullptr;

TEST_F(Stories, Metadata) {
  EXPECT_EQ(tok().n_vocab(), 512);
  EXPECT_EQ(tok().type(), VocabType::spm);
  EXPECT_EQ(tok().bos(), 1);
  EXPECT_EQ(tok().eos(), 2);
  EXPECT_TRUE(tok().add_bos());
  EXPECT_FALSE(tok().add_eos());
  EXPECT_TRUE(tok().is_eog(2));
  EXPECT_FALSE(tok().is_eog(1));
  EXPECT_TRUE(tok().is_control(1));
  EXPECT_FALSE(tok().is_control(403));
  EXPECT_EQ(tok().token_text(1), "<s>");
  // seperator/padding ids are 0xFFFFFFFF in this file: "none", not an error.
  EXPECT_EQ(tok().vocab().sep, kNoToken);
  EXPECT_EQ(tok().vocab().pad, kNoToken);
}

TEST_F(Stories, OnceUponATime) {
  EXPECT_EQ(tok().encode("Once upon a time", true, false), (std::vector<TokenId>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok().encode("Once upon a time", false, false), (std::vector<TokenId>{403, 407, 261, 378}));
}

TEST_F(Stories, GoldenPromptTokens) {
  ASSERT_EQ(cases().size(), 6u);
  for (const auto& c : cases()) {
    const std::string prompt = c["prompt"];
    const auto expected = c["prompt_tokens"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok().encode(prompt, true, true), expected) << prompt;
    EXPECT_EQ(tok().encode(prompt, true, false), expected) << prompt;
  }
}

TEST_F(Stories, DecodePromptDropsSpacePrefixAfterBos) {
  for (const auto& c : cases()) {
    const std::string prompt = c["prompt"];
    const auto ids = c["prompt_tokens"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok().decode(ids), prompt);
    // Rendered BOS: llama.cpp's "<s> Once ..." (the space stays).
    EXPECT_EQ(tok().decode(ids, true), "<s> " + prompt);
  }
}

TEST_F(Stories, GreedyContinuationDecodesToGoldenText) {
  for (const auto& c : cases()) {
    const auto ids = c["greedy_tokens"].get<std::vector<TokenId>>();
    const std::string expected = c["greedy_text"];
    EXPECT_EQ(tok().decode(ids), expected);
    StreamingDetokenizer detok(tok());
    std::string streamed;
    for (TokenId id : ids) streamed += detok.push(id);
    streamed += detok.flush();
    EXPECT_EQ(streamed, expected);
  }
}

TEST_F(Stories, ByteFallbackAndStreaming) {
  // "中" is not in this 512-token vocab: it falls back to its 3 UTF-8 bytes.
  const auto ids = tok().encode("\xE4\xB8\xAD", false, false);
  ASSERT_EQ(ids.size(), 4u);  // "▁", <0xE4>, <0xB8>, <0xAD>
  EXPECT_EQ(tok().token_text(ids[0]), "\xE2\x96\x81");
  EXPECT_EQ(tok().token_text(ids[1]), "<0xE4>");
  EXPECT_EQ(tok().token_text(ids[2]), "<0xB8>");
  EXPECT_EQ(tok().token_text(ids[3]), "<0xAD>");
  EXPECT_EQ(tok().token_to_piece(ids[1]), "\xE4");
  StreamingDetokenizer detok(tok());
  EXPECT_EQ(detok.push(ids[0]), " ");
  EXPECT_EQ(detok.push(ids[1]), "");  // partial character: held back
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.push(ids[3]), "\xE4\xB8\xAD");
  EXPECT_EQ(detok.flush(), "");
  // An unfinished sequence at the end: flush turns it into one U+FFFD.
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  // A lead byte followed by a non-continuation: U+FFFD at once, then the rest.
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(403), "\xEF\xBF\xBD Once");
  // A stray continuation byte can never become valid: not held back.
  EXPECT_EQ(detok.push(ids[3]), "\xEF\xBF\xBD");
}

TEST_F(Stories, StreamingDropsSpaceOnlyAfterLeadingBos) {
  StreamingDetokenizer with_bos(tok());
  std::string a;
  for (TokenId id : {1, 403, 407}) a += with_bos.push(id);
  EXPECT_EQ(a, "Once upon");
  StreamingDetokenizer without(tok());
  std::string b;
  for (TokenId id : {403, 407}) b += without.push(id);
  EXPECT_EQ(b, " Once upon");
}

TEST_F(Stories, ControlTokensRenderOnlyOnRequest) {
  EXPECT_EQ(tok().token_to_piece(1), "");
  EXPECT_EQ(tok().token_to_piece(1, true), "<s>");
  EXPECT_EQ(tok().token_to_piece(0, true), "<unk>");
  EXPECT_EQ(tok().token_to_piece(-1), "");
  EXPECT_EQ(tok().token_to_piece(512), "");
  EXPECT_EQ(tok().token_text(512), "");
  // parse_special: "</s>" in text becomes the EOS token only when asked.
  const auto parsed = tok().encode("a</s>", false, true);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed.back(), 2);
  const auto plain = tok().encode("a</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
}

}  // namespace
}  // namespace serval
