#include <algorithm>
#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include "common/json_depth.h"

namespace serval::server {

using json = nlohmann::ordered_json;

int json_depth(std::string_view text) { return json_nesting_depth(text); }

namespace {

// double -> float without the undefined behaviour of casting a value out of
// float's range (1e300 becomes inf, which validation then refuses).
float narrow(double d) {
  if (d > (double)std::numeric_limits<float>::max()) return std::numeric_limits<float>::infinity();
  if (d < -(double)std::numeric_limits<float>::max()) return -std::numeric_limits<float>::infinity();
  return (float)d;
}

// Request fields that would let a client choose or parameterise the chat
// template: the template is the operator's (--chat-template or the model's).
constexpr const char* kRefusedFields[] = {"chat_template", "chat_template_kwargs", "template"};

struct Reader {
  const json& j;
  std::optional<ApiError> err;

  const json* get(const char* key) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void fail(std::string msg, const char* param) {
    if (!err) err = bad_request(std::move(msg), param);
  }
  std::optional<double> number(const char* key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) {
      fail(std::string(key) + ": expected a number, got " + v->type_name(), key);
      return std::nullopt;
    }
    return v->get<double>();
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    long double d = 0;
    if (v->is_number_unsigned()) d = (long double)v->get<uint64_t>();
    else if (v->is_number_integer()) d = (long double)v->get<int64_t>();
    else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()) d = v->get<double>();
    else {
      fail(std::string(key) + ": expected an integer, got " + (v->is_number() ? v->dump() : v->type_name()), key);
      return std::nullopt;
    }
    if (d < (long double)lo || d > (long double)hi) {
      fail(std::string(key) + ": expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
               v->dump(),
           key);
      return std::nullopt;
    }
    if (v->is_number_unsigned()) return (int64_t)v->get<uint64_t>();
    if (v->is_number_integer()) return v->get<int64_t>();
    return (int64_t)d;
  }
  std::optional<bool> boolean(const char* key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) {
      fail(std::string(key) + ": expected a boolean, got " + v->type_name(), key);
      return std::nullopt;
    }
    return v->get<bool>();
  }
  void fnum(const char* key, float* out) {
    if (auto v = number(key)) *out = narrow(*v);
  }
};

