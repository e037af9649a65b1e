// Grammar engine: GBNF / JSON Schema / regex / choice compilers, the matcher,
// the token mask (against a slow per-token reference) and the abuse budgets.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/token_trie_for.h"
#include "gguf/gguf_reader.h"
#include "sampler/grammar/grammar.h"
#include "sampler/grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

namespace fs = std::filesystem;
const fs::path kShared = SERVAL_SHARED_DIR;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A tiny vocabulary: every printable ASCII byte, some multi-byte pieces and
// UTF-8 fragments, and an EOS at id 0.
std::shared_ptr<const TokenTrie> small_trie() {
  std::vector<std::string> pieces{""};  // 0: eos
  for (int c = 32; c < 127; ++c) pieces.push_back(std::string(1, (char)c));
  for (const char* p : {"\n", "\t", "true", "false", "null", "\"a", "\":", "{\"", "\"}", "12", "  ", "é", "\xC3", "\xA9",
                        "日本", "\xE6\x97", "\xA5", "ab", "abc", "[1,", "},{"})
    pieces.push_back(p);
  return std::make_shared<TokenTrie>(pieces, std::vector<TokenId>{0});
}

Tokenizer load_tokenizer(const char* file) {
  auto f = gguf::GgufFile::open((kShared / "tokenizer-vectors" / file).string());
  EXPECT_TRUE(f.ok()) << f.status().message();
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t.value());
}

GrammarPtr gbnf(const std::string& text) {
  auto g = compile_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << text;
  return g.ok() ? *g : nullptr;
}

// Whole-string membership: accepted bytes and may end there.
bool matches(const GrammarPtr& g, std::string_view s) {
  GrammarMatcher m(g, small_trie());
  return m.accept_bytes(s) && m.can_end();
}

bool bit(const std::vector<uint64_t>& b, TokenId t) { return (b[(size_t)t >> 6] >> (t & 63)) & 1; }

// The slow reference: a token is allowed iff a copy of the matcher accepts
// its bytes one by one (EOS iff the grammar may end).
void expect_mask_matches_reference(GrammarMatcher& m, const TokenTrie& trie) {
  std::vector<uint64_t> bits;
  m.fill_mask(bits);
  bool any = false;
  for (TokenId t = 0; t < trie.n_vocab(); ++t) {
    GrammarMatcher copy = m;
    const bool ref = trie.is_eog(t) ? m.can_end() : (!trie.piece(t).empty() && copy.accept_bytes(trie.piece(t)));
    any |= ref;
    ASSERT_EQ(bit(bits, t), ref) << "token " << t << " '" << trie.piece(t) << "'";
  }
  EXPECT_TRUE(any);
}

TEST(Gbnf, EverySharedGrammarCompiles) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kShared / "grammars")) {
    if (e.path().extension() != ".gbnf") continue;
    auto g = compile_gbnf(read(e.path()));
    EXPECT_TRUE(g.ok()) << e.path() << ": " << g.status().message();
    ++n;
  }
  EXPECT_GE(n, 8);
}

TEST(Gbnf, SharedGrammarsAcceptAndReject) {
  struct Case {
    const char* file;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"arithmetic.gbnf", {"1+2=3\n", "(x*4)-5= 2\ny=1\n"}, {"1+2", "1+=2\n", "((1)=1\n"}},
      {"json.gbnf", {"{}", "{\"a\": [1, 2.5e3, true, null, \"x\\n\"]}", "{\"k\":{\"n\":-0}}"}, {"[]", "{\"a\":}", "{'a':1}"}},
      {"json_arr.gbnf", {"[\n]", "[\n{\"a\": 1},\n2]"}, {"{}", "[1,2]", "[\n1,\n]"}},
      {"list.gbnf", {"- a\n", "- item one\n- item two\n"}, {"a\n", "-a"}},
      {"chess.gbnf", {"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. O-O-O Qxd8+\n"}, {"1. e4 e5\n", "1. z9 e5\n2. a1 a2\n"}},
      {"japanese.gbnf", {"日本"}, {"abc"}},
      {"english.gbnf", {"hello world"}, {"日本"}},
      {"c.gbnf", {"int main(){return 0;}"}, {"int main("}},
  };
  for (const Case& c : cases) {
    GrammarPtr g = gbnf(read(kShared / "grammars" / c.file));
    ASSERT_TRUE(g);
    for (const auto& s : c.yes) EXPECT_TRUE(matches(g, s)) << c.file << ": " << s;
    for (const auto& s : c.no) EXPECT_FALSE(matches(g, s)) << c.file << ": " << s;
  }
}

