// Grammars for constrained decoding: the compiled form and the compilers.
//
// Every front end (GBNF text, JSON Schema, regular expression, choice list)
// ends in compile_gbnf(): JSON Schema, regex and choice are translated to
// GBNF text first, so there is one parser, one set of checks and one runtime
// form. The GBNF dialect is llama.cpp's: `name ::= alternatives`, `|`,
// grouping `( )`, literals "..." with escapes (\n \r \t \\ \" \xHH \uHHHH
// \UHHHHHHHH), character classes [a-z] / [^...] (same escapes), `.` (any
// character), `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments to end of line.
// A rule ends at a newline unless inside parentheses or after `|`.
//
// Compiled form (CompiledGrammar): rules are lists of alternatives, each a
// sequence of elements in one flat array: `term` (one code point from a
// character class), `ref` (another rule) and `end` (the alternative is done).
// Repetitions are expanded into helper rules as llama.cpp does
// (x{2,4} -> x x x-opt, x-opt ::= x x-opt2 | ...), which is why repetition
// bounds are budgeted.
//
// Budgets (GrammarLimits) bound the input size, group nesting, repetition
// bounds, the compiled size and the compile time; every recursive step is
// depth-counted, so no input can overflow the C++ stack. Errors are
// invalid_argument (malformed, undefined rule, left recursion: the message
// names the rule and the line) or resource_exhausted (a budget: the message
// names it and the limit).
//
// Thread safety: a CompiledGrammar is immutable once built and is shared
// (std::shared_ptr<const CompiledGrammar>) by every sequence that uses it;
// per-sequence state lives in GrammarMatcher (matcher.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace serval {

struct GrammarLimits {
  size_t max_source_bytes = 256 * 1024;   // GBNF text, schema JSON, regex
  size_t max_nesting = 128;               // ( ) groups, schema / regex nesting
  uint32_t max_repetition = 1000;         // m, n of {m,n}; schema min/maxItems, min/maxLength
  size_t max_rules = 20000;               // after repetition expansion
  size_t max_elements = 200000;           // flat element array after expansion
  size_t max_classes = 20000;             // distinct character classes
  double max_compile_ms = 2000;           // wall clock for one compile
};

// One character class: sorted, disjoint, non-adjacent ranges of code points.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive
  uint64_t ascii[2] = {0, 0};                         // bit c set when c < 128 is in the class
  bool contains(uint32_t c) const;
  bool intersects(uint32_t lo, uint32_t hi) const;    // any code point of [lo, hi]
};

struct GrammarElem {
  enum Kind : uint8_t { end, term, ref };
  Kind kind = end;
  uint32_t value = 0;  // term: class index; ref: rule index
};

class CompiledGrammar {
 public:
  std::vector<GrammarElem> elems;               // every alternative, each closed by `end`
  std::vector<std::vector<uint32_t>> rule_alts;  // [rule] -> start positions in elems
  std::vector<std::string> rule_names;
  std::vector<CharClass> classes;
  uint32_t root = 0;
  // Shortest completions, in code points: rule_min[rule] for a whole rule,
  // min_rest[p] from element p to the end of its alternative. Alternatives
  // that cannot complete are dropped at compile time, so every value is
  // finite (below kNoEnd).
  static constexpr uint32_t kNoEnd = 0xFFFFFFFFu;
  std::vector<uint32_t> rule_min;
  std::vector<uint32_t> min_rest;
  std::string source;  // the GBNF text it was compiled from (JSON Schema etc. translate to it)
};

using GrammarPtr = std::shared_ptr<const CompiledGrammar>;

// GBNF text -> grammar; the start rule is `root`.
Expected<GrammarPtr> compile_gbnf(std::string_view text, const GrammarLimits& limits = {});

// JSON Schema (as JSON text) -> GBNF text / grammar. See json_schema.h for
// the supported keywords.
Expected<std::string> json_schema_to_gbnf(std::string_view schema_json, const GrammarLimits& limits = {});
Expected<GrammarPtr> compile_json_schema(std::string_view schema_json, const GrammarLimits& limits = {});
// The same rules with `<rule_prefix>root` as the start rule and every
// schema-specific rule prefixed, for embedding several schemas in one
// grammar; shared primitives (space, char, string, int, number, ...) keep
// their names and identical definitions, so duplicates of them can be dropped.
Expected<std::string> json_schema_to_gbnf_rules(std::string_view schema_json, const std::string& rule_prefix,
                                                const GrammarLimits& limits = {});

// Any JSON object (response_format json_object).
Expected<GrammarPtr> compile_json_object(const GrammarLimits& limits = {});

// Regular expression (a full match of the output) -> GBNF text / grammar.
// Supported: literals, escapes (\d \w \s \D \W \S, \n \t \r, \xHH, \uHHHH,
// escaped metacharacters), classes [...] and [^...], `.`, groups ( ) and
// (?: ), `|`, `*` `+` `?` `{m}` `{m,}` `{m,n}` (a lazy `?` suffix is
// accepted and ignored), `^` at the start and `$` at the end. Backreferences,
// lookaround and other anchors are rejected.
Expected<std::string> regex_to_gbnf(std::string_view regex, const GrammarLimits& limits = {});
Expected<GrammarPtr> compile_regex(std::string_view regex, const GrammarLimits& limits = {});

// Exactly one of the given strings.
Expected<GrammarPtr> compile_choice(const std::vector<std::string>& choices, const GrammarLimits& limits = {});

// A GBNF string literal for `text` ("..." with escapes).
std::string gbnf_literal(std::string_view text);

}  // namespace serval
