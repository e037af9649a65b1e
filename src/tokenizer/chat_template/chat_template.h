// Chat templates: the model's `tokenizer.chat_template` (a Jinja template)
// rendered by a sandboxed Jinja-subset renderer of our own.
//
// The renderer follows Python's jinja2 as Hugging Face transformers
// configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loop controls, HF's tojson, raise_exception and strftime_now globals), so
// a prompt renders byte-identically to `tokenizer.apply_chat_template`.
// tests/chat_template checks that against Debian's python3-jinja2 for every
// template in ../shared/chat-templates.
//
// Sandbox: a template sees only the context passed to render() and the
// builtin filters/tests/globals; there is no attribute access beyond data
// (no `__class__`, no Python objects), no file or template loading, and no
// mutation of lists/dicts. Templates come from the model file or a server
// flag, never from a request. Every compile and render runs under
// ChatTemplateLimits; exceeding one is a resource_exhausted Status, never a
// crash, hang or stack overflow (bounded recursion everywhere).
//
// Errors: compile() returns invalid_argument for syntax errors (unknown tag,
// filter or test, unbalanced brackets, unterminated tags ...), render()
// returns invalid_argument for template runtime errors (raise_exception,
// undefined attribute access, type errors) and resource_exhausted for
// budgets. Messages name the problem and the template line ("line 12: ...").
//
// Thread safety: a compiled ChatTemplate is immutable; render() is const and
// may run concurrently from many threads (each call has its own state).
// Compile once per model at load time; render on the HTTP threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace serval {

namespace chat_template::ast {
struct Program;
}

// Budgets of one compile/render. The defaults admit every real chat template
// we know of with a wide margin. With them a render needs at most ~600 KiB of
// C++ stack in release builds (parsing and evaluation recurse only within
// max_block_depth, max_expression_depth and max_eval_depth), peak memory is
// bounded by max_alloc_bytes, and time by max_steps (about a second).
struct ChatTemplateLimits {
  size_t max_source_bytes = 256 * 1024;        // template source size
  size_t max_block_depth = 64;                 // nested {% %} blocks
  size_t max_expression_depth = 256;           // nesting of one expression
  size_t max_output_bytes = 4 * 1024 * 1024;   // rendered text; also any one string value
  size_t max_alloc_bytes = 256 * 1024 * 1024;  // all strings/lists built during one render
  size_t max_loop_iterations = 100000;         // total over one render (range() is capped the same)
  size_t max_call_depth = 64;                  // macro recursion
  size_t max_eval_depth = 1000;                // nested evaluation frames (bounds the C++ stack)
  uint64_t max_steps = 10'000'000;             // evaluation steps (time bound)
  size_t max_collection_size = 1'000'000;      // elements of one list/dict value
};

struct ChatTemplateRenderOptions {
  // The time strftime_now() formats (seconds since the epoch, formatted as
  // UTC). nullopt: the current time. Tests pass a fixed instant.
  std::optional<int64_t> now_unix_seconds;
};

class ChatTemplate {
 public:
  // Parses and checks `source`. Unknown filters/tests/tags are compile errors.
  static Expected<ChatTemplate> compile(std::string_view source, const ChatTemplateLimits& limits = {});

  // Renders with `context` (a JSON object: its members are the template's
  // variables, in insertion order, so `tojson` and `items` keep the key order
  // of the request). Thread-safe.
  Expected<std::string> render(const nlohmann::ordered_json& context,
                               const ChatTemplateRenderOptions& options = {}) const;
  // Same, for a std::map-backed json (keys then iterate sorted).
  Expected<std::string> render(const nlohmann::json& context, const ChatTemplateRenderOptions& options = {}) const;

  const std::string& source() const;
  const ChatTemplateLimits& limits() const;

  struct Impl;  // opaque: the parsed program

 private:
  std::shared_ptr<const Impl> impl_;
};

// Inputs of the standard chat context (what transformers passes to the
// template in apply_chat_template).
struct ChatContextOptions {
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // An array of tool definitions (OpenAI style) or null (no tools).
  nlohmann::ordered_json tools;
  // An array of documents (RAG templates) or null.
  nlohmann::ordered_json documents;
  // Tool-call `arguments` arrive as JSON strings in the OpenAI API, while most
  // HF templates expect objects (they apply `|tojson`). When true, string
  // arguments that parse as a JSON object are replaced by the object.
  bool parse_tool_call_arguments = false;
  // More variables (e.g. "date_string", "enable_thinking"); an object or null.
  nlohmann::ordered_json extra;
};

// Builds {messages, tools, documents, add_generation_prompt, bos_token,
// eos_token, ...extra} from an OpenAI-style messages array, as transformers'
// apply_chat_template does (tools and documents are null when absent, so
// `tools is none` holds). Validates the
// shape (array of objects with a string `role`; content a string, null, or an
// array of text parts, which are joined with "\n") and returns
// invalid_argument naming the offending message otherwise.
Expected<nlohmann::ordered_json> build_chat_context(const nlohmann::ordered_json& messages,
                                                     const ChatContextOptions& options);

// Chooses the chat template of a loaded model: the server flag
// (--chat-template) wins over the GGUF's tokenizer.chat_template. With
// neither, returns not_found with a message suitable for an HTTP 400 on chat
// endpoints ("the model has no chat template ..."); there is deliberately no
// silent fallback format.
Expected<ChatTemplate> select_chat_template(const std::optional<std::string>& from_flag,
                                            const std::optional<std::string>& from_model,
                                            const ChatTemplateLimits& limits = {});

}  // namespace serval