TEST(Gbnf, Syntax) {
  GrammarPtr g = gbnf(R"(# comment
root ::= ( "a" | [x-z] )+ tail   # trailing comment
tail ::=
  "!"{2,3} |
  [^a-z\n]? "\x41\u00e9"
)");
  EXPECT_TRUE(matches(g, "ax!!"));
  EXPECT_TRUE(matches(g, "zz!!!"));
  EXPECT_FALSE(matches(g, "a!!!!"));
  EXPECT_TRUE(matches(g, "a0Aé"));
  EXPECT_TRUE(matches(g, "aAé"));
  EXPECT_FALSE(matches(g, "abAé"));
  GrammarPtr rep = gbnf("root ::= [0-9]{3} \"-\"? [a]{2,} .\n");
  EXPECT_TRUE(matches(rep, "123aa日"));
  EXPECT_TRUE(matches(rep, "123-aaaaa."));
  EXPECT_FALSE(matches(rep, "12aa."));
  EXPECT_FALSE(matches(rep, "123a."));
}

TEST(Gbnf, ErrorsNameTheProblem) {
  struct Case {
    std::string text, needle;
  };
  const std::vector<Case> cases = {
      {"root ::= foo\n", "'foo' is used but not defined"},
      {"rot ::= \"a\"\n", "no 'root' rule"},
      {"root ::= \"a\n", "unterminated string"},
      {"root ::= [ab\n", "unterminated character class"},
      {"root ::= (\"a\"\n", "expected ')'"},
      {"root ::= root \"a\" | \"b\"\n", "'root' is left-recursive"},
      {"root ::= x\nx ::= y? root\ny ::= \"a\"\n", "left-recursive"},
      {"root ::= *\n", "without a preceding item"},
      {"root ::= \"a\"{5,2}\n", "n < m"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
      {"root ::= \"\\q\"\n", "unknown escape"},
      {"root ::= [z-a]\n", "reversed"},
  };
  for (const Case& c : cases) {
    auto g = compile_gbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_NE(g.status().message().find(c.needle), std::string::npos) << g.status().message();
  }
}

template <typename F>
void expect_fast_error(F&& compile, const std::string& needle) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = compile();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_LT(ms, 2000.0) << needle;
}

