// Tokenizer of the chat-template language: jinja2's lexer with the options
// Hugging Face transformers uses (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False), including `-`/`+` whitespace control, raw
// blocks and comments. Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace serval::chat_template {

enum class TokType : uint8_t {
  data,            // template text (whitespace control already applied)
  variable_begin,  // {{
  variable_end,    // }}
  block_begin,     // {%
  block_end,       // %}
  name,
  string,          // text holds the unescaped value
  integer,
  floating,
  op,              // text holds the operator ("+", "//", "(", ...)
  eof,
};

struct Token {
  TokType type = TokType::eof;
  int line = 1;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
};

// Throws TemplateError (with the line) on a lexical error: unbalanced
// brackets, an unterminated comment/raw block, a bad escape or character.
std::vector<Token> lex(std::string_view source);

const char* describe(TokType t);

}  // namespace serval::chat_template
