// Parser of the chat-template language (jinja2's grammar: statements for,
// if/elif/else, set (and block set), macro, call, filter, with, break,
// continue, raw, generation; the full expression grammar with filters,
// tests, slices, calls and literals). Recursion is bounded by
// ParseLimits, so hostile templates fail cleanly instead of overflowing
// the stack. Pure function; thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "tokenizer/chat_template/ast.h"

namespace serval::chat_template {

struct ParseLimits {
  size_t max_block_depth = 64;        // nested {% %} blocks
  size_t max_expression_depth = 256;  // nesting of one expression's tree
};

// Throws TemplateError (message names the problem, line set) on any syntax
// error, an unknown filter/test/tag, or a limit exceeded.
std::unique_ptr<ast::Program> parse(std::string_view source, const ParseLimits& limits);

}  // namespace serval::chat_template