TEST(Budgets, AbuseFailsFast) {
  const std::string deep = "root ::= " + std::string(60000, '(') + "\"a\"" + std::string(60000, ')') + "\n";
  expect_fast_error([&] { return compile_gbnf(deep); }, "nesting depth");
  expect_fast_error([&] { return compile_gbnf("root ::= \"a\"{0,1000000000}\n"); }, "repetition count");
  std::string many = "root ::=";
  for (int i = 0; i < 100; ++i) many += " \"a\"{0,1000}";
  expect_fast_error([&] { return compile_gbnf(many + "\n"); }, "exceeds the limit");
  expect_fast_error([&] { return compile_gbnf(std::string(300000, ' ') + "root ::= \"a\""); }, "source of");
  expect_fast_error([&] { return compile_gbnf("root ::= a\na ::= b \"x\"\nb ::= a\n"); }, "left-recursive");
  expect_fast_error([&] { return compile_json_schema(R"({"$ref": "#"})"); }, "left-recursive");
  expect_fast_error([&] { return compile_json_schema(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})"); },
                    "left-recursive");
  expect_fast_error([&] { return compile_json_schema(R"({"type": "array", "maxItems": 100000})"); }, "maxItems 100000");
  std::string nested;
  for (int i = 0; i < 60000; ++i) nested += R"({"type":"array","items":)";
  nested += "{}" + std::string(60000, '}');
  expect_fast_error([&] { return compile_json_schema(nested); }, "limit");
  std::string nested1k;
  for (int i = 0; i < 1000; ++i) nested1k += R"({"type":"array","items":)";
  nested1k += "{}" + std::string(1000, '}');
  expect_fast_error([&] { return compile_json_schema(nested1k); }, "nesting");
  expect_fast_error([&] { return compile_regex(std::string(60000, '(') + "a" + std::string(60000, ')')); }, "nesting");
  expect_fast_error([&] { return compile_regex("a{1,99999999}"); }, "repetition count");
  expect_fast_error([&] { return compile_regex("(a)\\1"); }, "unsupported escape");
  expect_fast_error([&] { return compile_json_schema(R"({"type": "integer", "minimum": 3})"); }, "'minimum' is not supported");
  expect_fast_error([&] { return compile_json_schema(R"({"$ref": "#/$defs/missing"})"); }, "does not resolve");
}

TEST(JsonSchema, AcceptsValidAndRejectsInvalid) {
  const char* schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 2},
      "pet": {"$ref": "#/$defs/pet"},
      "when": {"type": "string", "format": "date"},
      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"},
      "either": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}
    },
    "required": ["name", "tags"],
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]}}
  })";
  auto g = compile_json_schema(schema);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(matches(*g, R"({"name": "bob", "tags": ["a"]})"));
  EXPECT_TRUE(matches(*g, R"({"name":"","age":-12,"tags":[3,"b"],"pet":{"kind":"cat"},"when":"2024-02-29","code":"AB-12","either":null})"));
  EXPECT_TRUE(matches(*g, R"({"name":"x","tags":["a"],"either":true})"));
  EXPECT_FALSE(matches(*g, R"({"tags": ["a"]})"));                       // name required
  EXPECT_FALSE(matches(*g, R"({"name": "toolong", "tags": ["a"]})"));    // maxLength
  EXPECT_FALSE(matches(*g, R"({"name": "x", "tags": []})"));             // minItems
  EXPECT_FALSE(matches(*g, R"({"name": "x", "tags": ["a","a","a"]})"));  // maxItems
  EXPECT_FALSE(matches(*g, R"({"name": "x", "tags": ["c"]})"));          // enum
  EXPECT_FALSE(matches(*g, R"({"name": "x", "tags": ["a"], "pet": {"kind": "dog"}})"));
  EXPECT_FALSE(matches(*g, R"({"name": "x", "tags": ["a"], "code": "A-1"})"));
  EXPECT_FALSE(matches(*g, R"({"name": "x", "tags": ["a"], "extra": 1})"));  // additionalProperties absent
  EXPECT_FALSE(matches(*g, R"({"age": 1, "name": "x", "tags": ["a"]})"));  // declared order

  auto open = compile_json_schema(R"({"type":"object","properties":{"a":{"type":"number"}},"additionalProperties":{"type":"boolean"}})");
  ASSERT_TRUE(open.ok()) << open.status().message();
  EXPECT_TRUE(matches(*open, R"({})"));
  EXPECT_TRUE(matches(*open, R"({"a": 1.5e-3, "x": true, "y": false})"));
  EXPECT_TRUE(matches(*open, R"({"x": true})"));
  EXPECT_FALSE(matches(*open, R"({"x": 1})"));

  auto tree = compile_json_schema(R"({"$defs":{"node":{"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"$ref":"#/$defs/node"})");
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  EXPECT_TRUE(matches(*tree, R"({"kids":[{"kids":[{}]},{}]})"));

  auto obj = compile_json_object();
  ASSERT_TRUE(obj.ok()) << obj.status().message();
  EXPECT_TRUE(matches(*obj, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(matches(*obj, R"([1])"));
}

TEST(Regex, AcceptsItsLanguage) {
  auto g = compile_regex(R"(^(\d{3}-)?[a-c]+x*|(?:foo|ba[rz])\.\w?$)");
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const char* s : {"123-abc", "a", "ccxxx", "foo.", "baz.Z"}) EXPECT_TRUE(matches(*g, s)) << s;
  for (const char* s : {"12-a", "", "d", "bar", "baq."}) EXPECT_FALSE(matches(*g, s)) << s;
}

