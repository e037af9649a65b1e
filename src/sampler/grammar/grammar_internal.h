// Helpers shared by the grammar front ends (not part of the grammar API).
#pragma once

#include <string>
#include <string_view>

#include "sampler/grammar/grammar.h"

namespace serval {

// A regex as one GBNF expression (no rule definitions), for use inside
// larger grammars (JSON Schema "pattern").
Expected<std::string> regex_to_gbnf_expr(std::string_view regex, const GrammarLimits& limits);

// The same, as the body of a JSON string literal: characters JSON escapes
// are generated as escapes; negated shorthands keep to printable ASCII.
Expected<std::string> regex_to_json_string_gbnf(std::string_view regex, const GrammarLimits& limits);

}  // namespace serval

namespace serval {

// One UTF-8 code point of `s` at `pos` (advanced past it); false if malformed.
bool next_code_point(std::string_view s, size_t& pos, uint32_t& cp);

// `digits` hex digits of `s` at `pos` (advanced past them); false if one is not hex.
bool read_hex(std::string_view s, size_t& pos, int digits, uint32_t& cp);

}  // namespace serval
