#include "tokenizer/chat_template/chat_template.h"

#include <new>

#include "tokenizer/chat_template/ast.h"
#include "tokenizer/chat_template/evaluator.h"
#include "tokenizer/chat_template/parser.h"
#include "tokenizer/chat_template/value.h"

namespace serval {

using chat_template::TemplateError;
using chat_template::Value;

struct ChatTemplate::Impl {
  std::string source;
  ChatTemplateLimits limits;
  std::unique_ptr<chat_template::ast::Program> program;
};

namespace {

Status to_status(const TemplateError& e) {
  std::string msg = "chat template";
  if (e.line > 0) msg += ": line " + std::to_string(e.line);
  msg += ": " + e.message;
  return Status(e.code, std::move(msg));
}

template <class Json>
Value from_json(const Json& j, uint32_t depth) {
  if (depth > chat_template::kMaxValueDepth) {
    chat_template::fail_budget("context nested deeper than " + std::to_string(chat_template::kMaxValueDepth) +
                               " levels");
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<chat_template::DictData>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(Value::string(it.key()), from_json(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    case nlohmann::json::value_t::binary: chat_template::fail("binary JSON values are not supported in the context");
    case nlohmann::json::value_t::discarded: return Value();
  }
  return Value();
}

template <class Json>
Expected<std::string> render_impl(const std::shared_ptr<const ChatTemplate::Impl>& impl, const Json& context,
                                  const ChatTemplateRenderOptions& options) {
  if (!impl) return invalid_argument("chat template: not compiled");
  if (!context.is_object()) {
    return invalid_argument(std::string("chat template: the context must be a JSON object, got ") +
                            context.type_name());
  }
  try {
    Value ctx = from_json(context, 0);
    chat_template::Evaluator ev(impl->limits, options);
    return ev.render(*impl->program, ctx);
  } catch (const TemplateError& e) {
    return to_status(e);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::resource_exhausted, "chat template: out of memory while rendering");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("chat template: ") + e.what());
  }
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::compile(std::string_view source, const ChatTemplateLimits& limits) {
  if (source.size() > limits.max_source_bytes) {
    return Status(StatusCode::resource_exhausted, "chat template: source is " + std::to_string(source.size()) +
                                                      " bytes, more than the limit of " +
                                                      std::to_string(limits.max_source_bytes));
  }
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  impl->limits = limits;
  try {
    chat_template::ParseLimits pl;
    pl.max_block_depth = limits.max_block_depth;
    pl.max_expression_depth = limits.max_expression_depth;
    impl->program = chat_template::parse(source, pl);
  } catch (const TemplateError& e) {
    return to_status(e);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::resource_exhausted, "chat template: out of memory while compiling");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("chat template: ") + e.what());
  }
  ChatTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& context,
                                           const ChatTemplateRenderOptions& options) const {
  return render_impl(impl_, context, options);
}

Expected<std::string> ChatTemplate::render(const nlohmann::json& context,
                                           const ChatTemplateRenderOptions& options) const {
  return render_impl(impl_, context, options);
}

const std::string& ChatTemplate::source() const {
  static const std::string empty;
  return impl_ ? impl_->source : empty;
}

const ChatTemplateLimits& ChatTemplate::limits() const {
  static const ChatTemplateLimits defaults;
  return impl_ ? impl_->limits : defaults;
}

Expected<nlohmann::ordered_json> build_chat_context(const nlohmann::ordered_json& messages,
                                                     const ChatContextOptions& options) {
  using nlohmann::ordered_json;
  if (!messages.is_array()) {
    return invalid_argument(std::string("messages: expected an array, got ") + messages.type_name());
  }
  ordered_json out_messages = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_argument(where + ": expected an object, got " + m.type_name());
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return invalid_argument(where + ".role: expected a string");
    ordered_json msg = m;
    auto content = msg.find("content");
    if (content != msg.end() && content->is_array()) {
      std::string text;
      for (size_t k = 0; k < content->size(); ++k) {
        const ordered_json& part = (*content)[k];
        std::string pw = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return invalid_argument(pw + ": expected an object");
        auto type = part.find("type");
        if (type == part.end() || !type->is_string()) return invalid_argument(pw + ".type: expected a string");
        if (*type != "text") {
          return Status(StatusCode::unsupported,
                        pw + ": content part type '" + type->get<std::string>() + "' is not supported (only 'text')");
        }
        auto t = part.find("text");
        if (t == part.end() || !t->is_string()) return invalid_argument(pw + ".text: expected a string");
        if (k) text += "\n";
        text += t->get<std::string>();
      }
      *content = text;
    } else if (content != msg.end() && !content->is_string() && !content->is_null()) {
      return invalid_argument(where + ".content: expected a string, an array of text parts or null, got " +
                              content->type_name());
    }
    if (options.parse_tool_call_arguments) {
      auto calls = msg.find("tool_calls");
      if (calls != msg.end() && calls->is_array()) {
        for (auto& call : *calls) {
          if (!call.is_object()) continue;
          auto fn = call.find("function");
          if (fn == call.end() || !fn->is_object()) continue;
          auto args = fn->find("arguments");
          if (args == fn->end() || !args->is_string()) continue;
          ordered_json parsed = ordered_json::parse(args->get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) *args = std::move(parsed);
        }
      }
    }
    out_messages.push_back(std::move(msg));
  }
  ordered_json ctx = ordered_json::object();
  ctx["messages"] = std::move(out_messages);
  // As transformers' apply_chat_template: `tools` and `documents` are always
  // passed, None when absent.
  if (!options.tools.is_null() && !options.tools.is_array()) return invalid_argument("tools: expected an array");
  if (!options.documents.is_null() && !options.documents.is_array()) {
    return invalid_argument("documents: expected an array");
  }
  ctx["tools"] = options.tools;
  ctx["documents"] = options.documents;
  ctx["add_generation_prompt"] = options.add_generation_prompt;
  ctx["bos_token"] = options.bos_token;
  ctx["eos_token"] = options.eos_token;
  if (!options.extra.is_null()) {
    if (!options.extra.is_object()) return invalid_argument("extra template variables: expected an object");
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it) {
      if (it.key() == "messages") return invalid_argument("extra template variables: 'messages' is reserved");
      ctx[it.key()] = it.value();
    }
  }
  return ctx;
}

Expected<ChatTemplate> select_chat_template(const std::optional<std::string>& from_flag,
                                            const std::optional<std::string>& from_model,
                                            const ChatTemplateLimits& limits) {
  if (from_flag) {
    auto t = ChatTemplate::compile(*from_flag, limits);
    if (!t.ok()) return t.status().with_context("--chat-template");
    return t;
  }
  if (from_model) {
    auto t = ChatTemplate::compile(*from_model, limits);
    if (!t.ok()) return t.status().with_context("tokenizer.chat_template");
    return t;
  }
  return not_found(
      "the model has no chat template (no tokenizer.chat_template in the GGUF file and no --chat-template "
      "flag): chat requests cannot be formatted; use the completions endpoint or start the server with "
      "--chat-template");
}

}  // namespace serval
