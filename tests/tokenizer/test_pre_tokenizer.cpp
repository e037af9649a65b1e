// Regex pre-tokenizers: the word splits of the HF tokenizer.json regexes on
// hand-checked examples.
#include <gtest/gtest.h>

#include "tokenizer/pre_tokenizer.h"

namespace serval {
namespace {

using Words = std::vector<std::string>;

Words split(const char* pre, const std::string& text) {
  auto spec = lookup_pre_tokenizer(pre);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  auto p = PreTokenizer::create(spec->regexes);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p->split(text);
}

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(split("gpt-2", "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("gpt-2", "  Hello"), (Words{" ", " Hello"}));
  EXPECT_EQ(split("gpt-2", "I'm here's 42!!"), (Words{"I", "'m", " here", "'s", " 42", "!!"}));
  EXPECT_EQ(split("gpt-2", "a \n\nb"), (Words{"a", " \n", "\n", "b"}));
  EXPECT_EQ(split("gpt-2", "end   "), (Words{"end", "   "}));
  EXPECT_EQ(split("gpt-2", ""), Words{});
  // Non-ASCII categories: letters, digits and whitespace outside ASCII.
  EXPECT_EQ(split("gpt-2", "caf\xC3\xA9 \xD9\xA1\xD9\xA2"), (Words{"caf\xC3\xA9", " \xD9\xA1\xD9\xA2"}));
  EXPECT_EQ(split("gpt-2", "a\xE3\x80\x80" "b"), (Words{"a", "\xE3\x80\x80", "b"}));  // U+3000 is \s
}

TEST(PreTokenizer, Llama3) {
  EXPECT_EQ(split("llama-bpe", "12345"), (Words{"123", "45"}));
  EXPECT_EQ(split("llama-bpe", "I'VE seen"), (Words{"I", "'VE", " seen"}));
  EXPECT_EQ(split("llama-bpe", "x\r\n\r\ny"), (Words{"x", "\r\n\r\n", "y"}));
  EXPECT_EQ(split("llama-bpe", "(hello"), (Words{"(hello"}));
  EXPECT_EQ(split("llama-bpe", "  a"), (Words{" ", " a"}));
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(split("qwen2", "x123"), (Words{"x", "1", "2", "3"}));
}

TEST(PreTokenizer, RegexesApplyInSequence) {
  // starcoder: digits first, then the GPT-2 regex inside the rest.
  EXPECT_EQ(split("starcoder", "ab12 cd"), (Words{"ab", "1", "2", " cd"}));
  // falcon: punctuation runs first, then GPT-2, then groups of 3 digits.
  EXPECT_EQ(split("falcon", "hi!? 1234567"), (Words{"hi", "!?", " ", "123", "456", "7"}));
}

TEST(PreTokenizer, DeepseekLlm) {
  EXPECT_EQ(split("deepseek-llm", "Hello\nworld"), (Words{"Hello", "\n", "world"}));
  EXPECT_EQ(split("deepseek-llm", "ab  "), (Words{"ab", "  "}));
  EXPECT_EQ(split("deepseek-llm", "\xE4\xB8\xAD\xE6\x96\x87" "abc"), (Words{"\xE4\xB8\xAD\xE6\x96\x87", "abc"}));
  // Its letter class has U+212A KELVIN SIGN and U+1F7D (not their canonical
  // equivalents K and U+03CE, which a normalising editor would substitute);
  // U+00D7 (multiplication sign) is not a letter.
  const auto spec = lookup_pre_tokenizer("deepseek-llm");
  auto letters = PreTokenizer::create({spec->regexes[1]});
  ASSERT_TRUE(letters.ok());
  EXPECT_EQ(letters->split("a\xE2\x84\xAA\xE1\xBD\xBD\xC3\x97"), (Words{"a\xE2\x84\xAA\xE1\xBD\xBD", "\xC3\x97"}));
  // The CJK regex that follows covers U+0800..U+4E00, Kelvin sign included.
  EXPECT_EQ(split("deepseek-llm", "a\xE2\x84\xAA"), (Words{"a", "\xE2\x84\xAA"}));
}

TEST(PreTokenizer, EmptyMatchesCut) {
  // superbpe cuts digit runs into groups of three from the right.
  EXPECT_EQ(split("superbpe", "1234567"), (Words{"1", "234", "567"}));
  EXPECT_EQ(split("superbpe", "123"), (Words{"123"}));
}

TEST(PreTokenizer, MalformedUtf8BecomesReplacementChar) {
  EXPECT_EQ(split("gpt-2", "a\xFF" "b"), (Words{"a", "\xEF\xBF\xBD", "b"}));
}

TEST(PreTokenizer, LongInputsStayLinear) {
  // A million-character word and a long run of spaces (the deepseek "\s+$"
  // regex backtracks quadratically unless possessive).
  const std::string letters(1 << 20, 'a');
  EXPECT_EQ(split("gpt-2", letters).size(), 1u);
  const std::string spaces = std::string(1 << 18, ' ') + "x";
  const Words w = split("deepseek-llm", spaces);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1], " x");
}

TEST(PreTokenizer, Names) {
  EXPECT_TRUE(lookup_pre_tokenizer("").ok());  // absent: default
  EXPECT_EQ(lookup_pre_tokenizer("").value().regexes.size(), 4u);
  EXPECT_TRUE(lookup_pre_tokenizer("llama-bpe")->ignore_merges);
  EXPECT_FALSE(lookup_pre_tokenizer("qwen2")->clean_spaces);
  EXPECT_EQ(lookup_pre_tokenizer("kimi-k2").status().code(), StatusCode::unsupported);
  EXPECT_EQ(lookup_pre_tokenizer("bogus").status().code(), StatusCode::unsupported);
}

TEST(PreTokenizer, RegexTranslation) {
  bool collapsed = false;
  auto t = translate_regex("\\p{L}+", collapsed);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(collapsed);
  EXPECT_EQ(t.value().substr(0, 8), "[\\x{D2}\\");
  auto raw = translate_regex("[\xE4\xB8\x80-\xE9\xBE\xA5]+", collapsed);  // [一-龥]+
  ASSERT_TRUE(raw.ok());
  EXPECT_FALSE(collapsed);
  EXPECT_EQ(raw.value(), "[\\x{4E00}-\\x{9FA5}]+");
  EXPECT_EQ(translate_regex("\\p{Lu}", collapsed).status().code(), StatusCode::unsupported);
  EXPECT_EQ(translate_regex("\\p{L}\xE4\xB8\x80", collapsed).status().code(), StatusCode::invalid_argument);
  EXPECT_FALSE(PreTokenizer::create({"(unclosed"}).ok());
}

}  // namespace
}  // namespace serval
