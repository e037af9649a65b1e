// The reference vectors of ../shared/tokenizer-vectors: every text of each
// `.inp` file must encode (no BOS/EOS, parse_special = false) to the ids on the
// matching line of its `.out` file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_helpers.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<TokenId>> read_outputs(const fs::path& p) {
  std::vector<std::vector<TokenId>> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<TokenId> ids;
    std::istringstream ls(line);
    long long x = 0;
    while (ls >> x) ids.push_back(static_cast<TokenId>(x));
    out.push_back(std::move(ids));
  }
  return out;
}

std::string ids_to_string(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

std::vector<std::string> vocab_files() {
  std::vector<std::string> names;
  const fs::path dir = test::shared_path("tokenizer-vectors");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".gguf") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class VocabVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, EncodesReferenceTexts) {
  const fs::path gguf_path = fs::path(test::shared_path("tokenizer-vectors")) / GetParam();
  auto file = gguf::GgufFile::open(gguf_path.string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto tok = Tokenizer::from_gguf(file.value());
  if (!tok.ok() && tok.status().code() == StatusCode::unsupported) {
    GTEST_SKIP() << GetParam() << ": " << tok.status().message();
  }
  ASSERT_TRUE(tok.ok()) << tok.status().message();

  const fs::path inp = gguf_path.string() + ".inp";
  const fs::path outp = gguf_path.string() + ".out";
  if (!fs::exists(inp) || !fs::exists(outp)) {
    // No reference texts: loading is the test; check a round trip instead.
    const std::string text = "Hello world, this is a test.";
    const auto ids = tok->encode(text, false, false);
    EXPECT_FALSE(ids.empty());
    for (TokenId id : ids) EXPECT_TRUE(id >= 0 && id < tok->n_vocab());
    return;
  }
  const auto texts = test::read_vocab_inputs(inp.string());
  const auto expected = read_outputs(outp);
  ASSERT_EQ(texts.size(), expected.size()) << "line count of " << outp;
  ASSERT_FALSE(texts.empty());
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tok->encode(texts[i], /*add_special=*/false, /*parse_special=*/false);
    if (ids != expected[i]) {
      ++failures;
      ADD_FAILURE() << GetParam() << " case " << i << " text '" << texts[i] << "'\n  expected: "
                    << ids_to_string(expected[i]) << "\n  actual:   " << ids_to_string(ids);
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of " << texts.size() << " texts differ";
}

INSTANTIATE_TEST_SUITE_P(TokenizerVectors, VocabVectors, ::testing::ValuesIn(vocab_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

TEST(TokenizerVectorsData, AllPresent) {
  // Guards against silently testing nothing when the shared folder moves.
  EXPECT_GE(vocab_files().size(), 12u);
}

}  // namespace
}  // namespace serval
