// The builtin filters, tests, methods and globals of the chat-template
// renderer: the subset of jinja2's (and Python's str/dict/list methods)
// that chat templates use, with jinja2's semantics. Lookup tables are
// immutable; thread-safe.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "tokenizer/chat_template/value.h"

namespace serval::chat_template {

class Evaluator;

using FilterFn = Value (*)(Evaluator& ev, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Evaluator& ev, const Value& subject, CallArgs& args);

FilterFn find_filter(std::string_view name);  // nullptr when unknown
TestFn find_test(std::string_view name);      // nullptr when unknown

// `obj.name` where obj is a str, dict or list and name one of the methods the
// sandbox allows (str.strip, dict.items, ...): a bound method. nullopt when
// the type has no such method. Mutating methods (list.append, dict.update)
// are returned too but fail when called, as in jinja2's immutable sandbox.
std::optional<Value> find_method(const Value& obj, std::string_view name);

// The template globals (range, dict, namespace, raise_exception,
// strftime_now, cycler, joiner); nullopt when `name` is not one.
std::optional<Value> find_global(std::string_view name);

// Python-style argument binding for builtins: fills `out` (one slot per
// name, in order) from positional then keyword arguments. Throws on too many
// positional arguments, unknown or duplicate keywords.
void bind_args(const char* fname, CallArgs& args, std::initializer_list<const char*> names,
               std::optional<Value>* out);

// json.dumps as Hugging Face's tojson filter calls it
// (ensure_ascii=False by default, no HTML escaping).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool pretty = false;     // indent is not None
  std::string indent;      // per level, when pretty
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string json_dumps(Evaluator& ev, const Value& v, const JsonDumpOptions& opts);

// Python's `fmt % args` (printf-style; also the `format` filter).
Value py_percent_format(Evaluator& ev, const Value& fmt, const Value& args);

// Python's `item in container` (raises for non-containers).
bool value_contains(const Value& container, const Value& item);

}  // namespace serval::chat_template