TEST(Choice, ExactlyOne) {
  auto g = compile_choice({"yes", "no", "maybe \"so\""});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, "yes"));
  EXPECT_TRUE(matches(*g, "maybe \"so\""));
  EXPECT_FALSE(matches(*g, "ye"));
  EXPECT_FALSE(matches(*g, "yesno"));
}

// Walks a grammar with random allowed tokens, checking every mask against the reference.
void random_walk_check(const GrammarPtr& g, std::shared_ptr<const TokenTrie> trie, int steps, uint64_t seed,
                       bool check_every_token) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(g, trie);
  std::vector<uint64_t> bits;
  for (int i = 0; i < steps; ++i) {
    if (check_every_token) expect_mask_matches_reference(m, *trie);
    m.fill_mask(bits);
    std::vector<TokenId> allowed;
    for (TokenId t = 0; t < trie->n_vocab(); ++t)
      if (bit(bits, t)) allowed.push_back(t);
    ASSERT_FALSE(allowed.empty());
    const TokenId t = allowed[rng() % allowed.size()];
    ASSERT_TRUE(m.accept_token(t));
    if (trie->is_eog(t)) break;
  }
}

TEST(Mask, SmallVocabMatchesReference) {
  auto trie = small_trie();
  for (const char* f : {"json.gbnf", "arithmetic.gbnf", "japanese.gbnf", "list.gbnf"}) {
    GrammarPtr g = gbnf(read(kShared / "grammars" / f));
    for (uint64_t seed = 1; seed <= 3; ++seed) random_walk_check(g, trie, 30, seed, true);
  }
}

TEST(Mask, LlamaVocab32kMatchesReference) {
  Tokenizer tok = load_tokenizer("ggml-vocab-llama-spm.gguf");
  ASSERT_GE(tok.n_vocab(), 32000);
  auto trie = token_trie_for(tok);
  GrammarPtr json = gbnf(read(kShared / "grammars" / "json.gbnf"));
  random_walk_check(json, trie, 6, 7, true);
  auto schema = compile_json_schema(R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"}},"required":["id","name"]})");
  ASSERT_TRUE(schema.ok());
  random_walk_check(*schema, trie, 4, 9, true);
  GrammarPtr ja = gbnf(read(kShared / "grammars" / "japanese.gbnf"));
  random_walk_check(ja, trie, 4, 11, true);
}

TEST(Mask, EosOnlyWhereTheGrammarMayEnd) {
  auto trie = small_trie();
  GrammarMatcher m(gbnf("root ::= \"ab\" \"c\"?\n"), trie);
  std::vector<uint64_t> bits;
  m.fill_mask(bits);
  EXPECT_FALSE(bit(bits, 0));
  ASSERT_TRUE(m.accept_bytes("ab"));
  m.fill_mask(bits);
  EXPECT_TRUE(bit(bits, 0));
  ASSERT_TRUE(m.accept_bytes("c"));
  m.fill_mask(bits);
  EXPECT_TRUE(bit(bits, 0));
  int n = 0;
  for (TokenId t = 0; t < trie->n_vocab(); ++t) n += bit(bits, t);
  EXPECT_EQ(n, 1);  // only EOS after "abc"
  EXPECT_FALSE(m.accept_token(5));
  EXPECT_TRUE(m.accept_token(0));
}

}  // namespace
}  // namespace serval