std::optional<ApiError> parse_token_list(const json& arr, int64_t n_vocab, std::vector<TokenId>* out) {
  for (const auto& t : arr) {
    if (!t.is_number_integer()) return bad_request("prompt: token ids must be integers", "prompt");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= n_vocab)
      return bad_request("prompt: token id " + std::to_string(id) + " is out of range [0, " + std::to_string(n_vocab) +
                             ")",
                         "prompt", "invalid_token_id");
    out->push_back((TokenId)id);
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> resolve_model_name(const std::string& m, const ParseContext& ctx, std::string* out) {
  *out = ctx.model_name;
  if (m.empty()) return std::nullopt;
  if (m != ctx.model_name && std::find(ctx.model_aliases.begin(), ctx.model_aliases.end(), m) == ctx.model_aliases.end() &&
      !(ctx.is_adapter && ctx.is_adapter(m)))
    return ApiError{404, "The model '" + m + "' does not exist (this server serves '" + ctx.model_name + "')",
                    "invalid_request_error", "model", "model_not_found"};
  *out = m;
  return std::nullopt;
}

std::variant<json, ApiError> parse_json_object(const std::string& body, int max_depth) {
  if (json_depth(body) > max_depth)
    return bad_request("request body nests deeper than " + std::to_string(max_depth) + " levels");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    return bad_request(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return bad_request("request body must be a JSON object");
  return j;
}

std::variant<ParsedRequest, ApiError> parse_openai_request(const std::string& body, bool chat, const ParseContext& ctx) {
  auto parsed = parse_json_object(body, ctx.limits.max_json_depth);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);

  ParsedRequest r;
  r.chat = chat;
  Reader rd{j, std::nullopt};
  for (const char* f : kRefusedFields)
    if (rd.get(f))
      return bad_request(std::string(f) + ": not supported; the chat template is the server's (the model's or "
                                          "--chat-template)",
                         f);

  if (auto e = resolve_model(rd.get("model"), ctx, &r.model)) return *e;

  // --- sampling ---
  SamplingParams& p = r.params;
  rd.fnum("temperature", &p.temperature);
  rd.fnum("top_p", &p.top_p);
  rd.fnum("min_p", &p.min_p);
  rd.fnum("typical_p", &p.typical_p);
  rd.fnum("frequency_penalty", &p.frequency_penalty);
  rd.fnum("presence_penalty", &p.presence_penalty);
  rd.fnum("repetition_penalty", &p.repetition_penalty);
  if (auto v = rd.integer("top_k", -1, 1 << 30)) p.top_k = (int32_t)*v;
  if (const json* sd = rd.get("seed")) {
    if (sd->is_number_unsigned()) p.seed = sd->get<uint64_t>();
    else if (sd->is_number_integer()) p.seed = (uint64_t)sd->get<int64_t>();
    else return bad_request("seed: expected an integer", "seed");
  }
  if (auto v = rd.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = rd.integer("n", 1, ctx.limits.max_n)) r.n = (int32_t)*v;
  // Search decoding (docs/SEARCH_DECODING.md): vLLM's use_beam_search with
  // best_of as the beam width, or beam_width itself; Hugging Face's names for
  // the rest. SamplingParams::validate and Engine::submit range-check them.
  const bool use_beam = rd.boolean("use_beam_search").value_or(false);
  std::optional<int64_t> best_of =
      rd.integer("best_of", 1, std::max<int64_t>(ctx.limits.max_n, SamplingLimits::max_beam_width));
  if (auto v = rd.integer("beam_width", 0, SamplingLimits::max_beam_width)) p.beam_width = (int32_t)*v;
  else if (use_beam) p.beam_width = (int32_t)best_of.value_or(r.n);
  if (use_beam && p.beam_width < 2)
    return bad_request("use_beam_search: needs a beam width (best_of, or n) of at least 2", "best_of");
  if (best_of && *best_of != (p.beam_search() ? p.beam_width : r.n))
    return bad_request(p.beam_search() ? "best_of: must equal beam_width when both are given"
                                       : "best_of: only best_of == n is supported without beam search",
                       "best_of");
  rd.fnum("length_penalty", &p.length_penalty);
  if (const json* es = rd.get("early_stopping")) {
    if (es->is_boolean()) p.early_stopping = es->get<bool>() ? EarlyStopping::yes : EarlyStopping::heuristic;
    else if (es->is_string() && es->get<std::string>() == "never") p.early_stopping = EarlyStopping::never;
    else return bad_request("early_stopping: expected true, false or \"never\"", "early_stopping");
  }
  if (auto v = rd.integer("num_beam_groups", 1, SamplingLimits::max_beam_width)) p.num_beam_groups = (int32_t)*v;
  rd.fnum("diversity_penalty", &p.diversity_penalty);
  rd.fnum("penalty_alpha", &p.penalty_alpha);
  if (auto v = rd.integer("priority", -1000000, 1000000)) r.priority = (int32_t)*v;
  if (auto v = rd.boolean("stream")) r.stream = *v;
  if (const json* so = rd.get("stream_options")) {
    if (!so->is_object()) return bad_request("stream_options: expected an object", "stream_options");
    if (!r.stream) return bad_request("stream_options: only allowed with stream: true", "stream_options");
    auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return bad_request("stream_options.include_usage: expected a boolean", "stream_options");
      r.include_usage = iu->get<bool>();
    }
  }
  const int64_t max_len = ctx.max_model_len;
  std::optional<int64_t> max_tokens;
  // Completions: max_tokens 0 with echo scores the prompt and generates nothing.
  if (auto v = rd.integer("max_tokens", chat ? 1 : 0, INT32_MAX)) max_tokens = *v;
  if (auto v = rd.integer("max_completion_tokens", 1, INT32_MAX)) max_tokens = *v;
  if (const json* stop = rd.get("stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > SamplingLimits::max_stop_strings)
        return bad_request("stop: at most " + std::to_string(SamplingLimits::max_stop_strings) + " stop strings, got " +
                               std::to_string(stop->size()),
                           "stop");
      for (const auto& s : *stop) {
        if (!s.is_string()) return bad_request("stop: expected a string or an array of strings", "stop");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad_request("stop: expected a string or an array of strings", "stop");
    }
  }
  if (const json* ids = rd.get("stop_token_ids")) {
    if (!ids->is_array() || ids->size() > SamplingLimits::max_stop_token_ids)
      return bad_request("stop_token_ids: expected an array of at most " +
                             std::to_string(SamplingLimits::max_stop_token_ids) + " token ids",
                         "stop_token_ids");
    for (const auto& t : *ids) {
      if (!t.is_number_integer()) return bad_request("stop_token_ids: expected integers", "stop_token_ids");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= ctx.n_vocab) return bad_request("stop_token_ids: token id " + std::to_string(id) + " is out of range", "stop_token_ids");
      p.stop_token_ids.push_back((TokenId)id);
    }
  }
  if (const json* lb = rd.get("logit_bias")) {
    if (!lb->is_object()) return bad_request("logit_bias: expected an object of token id -> bias", "logit_bias");
    if (lb->size() > SamplingLimits::max_logit_bias_entries)
      return bad_request("logit_bias: at most " + std::to_string(SamplingLimits::max_logit_bias_entries) +
                             " entries, got " + std::to_string(lb->size()),
                         "logit_bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id >= ctx.n_vocab)
        return bad_request("logit_bias: '" + key + "' is not a token id in [0, " + std::to_string(ctx.n_vocab) + ")",
                           "logit_bias");
      if (!it.value().is_number()) return bad_request("logit_bias: bias for token " + key + " is not a number", "logit_bias");
      p.logit_bias.push_back({(TokenId)id, narrow(it.value().get<double>())});
    }
  }
  if (chat) {
    if (auto v = rd.boolean("logprobs")) r.logprobs = *v;
    if (auto v = rd.integer("top_logprobs", 0, SamplingLimits::max_logprobs)) {
      if (!r.logprobs) return bad_request("top_logprobs: requires logprobs: true", "top_logprobs");
      r.top_logprobs = (int32_t)*v;
    }
  } else {
    if (auto v = rd.integer("logprobs", 0, SamplingLimits::max_logprobs)) {
      r.logprobs = true;
      r.top_logprobs = (int32_t)*v;
    }
    if (auto v = rd.boolean("echo")) r.echo = *v;
    if (const json* s = rd.get("suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
      return bad_request("suffix: not supported", "suffix");
  }
  if (auto v = rd.integer("prompt_logprobs", 0, SamplingLimits::max_logprobs)) {
    r.vllm_prompt_logprobs = true;
    r.vllm_prompt_top = (int32_t)*v;
  }
  if (rd.err) return *rd.err;
  if (max_tokens && *max_tokens == 0) {
    if (!r.echo)
      return bad_request("max_tokens: 0 generates nothing; it is allowed only with echo: true (to score the prompt)",
                         "max_tokens");
    if (r.n != 1) return bad_request("n: expected 1 with max_tokens 0", "n");
    if (r.stream) return bad_request("stream: not available with max_tokens 0 (nothing is generated)", "stream");
    r.score_only = true;
  }
  if (r.echo && r.logprobs) r.prompt_logprobs = r.top_logprobs;
  if (r.vllm_prompt_logprobs) r.prompt_logprobs = std::max(r.prompt_logprobs, r.vllm_prompt_top);
  if (r.prompt_logprobs >= 0 && (p.beam_search() || p.contrastive_search()))
    return bad_request(std::string(r.vllm_prompt_logprobs ? "prompt_logprobs" : "echo") +
                           ": prompt log-probs are not available with beam or contrastive search",
                       r.vllm_prompt_logprobs ? "prompt_logprobs" : "echo");
  {
    static GrammarCache default_cache;
    auto so = parse_structured_output(j, chat, ctx.grammar_cache ? *ctx.grammar_cache : default_cache,
                                      ctx.tool_format);
    if (auto* e = std::get_if<ApiError>(&so)) return *e;
    p.grammar = std::get<StructuredOutput>(so).grammar;
    r.tools = std::get<StructuredOutput>(so).tools;
    r.tool_format = std::get<StructuredOutput>(so).tool_format;
    r.tool_names = std::get<StructuredOutput>(so).tool_names;
    r.constraint = std::get<StructuredOutput>(so).source;
  }
  // The sampler computes the chosen token's logprob always; top-n only when asked.
  p.logprobs = r.logprobs ? std::max<int32_t>(r.top_logprobs, 1) : 0;

  // --- prompt ---
  const Tokenizer& tok = *ctx.tok;
  if (chat) {
    const json* msgs = rd.get("messages");
    if (!msgs) return bad_request("messages: required", "messages");
    if (!msgs->is_array() || msgs->empty()) return bad_request("messages: expected a non-empty array", "messages");
    if (msgs->size() > ctx.limits.max_messages)
      return bad_request("messages: at most " + std::to_string(ctx.limits.max_messages) + " messages", "messages");
    for (const auto& m : *msgs) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return bad_request("messages: each message needs a string 'role'", "messages");
      const std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
        return bad_request("messages: unknown role '" + role + "'", "messages");
      if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() && !m["content"].is_array())
        return bad_request("messages: content must be a string or an array of parts", "messages");
    }
    if (!ctx.chat_template)
      return bad_request("this model has no chat template (tokenizer.chat_template); use /v1/completions or start the "
                         "server with --chat-template FILE",
                         "messages", "no_chat_template");
    ChatContextOptions copt;
    copt.add_generation_prompt = true;
    if (tok.bos() >= 0) copt.bos_token = tok.token_text(tok.bos());
    if (tok.eos() >= 0) copt.eos_token = tok.token_text(tok.eos());
    if (const json* tools = rd.get("tools")) copt.tools = *tools;
    if (const json* agp = rd.get("add_generation_prompt"); agp && agp->is_boolean()) copt.add_generation_prompt = agp->get<bool>();
    auto cctx = build_chat_context(*msgs, copt);
    if (!cctx.ok()) return bad_request("messages: " + cctx.status().message(), "messages");
    auto text = ctx.chat_template->render(*cctx);
    if (!text.ok()) return bad_request("chat template: " + text.status().message(), "messages");
    // Templates usually write the BOS text themselves; add BOS only if not.
    const bool has_bos = !copt.bos_token.empty() && text->rfind(copt.bos_token, 0) == 0;
    std::vector<TokenId> ids = tok.encode(*text, /*add_special=*/!has_bos && tok.add_bos(), /*parse_special=*/true);
    // Functionary v3.2's generation prompt opens the recipient (">>>").
    if (r.tool_format == ToolCallFormat::functionary32 && text->size() >= 3 && text->compare(text->size() - 3, 3, ">>>") == 0)
      r.tool_prefix = ">>>";
    r.prompts.push_back(std::move(ids));
    r.prompt_texts.push_back(*text);
  } else {
    const json* pr = rd.get("prompt");
    if (!pr) return bad_request("prompt: required", "prompt");
    bool empty_text = false;
    auto add_text = [&](const std::string& s) {
      empty_text |= s.empty();
      r.prompts.push_back(tok.encode(s, tok.add_bos(), /*parse_special=*/true));
      r.prompt_texts.push_back(s);
    };
    if (pr->is_string()) {
      add_text(pr->get<std::string>());
    } else if (pr->is_array()) {
      if (pr->empty()) return bad_request("prompt: must not be empty", "prompt");
      if ((*pr)[0].is_number_integer()) {
        std::vector<TokenId> ids;
        if (auto e = parse_token_list(*pr, ctx.n_vocab, &ids)) return *e;
        r.prompt_texts.push_back(tok.decode(ids));
        r.prompts.push_back(std::move(ids));
      } else {
        if (pr->size() > ctx.limits.max_prompts)
          return bad_request("prompt: at most " + std::to_string(ctx.limits.max_prompts) + " prompts", "prompt");
        for (const auto& item : *pr) {
          if (item.is_string()) {
            add_text(item.get<std::string>());
          } else if (item.is_array()) {
            std::vector<TokenId> ids;
            if (auto e = parse_token_list(item, ctx.n_vocab, &ids)) return *e;
            r.prompt_texts.push_back(tok.decode(ids));
            r.prompts.push_back(std::move(ids));
          } else {
            return bad_request("prompt: expected a string, an array of strings, or token ids", "prompt");
          }
        }
      }
    } else {
      return bad_request("prompt: expected a string, an array of strings, or token ids", "prompt");
    }
    if (empty_text) return bad_request("prompt: must not be empty", "prompt");
    if ((size_t)r.n * r.prompts.size() > (size_t)ctx.limits.max_n * 4)
      return bad_request("n x number of prompts is too large", "n");
  }
  for (const auto& ids : r.prompts) {
    if (ids.empty()) return bad_request("prompt: must not be empty", chat ? "messages" : "prompt");
    if ((int64_t)ids.size() >= max_len)
      return bad_request("This model's maximum context length is " + std::to_string(max_len) + " tokens; the prompt has " +
                             std::to_string(ids.size()) + " tokens",
                         chat ? "messages" : "prompt", "context_length_exceeded");
    if (max_tokens && (int64_t)ids.size() + *max_tokens > max_len)
      return bad_request("This model's maximum context length is " + std::to_string(max_len) +
                             " tokens; the prompt (" + std::to_string(ids.size()) + " tokens) plus max_tokens (" +
                             std::to_string(*max_tokens) + ") exceeds it",
                         "max_tokens", "context_length_exceeded");
  }
  if (max_tokens) {
    p.max_tokens = (int32_t)*max_tokens;
  } else if (!chat) {
    // OpenAI's default of 16, within what the longest prompt leaves of the context.
    int64_t longest = 0;
    for (const auto& ids : r.prompts) longest = std::max<int64_t>(longest, (int64_t)ids.size());
    p.max_tokens = (int32_t)std::min<int64_t>(ctx.limits.default_completion_max_tokens, max_len - longest);
  }
  if (Status st = p.validate((int32_t)ctx.n_vocab, r.score_only); !st.ok()) return from_status(st);
  return r;
}

}  // namespace serval::server
