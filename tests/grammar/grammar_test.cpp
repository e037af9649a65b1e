// Grammar engine: GBNF / JSON Schema / regex / choice compilers, the matcher,
// the token mask (against a slow per-token reference) and the abuse budgets.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/token_trie_for.h"
#include "sampler/grammar/json_schema_internal.h"
#include "gguf/gguf_reader.h"
#include "sampler/grammar/grammar.h"
#include "sampler/grammar/grammar_cache.h"
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
  expect_fast_error([&] { return compile_json_schema(R"({"$ref": "#"})"); }, "refers to itself in place");
  expect_fast_error([&] { return compile_json_schema(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})"); },
                    "refers to itself in place");
  expect_fast_error([&] { return compile_json_schema(R"({"type": "array", "minItems": 100000})"); }, "'minItems'");
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
  expect_fast_error([&] { return compile_json_schema(R"({"type": "integer", "minimun": 3})"); }, "keyword 'minimun'");
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
  EXPECT_TRUE(matches(*open, R"({"a": 1.5, "xy": true, "yz": false})"));
  EXPECT_TRUE(matches(*open, R"({"xy": true})"));
  EXPECT_FALSE(matches(*open, R"({"xy": 1})"));
  // Undeclared keys are generated longer than every declared one, so never
  // a declared key again with the wrong type.
  EXPECT_FALSE(matches(*open, R"({"a": true})"));

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

// An independent recognizer for the mask checks: Earley over the compiled
// rules, code point by code point (no stacks, no trie, no UTF-8 state).
class Earley {
 public:
  explicit Earley(const CompiledGrammar& g) : g_(g), chart_(1) {
    for (uint32_t a : g_.rule_alts[g_.root]) chart_[0].insert({g_.root, a, 0});
    closure(0);
  }
  // Feeds one code point; false if no parse continues.
  bool feed(uint32_t cp) {
    const size_t i = chart_.size() - 1;
    std::set<Item> next;
    for (const Item& it : chart_[i]) {
      const GrammarElem& e = g_.elems[it.dot];
      if (e.kind == GrammarElem::term && g_.classes[e.value].contains(cp)) next.insert({it.rule, it.dot + 1, it.origin});
    }
    chart_.push_back(std::move(next));
    closure(i + 1);
    return !chart_.back().empty();
  }
  bool accepts() const {
    for (const Item& it : chart_.back())
      if (it.rule == g_.root && it.origin == 0 && g_.elems[it.dot].kind == GrammarElem::end) return true;
    return false;
  }

 private:
  struct Item {
    uint32_t rule, dot, origin;
    auto operator<=>(const Item&) const = default;
  };
  void closure(size_t i) {
    for (size_t before = SIZE_MAX; before != chart_[i].size();) {
      before = chart_[i].size();
      std::vector<Item> items(chart_[i].begin(), chart_[i].end());
      for (const Item& it : items) {
        const GrammarElem& e = g_.elems[it.dot];
        if (e.kind == GrammarElem::ref) {
          for (uint32_t a : g_.rule_alts[e.value]) chart_[i].insert({e.value, a, (uint32_t)i});
        } else if (e.kind == GrammarElem::end) {
          std::vector<Item> waiting(chart_[it.origin].begin(), chart_[it.origin].end());
          for (const Item& w : waiting) {
            const GrammarElem& we = g_.elems[w.dot];
            if (we.kind == GrammarElem::ref && we.value == it.rule) chart_[i].insert({w.rule, w.dot + 1, w.origin});
          }
        }
      }
    }
  }
  const CompiledGrammar& g_;
  std::vector<std::set<Item>> chart_;
};

// Code points of complete UTF-8 text; false if it is not complete and valid.
bool utf8_decode(std::string_view s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = (unsigned char)s[i];
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + (size_t)n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
    }
    out.push_back(cp);
    i += (size_t)n;
  }
  return true;
}

// Random walk; at each step every token whose piece is complete UTF-8 must be
// allowed iff Earley can continue with its code points, and EOS iff Earley accepts.
void earley_walk_check(const GrammarPtr& g, const std::shared_ptr<const TokenTrie>& trie, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(g, trie);
  Earley ref(*g);
  std::vector<uint64_t> bits;
  std::vector<uint32_t> cps;
  for (int step = 0; step < steps; ++step) {
    m.fill_mask(bits);
    std::vector<TokenId> allowed;
    for (TokenId t = 0; t < trie->n_vocab(); ++t) {
      if (bit(bits, t)) allowed.push_back(t);
      if (trie->is_eog(t)) {
        ASSERT_EQ(bit(bits, t), ref.accepts()) << "EOS at step " << step;
        continue;
      }
      if (trie->piece(t).empty() || !utf8_decode(trie->piece(t), cps)) continue;
      Earley e = ref;
      bool ok = true;
      for (uint32_t cp : cps) ok = ok && e.feed(cp);
      ASSERT_EQ(bit(bits, t), ok) << "token '" << trie->piece(t) << "' at step " << step;
    }
    // Continue with a random allowed token that keeps the text complete UTF-8.
    std::shuffle(allowed.begin(), allowed.end(), rng);
    TokenId pick = -1;
    for (TokenId t : allowed)
      if (trie->is_eog(t) || utf8_decode(trie->piece(t), cps)) { pick = t; break; }
    ASSERT_GE(pick, 0);
    if (trie->is_eog(pick)) break;
    ASSERT_TRUE(m.accept_token(pick));
    utf8_decode(trie->piece(pick), cps);
    for (uint32_t cp : cps) ASSERT_TRUE(ref.feed(cp));
  }
}

TEST(Mask, AgreesWithEarleyReference) {
  auto trie = small_trie();
  for (const char* f : {"json.gbnf", "arithmetic.gbnf", "chess.gbnf", "list.gbnf", "japanese.gbnf", "c.gbnf"}) {
    SCOPED_TRACE(f);
    GrammarPtr g = gbnf(read(kShared / "grammars" / f));
    for (uint64_t seed = 1; seed <= 3; ++seed) earley_walk_check(g, trie, 25, seed);
  }
  auto schema = compile_json_schema(R"({"type":"object","properties":{"a":{"type":"array","items":{"enum":["x",1]},"maxItems":3},"b":{"type":"string","maxLength":4}},"required":["b"]})");
  ASSERT_TRUE(schema.ok());
  for (uint64_t seed = 1; seed <= 5; ++seed) earley_walk_check(*schema, trie, 40, seed);
}

TEST(Mask, RejectsOverlongAndSurrogateUtf8) {
  GrammarMatcher m(gbnf("root ::= [^a]*\n"), small_trie());
  EXPECT_FALSE(m.accept_bytes("\xE0\x81\xBB"));  // overlong '{'
  EXPECT_FALSE(m.accept_bytes("\xC1\xBF"));
  EXPECT_FALSE(m.accept_bytes("\xED\xA0\x80"));  // U+D800
  // A prefix no continuation can make valid is refused at once, so the mask
  // never leads into a dead end (byte tokens of a 32k vocabulary).
  EXPECT_FALSE(m.accept_bytes("\xED\xA0"));
  EXPECT_TRUE(m.accept_bytes("\xED\x9F"));   // U+D7C0..U+D7FF: still fine
  EXPECT_TRUE(m.accept_bytes("\xBF"));
  EXPECT_TRUE(m.accept_bytes("\xC3\xA9\xE6\x97\xA5"));
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

TEST(GrammarCache, BoundedLruThatAlsoKeepsErrors) {
  GrammarCache cache(3);
  int compiles = 0;
  auto get = [&](const std::string& text) {
    return cache.get(text, [&] {
      ++compiles;
      return compile_gbnf(text);
    });
  };
  auto a = get("root ::= \"a\"\n");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(get("root ::= \"a\"\n")->get(), a->get());  // same compiled object
  EXPECT_EQ(compiles, 1);
  EXPECT_FALSE(get("root ::= root\n").ok());
  EXPECT_FALSE(get("root ::= root\n").ok());
  EXPECT_EQ(compiles, 2);  // the error is cached too
  get("root ::= \"b\"\n");
  get("root ::= \"c\"\n");
  EXPECT_EQ(cache.size(), 3u);
  get("root ::= \"a\"\n");  // evicted as least recently used: compiled again
  EXPECT_EQ(compiles, 5);
  EXPECT_EQ(cache.hits(), 2u);
}

// A budget-aware walk: with `budget` tokens, picking any allowed token at
// random (the worst a sampler can do), the output must end with
// end-of-generation inside the budget, and what was accepted must be a
// complete sentence of the grammar.
void budget_walk_check(const GrammarPtr& g, const std::shared_ptr<const TokenTrie>& trie, int budget, uint64_t seed) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(g, trie);
  std::vector<uint64_t> bits;
  std::string text;
  if ((int)m.min_remaining() + 1 > budget) return;  // no complete output fits at all
  for (int left = budget; left > 0; --left) {
    m.fill_mask(bits, left);
    std::vector<TokenId> allowed;
    for (TokenId t = 0; t < trie->n_vocab(); ++t)
      if (bit(bits, t)) allowed.push_back(t);
    ASSERT_FALSE(allowed.empty());
    const TokenId t = allowed[rng() % allowed.size()];
    if (trie->is_eog(t)) {
      ASSERT_TRUE(m.accept_token(t));
      return;
    }
    ASSERT_TRUE(m.accept_token(t)) << "token " << t;
    text += trie->piece(t);
  }
  FAIL() << "budget " << budget << " seed " << seed << ": no end of generation; output " << text
         << " (shortest completion " << m.min_remaining() << ")";
}

// A large, ordinary schema (60 properties, each a string, null or an array
// of small objects; a oneOf on top) stays inside the grammar budgets: shared
// shapes are one rule, unbounded repetitions stay open-ended.
TEST(JsonSchema, LargeOrdinarySchemaFitsTheBudgets) {
  nlohmann::json props = nlohmann::json::object(), required = nlohmann::json::array();
  for (int i = 0; i < 60; ++i) {
    const std::string k = "field_" + std::to_string(i);
    props[k] = {{"anyOf", {{{"type", "string"}, {"maxLength", 20}},
                           {{"type", "null"}},
                           {{"type", "array"},
                            {"items", {{"type", "object"},
                                       {"properties", {{"a", {{"type", "integer"}, {"minimum", 0}, {"maximum", 100}}},
                                                       {"b", {{"enum", {"x", "y", "z"}}}}}},
                                       {"required", {"a"}},
                                       {"additionalProperties", false}}}}}}};
    if (i % 3 == 0) required.push_back(k);
  }
  const nlohmann::json schema = {{"type", "object"}, {"properties", props}, {"required", required},
                                 {"additionalProperties", false},
                                 {"oneOf", {{{"properties", {{"field_0", {{"type", "string"}}}}}},
                                            {{"properties", {{"field_0", {{"type", "null"}}}}}}}}};
  auto g = compile_json_schema(schema.dump());
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_LT((*g)->rule_alts.size(), 5000u);
}

// The digit-range grammar behind minimum/maximum, against counting: every
// integer in a window around the range matches iff it lies in the range.
TEST(JsonSchema, IntegerRangesAreExact) {
  std::mt19937_64 rng(5);
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 0}, {0, 9}, {1, 10}, {-10, -1}, {-5, 5}, {7, 1234}, {-999, 99},
                                                     {100, 199}, {-1000, -1000}, {19, 21}, {99, 101}, {0, 999999}};
  for (int i = 0; i < 40; ++i) {
    const int64_t a = (int64_t)(rng() % 200000) - 100000, b = a + (int64_t)(rng() % 3000);
    ranges.push_back({a, b});
  }
  for (auto [lo, hi] : ranges) {
    GrammarPtr g = gbnf("root ::= " + json_schema::int_range_gbnf(lo, hi) + "\n");
    ASSERT_TRUE(g) << lo << " " << hi;
    const int64_t from = lo - 120, to = std::min(hi, lo + 2500) + 120;
    for (int64_t x = from; x <= to; ++x)
      ASSERT_EQ(matches(g, std::to_string(x)), x >= lo && x <= hi) << "[" << lo << ", " << hi << "] " << x;
    if (hi - lo > 2500) {
      for (int64_t x = hi - 120; x <= hi + 120; ++x) ASSERT_EQ(matches(g, std::to_string(x)), x <= hi) << x;
    }
    EXPECT_FALSE(matches(g, "-0"));
    EXPECT_FALSE(matches(g, "0" + std::to_string(std::max<int64_t>(lo, 1))));  // no leading zeros
  }
}

