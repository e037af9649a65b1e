// Helpers shared by the grammar front ends (not part of the grammar API).
#pragma once

#include <string>
#include <string_view>

#include "sampler/grammar/grammar.h"

namespace serval {

// A regex as one GBNF expression (no rule definitions), for use inside
// larger grammars (JSON Schema "pattern").
Expected<std::string> regex_to_gbnf_expr(std::string_view regex, const GrammarLimits& limits);

}  // namespace serval
