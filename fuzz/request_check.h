// The request-layer invariants shared by the JSON and HTTP harnesses: a
// request the parser accepts is one the engine can run without further checks.
#pragma once

#include <string>
#include <variant>

#include "fuzz_common.h"
#include "server/openai_request.h"

namespace serval::fuzz {

inline const server::ParseContext& parse_context() {
  static const server::ParseContext ctx = [] {
    server::ParseContext c;
    c.tok = &stories_tokenizer();
    c.chat_template = &phi_template();
    c.model_name = "stories260K";
    c.n_vocab = c.tok->n_vocab();
    c.max_model_len = 256;
    return c;
  }();
  return ctx;
}

inline void parse_and_check(const std::string& body, bool chat) {
  const server::ParseContext& ctx = parse_context();
  auto r = server::parse_openai_request(body, chat, ctx);
  if (auto* e = std::get_if<server::ApiError>(&r)) {
    require(e->status >= 400 && e->status < 500, "an error is a 4xx, got " + std::to_string(e->status));
    require(!e->message.empty(), "an error has a message");
    return;
  }
  const auto& req = std::get<server::ParsedRequest>(r);
  require(!req.prompts.empty(), "at least one prompt");
  require(req.prompts.size() == req.prompt_texts.size(), "one text per prompt");
  require(req.n >= 1 && req.n <= ctx.limits.max_n, "n in [1, max_n]");
  const auto& max_tokens = req.params.max_tokens;  // absent: up to the context
  if (max_tokens) require(*max_tokens >= 1 || (req.score_only && *max_tokens == 0), "max_tokens >= 1 (0: score only)");
  for (const auto& ids : req.prompts) {
    require(!ids.empty(), "non-empty prompt");
    require((int64_t)ids.size() < ctx.max_model_len, "prompt shorter than the context");
    if (max_tokens) require((int64_t)ids.size() + *max_tokens <= ctx.max_model_len, "prompt + max_tokens fit");
    for (TokenId id : ids) require(id >= 0 && id < ctx.n_vocab, "prompt id in range");
  }
  for (const auto& [id, bias] : req.params.logit_bias) require(id >= 0 && id < ctx.n_vocab, "logit_bias id in range");
  for (TokenId id : req.params.stop_token_ids) require(id >= 0 && id < ctx.n_vocab, "stop id in range");
  require(req.params.validate((int32_t)ctx.n_vocab, req.score_only).ok(), "accepted params validate");
}

}  // namespace serval::fuzz