TEST(Mask, BudgetCountsTheBytesOfAPartialCharacter) {
  auto trie = small_trie();
  auto g = compile_json_schema(R"({"type":"string"})");
  ASSERT_TRUE(g.ok());
  auto id = [&](const std::string& piece) {
    for (TokenId t = 0; t < trie->n_vocab(); ++t)
      if (trie->piece(t) == piece) return t;
    return (TokenId)-1;
  };
  GrammarMatcher m(*g, trie);
  ASSERT_TRUE(m.accept_bytes("\""));
  std::vector<uint64_t> bits;
  // 4 tokens left: "\xE6\x97" then "\xA5", the closing quote and the end: fits.
  m.fill_mask(bits, 4);
  EXPECT_TRUE(bit(bits, id("\xE6\x97")));
  // 3 left: the character would need its last byte, the quote and the end.
  m.fill_mask(bits, 3);
  EXPECT_FALSE(bit(bits, id("\xE6\x97")));
  EXPECT_FALSE(bit(bits, id("\xC3")));
  EXPECT_TRUE(bit(bits, id("a")));
  EXPECT_TRUE(bit(bits, id("\xC3\xA9")));  // é whole: one token
  // 2 left: only the closing quote (then the end).
  m.fill_mask(bits, 2);
  EXPECT_FALSE(bit(bits, id("a")));
  EXPECT_TRUE(bit(bits, id("\"")));
  EXPECT_FALSE(bit(bits, 0));
}

TEST(Mask, BudgetEndsEveryOutputComplete) {
  auto small = small_trie();
  Tokenizer tok = load_tokenizer("ggml-vocab-llama-spm.gguf");
  auto big = token_trie_for(tok);
  for (const char* schema : {R"({})", R"({"exclusiveMinimum": 1.1})", R"({"anyOf": [true, true]})",
                             R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"string"}}},"required":["a"]})"}) {
    auto g = compile_json_schema(schema);
    ASSERT_TRUE(g.ok()) << g.status().message();
    for (int budget : {4, 12, 40})
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        budget_walk_check(*g, small, budget, seed);
        budget_walk_check(*g, big, budget, seed);
      }
  }
}

}  // namespace
}  // namespace serval
