// Properties that must hold for every reference vocabulary on the reference
// texts: lossless round trips, streaming == decode, concurrent use, and
// bounded time on large inputs.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "test_helpers.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace serval {
namespace {

namespace fs = std::filesystem;

struct VocabCase {
  Tokenizer tok;
  std::vector<std::string> texts;
};

// Loaded once per process; read-only afterwards.
const VocabCase& vocab_case(const std::string& name) {
  static std::map<std::string, VocabCase> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::string path = test::shared_path("tokenizer-vectors/" + name);
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) throw std::runtime_error(f.status().message());
  auto t = Tokenizer::from_gguf(f.value());
  if (!t.ok()) throw std::runtime_error(t.status().message());
  VocabCase c{std::move(t.value()), test::read_vocab_inputs(path + ".inp")};
  return cache.emplace(name, std::move(c)).first->second;
}

std::vector<std::string> vocabs_with_texts() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(test::shared_path("tokenizer-vectors"), ec)) {
    if (e.path().extension() == ".inp") names.push_back(e.path().stem().string());  // "x.gguf"
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

class VocabProperties : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabProperties, DecodeInvertsEncode) {
  const VocabCase& c = vocab_case(GetParam());
  for (const std::string& text : c.texts) {
    const auto ids = c.tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
    const std::string decoded = c.tok.decode(ids);
    switch (c.tok.type()) {
      case VocabType::spm:  // lossless: space prefix removed after BOS, bytes restored
      case VocabType::bpe: {  // lossless up to HF's space clean-up
        std::string expected = text;
        if (c.tok.vocab().clean_spaces) clean_up_spaces(expected);
        EXPECT_EQ(decoded, expected) << "text: '" << text << "'";
        // Without BOS: decoded as a whole text, the space prefix goes too; as a
        // continuation it stays.
        const auto bare = c.tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
        EXPECT_EQ(c.tok.decode(bare, false, /*whole_text=*/true), expected) << "text: '" << text << "'";
        if (c.tok.vocab().add_space_prefix && !text.empty()) {
          EXPECT_EQ(c.tok.decode(bare), " " + expected) << "text: '" << text << "'";
        }
        break;
      }
      case VocabType::wpm: {
        // Lossy (lowercase, no accents, [UNK]), but the rendered text encodes
        // back to the same ids, [CLS]/[SEP]/[UNK] included.
        const std::string rendered = c.tok.decode(ids, /*render_special=*/true);
        const auto again = c.tok.encode(rendered, /*add_special=*/false, /*parse_special=*/true);
        EXPECT_EQ(again, ids) << "text: '" << text << "' rendered: '" << rendered << "'";
        break;
      }
    }
  }
}

TEST_P(VocabProperties, StreamingMatchesDecode) {
  const VocabCase& c = vocab_case(GetParam());
  for (const std::string& text : c.texts) {
    const auto ids = c.tok.encode(text, true, false);
    StreamingDetokenizer detok(c.tok);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string part = detok.push(id);
      EXPECT_EQ(unicode::sanitize_utf8(part), part) << "push returned invalid UTF-8 for '" << text << "'";
      streamed += part;
    }
    streamed += detok.flush();
    // Streams skip the clean-up (it needs look-ahead); decode applies it.
    if (c.tok.vocab().clean_spaces) clean_up_spaces(streamed);
    EXPECT_EQ(streamed, c.tok.decode(ids)) << "text: '" << text << "'";
  }
}

TEST_P(VocabProperties, ConcurrentEncodeIsDeterministic) {
  const VocabCase& c = vocab_case(GetParam());
  std::vector<std::vector<TokenId>> serial;
  for (const std::string& t : c.texts) serial.push_back(c.tok.encode(t, true, true));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = 0; i < c.texts.size(); ++i) {
          if (c.tok.encode(c.texts[i], true, true) != serial[i]) ++mismatches[k];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(mismatches[k], 0) << "thread " << k;
}

TEST_P(VocabProperties, LargeInputsTakeLinearishTime) {
  const VocabCase& c = vocab_case(GetParam());
  // 256 KiB of the reference texts, of spaces, and of one long word. A
  // quadratic step would need ~10^10 operations here and blow the limit.
  std::string mixed;
  while (mixed.size() < (256u << 10)) {
    for (const std::string& t : c.texts) mixed += t;
  }
  const std::vector<std::string> inputs = {mixed, std::string(256u << 10, ' ') + "x", std::string(256u << 10, 'a')};
  for (const std::string& in : inputs) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = c.tok.encode(in, true, true);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_FALSE(ids.empty());
    EXPECT_LT(secs, 20.0) << "input of " << in.size() << " bytes starting '" << in.substr(0, 20) << "'";
  }
}

TEST_P(VocabProperties, ArbitraryBytesAndIdsAreSafe) {
  const VocabCase& c = vocab_case(GetParam());
  std::mt19937 rng(1234);
  // Bytes biased towards UTF-8 structure, '<' and spaces, so that broken
  // sequences and special-token look-alikes both occur.
  const std::string alphabet = "<>|/ \n\tab\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\x80\xBF\xFF\xC0";
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 200);
    for (int i = 0; i < len; ++i) {
      text += (rng() % 3 == 0) ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    }
    for (bool parse_special : {false, true}) {
      const auto ids = c.tok.encode(text, true, parse_special);
      for (TokenId id : ids) ASSERT_TRUE(id >= 0 && id < c.tok.n_vocab()) << id;
      StreamingDetokenizer detok(c.tok);
      std::string streamed;
      for (TokenId id : ids) streamed += detok.push(id);
      streamed += detok.flush();
      EXPECT_EQ(unicode::sanitize_utf8(streamed), streamed);
    }
    // Random ids, invalid ones included, decode without trouble.
    std::vector<TokenId> ids;
    for (int i = 0; i < 20; ++i) ids.push_back(static_cast<TokenId>(rng() % (c.tok.n_vocab() + 10)) - 5);
    const std::string all = c.tok.decode(ids, true);
    std::string valid_only;
    for (TokenId id : ids) valid_only += c.tok.token_to_piece(id, true);
    if (!c.tok.vocab().clean_spaces) {
      EXPECT_EQ(all, valid_only);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TokenizerVectors, VocabProperties, ::testing::ValuesIn(vocabs_with_texts()), param_name);

}  // namespace
}  // namespace serval
