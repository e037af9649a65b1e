#include "server/openai_server.h"

#include "server/anthropic_api.h"
#include "server/api_keys.h"
#include "server/batch_api.h"
#include "server/embeddings_api.h"
#include "server/output_parser.h"
#include "server/responses_api.h"
#include "server/webui.h"
#include "common/thread_pool.h"

#include <chrono>
#include <cmath>
#include <random>
#include <sstream>

namespace serval::server {

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s-%016llx", prefix, (unsigned long long)rng());
  return buf;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Prefix-cache salt of an (authorized) request: one cache namespace per API
// key, so a tenant cannot learn another's prompts from cache-hit timing or
// cached_tokens. 0 (one shared namespace) without keys or when configured.
uint64_t tenant_salt(const ServerConfig& cfg, const http::HttpRequest& req) {
  if (cfg.api_keys.empty() || cfg.shared_prefix_cache) return 0;
  const uint64_t h = fnv1a64(bearer_token(req));  // as owner_of(): batch lines share their owner's namespace
  return h ? h : 1;
}

// The body of /tokenize, /detokenize or /v1/engine/step as a JSON object
// (openai_request.h parse_json_object); the error to send otherwise.
std::optional<ApiError> body_object(const std::string& body, int max_depth, json* j) {
  auto parsed = parse_json_object(body, max_depth);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  *j = std::move(std::get<json>(parsed));
  return std::nullopt;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back((int)c);
  return b;
}

}  // namespace

// One API request in flight: its engine streams, the accumulated choices, and
// the response channel. Event handling is serialized by `mu`.
struct OpenAiServer::Job : std::enable_shared_from_this<OpenAiServer::Job> {
  // First member, so destroyed last: the job counts as alive (quiescent())
  // until every other member (the channel, its observation) is gone.
  struct Counted {
    std::shared_ptr<Life> life;
    ~Counted() {
      if (life) life->jobs--;
    }
  } counted;
  struct Choice {
    std::string text;
    json logprobs_content = json::array();     // chat
    json lp_tokens = json::array(), lp_token_logprobs = json::array(), lp_top = json::array(), lp_offsets = json::array();
    std::string finish;
    bool role_sent = false;
    int64_t completion_tokens = 0;
    size_t streamed = 0;  // bytes of `text` already sent (tool mode holds a possible call back)
    std::optional<json> tool_call;  // the OpenAI tool_calls entry when the output is a call
    std::optional<ReasoningSplitter> think;  // chat with a reasoning model: splits <think> off
    std::string reasoning;                   // what went to reasoning_content
    std::optional<ToolCallStreamer> native;  // tools in the template's own format: the streamed calls
    std::vector<std::string> call_ids;       // one per call streamed
    std::optional<ParsedOutput> parsed;      // native format, at the end: content and calls
    std::optional<double> beam_score;  // beam search: the hypothesis' score
    json stop_reason = nullptr;  // vLLM: the stop string or stop token id that ended it (null: EOS or other)
  };

  OpenAiServer* srv = nullptr;
  uint64_t job_id = 0;
  std::string id;
  int64_t created = 0;
  ParsedRequest req;
  std::shared_ptr<http::ResponseChannel> ch;
  std::shared_ptr<RequestObservation> obs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<Choice> choices;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  int64_t reserved_tokens = 0;
  // Prompt log-probs, per prompt: received (from sample 0's first event), and
  // vLLM's `prompt_logprobs` list ([null, {id: {logprob, rank, decoded_token}}, ...]).
  std::vector<bool> prompt_lp_done;
  std::vector<json> prompt_lp_json;
  clock_type::time_point deadline = clock_type::time_point::max();
  std::mutex mu;
  size_t open_streams = 0;
  bool finished = false;

  void cancel_all() {
    for (auto& s : streams) srv->engine_.cancel(s->id());
  }

  void write_event(const json& chunk) { ch->write("data: " + dump(chunk) + "\n\n"); }

  json chunk_base() const {
    return json{{"id", id}, {"object", req.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                {"model", req.model}};
  }

  size_t prompt_idx_of(const Choice& c) const { return (size_t)(&c - choices.data()) / (size_t)req.n; }

  // Adds one event's logprobs to choice c; returns the per-chunk logprobs JSON.
  json add_logprobs(Choice& c, const OutputEvent& ev) {
    const Tokenizer& tok = srv->engine_.tokenizer();
    if (req.chat) {
      json content = json::array();
      for (const auto& lp : ev.logprobs) {
        const std::string piece = tok.token_to_piece(lp.chosen.token);
        json top = json::array();
        for (int i = 0; i < req.top_logprobs && i < (int)lp.top.size(); ++i) {
          const std::string tp = tok.token_to_piece(lp.top[(size_t)i].token);
          top.push_back({{"token", tp}, {"logprob", lp.top[(size_t)i].logprob}, {"bytes", bytes_of(tp)}});
        }
        json e = {{"token", piece}, {"logprob", lp.chosen.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}};
        content.push_back(e);
        c.logprobs_content.push_back(e);
      }
      return json{{"content", content}};
    }
    // text_offset counts from the start of the returned text (the prompt, with echo).
    const size_t base = req.echo ? req.prompt_texts[prompt_idx_of(c)].size() : 0;
    json out = completion_logprobs({}, ev.logprobs, base + c.text.size());
    for (auto& x : out["tokens"]) c.lp_tokens.push_back(x);
    for (auto& x : out["token_logprobs"]) c.lp_token_logprobs.push_back(x);
    for (auto& x : out["top_logprobs"]) c.lp_top.push_back(x);
    for (auto& x : out["text_offset"]) c.lp_offsets.push_back(x);
    return out;
  }

  // The /v1/completions logprobs lists of `lps` (text offsets from `at`);
  // with `first` the list starts with that token (a prompt's first, which has
  // no log-prob: null entries).
  json completion_logprobs(std::optional<TokenId> first, std::span<const TokenLogprobs> lps, size_t at) const {
    const Tokenizer& tok = srv->engine_.tokenizer();
    json tokens = json::array(), tlp = json::array(), top = json::array(), offs = json::array();
    if (first) {
      const std::string piece = tok.token_to_piece(*first);
      tokens.push_back(piece);
      tlp.push_back(nullptr);
      top.push_back(nullptr);
      offs.push_back((int64_t)at);
      at += piece.size();
    }
    for (const auto& lp : lps) {
      const std::string piece = tok.token_to_piece(lp.chosen.token);
      json t = json::object();
      for (int i = 0; i < req.top_logprobs && i < (int)lp.top.size(); ++i)
        t[tok.token_to_piece(lp.top[(size_t)i].token)] = lp.top[(size_t)i].logprob;
      tokens.push_back(piece);
      tlp.push_back(lp.chosen.logprob);
      top.push_back(t);
      offs.push_back((int64_t)at);
      at += piece.size();
    }
    return json{{"tokens", tokens}, {"token_logprobs", tlp}, {"top_logprobs", top}, {"text_offset", offs}};
  }

  // vLLM's entry for one position: the token itself and the `top` best, by id.
  json vllm_logprob_entry(const TokenLogprobs& lp, int32_t top) const {
    const Tokenizer& tok = srv->engine_.tokenizer();
    json e = json::object();
    e[std::to_string(lp.chosen.token)] = {
        {"logprob", lp.chosen.logprob}, {"rank", lp.rank}, {"decoded_token", tok.token_to_piece(lp.chosen.token)}};
    for (int32_t i = 0; i < top && i < (int32_t)lp.top.size(); ++i) {
      const TokenLogprob& t = lp.top[(size_t)i];
      const std::string key = std::to_string(t.token);
      if (!e.contains(key))
        e[key] = {{"logprob", t.logprob}, {"rank", i + 1}, {"decoded_token", tok.token_to_piece(t.token)}};
    }
    return e;
  }

  // Sample 0's first event of prompt p brought the prompt's log-probs: they
  // become vLLM's prompt_logprobs and, with echo, the head of each of the
  // prompt's choices' logprobs lists (streamed: the echo chunk).
  void on_prompt_logprobs(size_t p, const std::vector<TokenLogprobs>& lps) {
    prompt_lp_done[p] = true;
    const std::vector<TokenId>& ids = req.prompts[p];
    if (req.vllm_prompt_logprobs) {
      json arr = json::array({nullptr});
      for (const TokenLogprobs& lp : lps) arr.push_back(vllm_logprob_entry(lp, req.vllm_prompt_top));
      prompt_lp_json[p] = std::move(arr);
    }
    const bool echo_lp = req.echo && req.logprobs;
    json head = echo_lp ? completion_logprobs(ids[0], lps, 0) : json();
    if (echo_lp) {
      // The echoed text may lack what the pieces start with (the tokenizer's
      // leading space, as vLLM's detokenizer drops it too): the first tokens
      // lose those bytes, so each token is the text at its offset.
      std::string pieces;
      for (const auto& t : head["tokens"]) pieces += t.get<std::string>();
      const std::string& text = req.prompt_texts[p];
      if (pieces.size() > text.size() && pieces.compare(pieces.size() - text.size(), text.size(), text) == 0) {
        const size_t shift = pieces.size() - text.size();
        size_t cut = shift;
        for (size_t k = 0; k < head["tokens"].size(); ++k) {
          std::string t = head["tokens"][k].get<std::string>();
          const size_t drop = std::min(cut, t.size());
          cut -= drop;
          head["tokens"][k] = t.substr(drop);
          head["text_offset"][k] = std::max<int64_t>(0, head["text_offset"][k].get<int64_t>() - (int64_t)shift);
        }
      }
    }
    for (size_t k = 0; k < (size_t)req.n; ++k) {
      const size_t ci = p * (size_t)req.n + k;
      Choice& c = choices[ci];
      if (echo_lp) {
        auto prepend = [](json& list, const json& items) { list.insert(list.begin(), items.begin(), items.end()); };
        prepend(c.lp_tokens, head["tokens"]);
        prepend(c.lp_token_logprobs, head["token_logprobs"]);
        prepend(c.lp_top, head["top_logprobs"]);
        prepend(c.lp_offsets, head["text_offset"]);
      }
      if (!req.stream || (!echo_lp && !req.vllm_prompt_logprobs)) continue;
      json chunk = chunk_base();
      json choice = {{"index", ci}};
      if (req.chat) choice["delta"] = json::object();
      else choice["text"] = echo_lp ? req.prompt_texts[p] : std::string();
      choice["logprobs"] = echo_lp ? head : json(nullptr);
      choice["finish_reason"] = nullptr;
      if (req.vllm_prompt_logprobs) choice["prompt_logprobs"] = prompt_lp_json[p];
      chunk["choices"] = json::array({choice});
      write_event(chunk);
    }
  }

  void on_event(size_t stream_idx, const OutputEvent& ev) {
    if (finished) return;
    if (!ev.error.ok()) {
      fail(ApiError{500, ev.error.message(), "server_error", "", ""});
      return;
    }
    const size_t prompt_idx = stream_idx;
    const size_t ci = prompt_idx * (size_t)req.n + (size_t)ev.index;
    Choice& c = choices[ci];
    if (req.prompt_logprobs >= 0 && ev.index == 0 && !prompt_lp_done[prompt_idx])
      on_prompt_logprobs(prompt_idx, ev.prompt_logprobs);
    json lp = nullptr;
    if (req.logprobs && !ev.logprobs.empty()) lp = add_logprobs(c, ev);
    std::string think_delta;
    const size_t text_before = c.text.size();
    if (c.think) {
      ReasoningDelta d = c.think->feed(ev.text);
      if (ev.finish != FinishReason::none) {
        ReasoningDelta f = c.think->finish();
        d.reasoning += f.reasoning;
        d.content += f.content;
      }
      think_delta = std::move(d.reasoning);
      c.reasoning += think_delta;
      c.text += d.content;
    } else {
      c.text += ev.text;
    }
    c.completion_tokens += (int64_t)ev.tokens.size();
    if (ev.search_score) c.beam_score = *ev.search_score;
    obs->on_event(stream_idx, ci, ev);
    if (ev.finish != FinishReason::none) {
      c.finish = finish_reason_name(ev.finish);
      if (ev.stop_string >= 0 && (size_t)ev.stop_string < req.params.stop.size())
        c.stop_reason = req.params.stop[(size_t)ev.stop_string];
      else if (ev.stop_token >= 0)
        c.stop_reason = ev.stop_token;
      if (req.tools != ToolMode::off && req.tool_format != ToolCallFormat::none) {
        c.parsed = parse_tool_calls(req.tool_format, c.text, req.tool_names, req.tool_prefix);
        if (!c.parsed->calls.empty() && ev.finish == FinishReason::stop) c.finish = "tool_calls";
      } else if (req.tools != ToolMode::off && ev.finish == FinishReason::stop) {
        c.tool_call = parse_tool_call(c.text, random_id("call"));
        if (c.tool_call) c.finish = "tool_calls";
      }
      if (ev.index == 0) cached_tokens += ev.cached_prompt_tokens;
    }
    if (req.stream) {
      json chunk = chunk_base();
      json choice = {{"index", ci}};
      if (req.chat) {
        json delta = json::object();
        if (!c.role_sent) {
          delta["role"] = "assistant";
          c.role_sent = true;
        }
        if (c.native) {
          // The template's own call format: text as it settles, calls as
          // their name and then argument deltas.
          ToolCallDelta td = c.native->feed(std::string_view(c.text).substr(text_before));
          if (ev.finish != FinishReason::none) {
            ToolCallDelta f = c.native->finish();
            td.content += f.content;
            td.calls.insert(td.calls.end(), f.calls.begin(), f.calls.end());
          }
          if (!td.content.empty() || delta.contains("role")) delta["content"] = td.content;
          json tcs = json::array();
          for (const auto& k : td.calls) {
            json e = {{"index", k.index}};
            if (!k.name.empty()) {
              c.call_ids.push_back(random_id("call"));
              e["id"] = c.call_ids.back();
              e["type"] = "function";
              e["function"] = {{"name", k.name}, {"arguments", k.arguments}};
            } else {
              e["function"] = {{"arguments", k.arguments}};
            }
            tcs.push_back(std::move(e));
          }
          if (!tcs.empty()) delta["tool_calls"] = std::move(tcs);
        }
        // With tools, text that may be a call is held back until it is complete.
        const bool hold = c.native.has_value() || req.tools == ToolMode::required ||
                          (req.tools == ToolMode::optional && (c.text.empty() || c.text[0] == '{'));
        std::string text;
        const bool call = ev.finish != FinishReason::none && c.tool_call;
        if (call) {
          json tc = *c.tool_call;
          tc["index"] = 0;
          delta["tool_calls"] = json::array({tc});
          c.streamed = c.text.size();
        } else if (!c.native && (!hold || ev.finish != FinishReason::none)) {
          text = c.text.substr(c.streamed);
          c.streamed = c.text.size();
        }
        if (!c.native && (!text.empty() || (delta.contains("role") && !call))) delta["content"] = text;
        if (!think_delta.empty()) {
          // Clients read one or the other (DeepSeek / vLLM vs OpenRouter / llama.cpp).
          delta["reasoning_content"] = think_delta;
          delta["reasoning"] = think_delta;
        }
        choice["delta"] = delta;
      } else {
        choice["text"] = ev.text;
      }
      choice["logprobs"] = lp;
      choice["finish_reason"] = ev.finish == FinishReason::none ? json(nullptr) : json(c.finish);
      if (ev.finish != FinishReason::none) choice["stop_reason"] = c.stop_reason;
      if (c.beam_score) choice["beam_score"] = *c.beam_score;
      chunk["choices"] = json::array({choice});
      const bool empty_delta = req.chat && choice["delta"].empty();  // e.g. a tool call held back
      if ((!ev.text.empty() || ev.finish != FinishReason::none || !lp.is_null() || req.chat) &&
          !(empty_delta && ev.finish == FinishReason::none && lp.is_null()))
        write_event(chunk);
    }
  }

  json usage() const {
    int64_t completion = 0;
    for (const auto& c : choices) completion += c.completion_tokens;
    json u = {{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion},
              {"total_tokens", prompt_tokens + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
    json ext = obs->usage_extension();  // cost, energy, carbon when configured
    if (!ext.empty()) u["serval"] = std::move(ext);
    return u;
  }

  // The request leaves the in-flight count before its last bytes are queued,
  // so a client that sends its next request right after reading this one is
  // never counted twice (no spurious 429).
  void complete() {
    finished = true;
    srv->job_done(*this);
    if (req.stream) {
      if (req.include_usage) {
        json chunk = chunk_base();
        chunk["choices"] = json::array();
        chunk["usage"] = usage();
        write_event(chunk);
      }
      ch->write("data: [DONE]\n\n");
      ch->end();
    } else {
      json out = {{"id", id}, {"object", req.chat ? "chat.completion" : "text_completion"}, {"created", created},
                  {"model", req.model}};
      json arr = json::array();
      for (size_t i = 0; i < choices.size(); ++i) {
        const Choice& c = choices[i];
        json ch_json = {{"index", i}};
        if (req.chat) {
          ch_json["message"] = {{"role", "assistant"}, {"content", c.text}};
          if (c.think && !c.reasoning.empty()) {
            ch_json["message"]["reasoning_content"] = c.reasoning;
            ch_json["message"]["reasoning"] = c.reasoning;
          }
          if (c.tool_call) {
            ch_json["message"]["content"] = nullptr;
            ch_json["message"]["tool_calls"] = json::array({*c.tool_call});
          }
          if (c.parsed && !c.parsed->calls.empty()) {
            json tcs = json::array();
            for (const ToolCall& k : c.parsed->calls)
              tcs.push_back({{"id", random_id("call")}, {"type", "function"},
                             {"function", {{"name", k.name}, {"arguments", k.arguments}}}});
            ch_json["message"]["content"] = c.parsed->content.empty() ? json(nullptr) : json(c.parsed->content);
            ch_json["message"]["tool_calls"] = std::move(tcs);
          } else if (c.parsed) {
            ch_json["message"]["content"] = c.parsed->content;  // the text as the format has it (v3.2: no "all\n")
          }
          ch_json["logprobs"] = req.logprobs ? json{{"content", c.logprobs_content}} : json(nullptr);
        } else {
          std::string text = req.echo ? req.prompt_texts[i / (size_t)req.n] + c.text : c.text;
          ch_json["text"] = text;
          ch_json["logprobs"] = req.logprobs ? json{{"tokens", c.lp_tokens},
                                                     {"token_logprobs", c.lp_token_logprobs},
                                                     {"top_logprobs", c.lp_top},
                                                     {"text_offset", c.lp_offsets}}
                                             : json(nullptr);
        }
        ch_json["finish_reason"] = c.finish.empty() ? json(nullptr) : json(c.finish);
        ch_json["stop_reason"] = c.stop_reason;
        if (c.beam_score) ch_json["beam_score"] = *c.beam_score;
        if (req.vllm_prompt_logprobs && !req.chat) ch_json["prompt_logprobs"] = prompt_lp_json[prompt_idx_of(c)];
        arr.push_back(ch_json);
      }
      out["choices"] = arr;
      if (req.vllm_prompt_logprobs && req.chat) out["prompt_logprobs"] = prompt_lp_json[0];
      out["usage"] = usage();
      srv->send_json(ch, 200, dump(out));
    }
  }

  void fail(const ApiError& e) {
    if (finished) return;
    finished = true;
    cancel_all();
    srv->job_done(*this);
    if (req.stream) {
      ch->write("data: " + e.body() + "\n\n");
      ch->write("data: [DONE]\n\n");
      ch->end();
    } else {
      srv->send_error(ch, e);
    }
  }

  // Drains every stream's queued events (any thread; serialized).
  void pump() {
    std::lock_guard<std::mutex> lk(mu);
    if (finished) return;
    for (size_t i = 0; i < streams.size() && !finished; ++i) {
      OutputEvent ev;
      while (!finished && streams[i]->next_for(&ev, 0)) on_event(i, ev);
    }
    if (finished) return;
    bool all_done = true;
    for (auto& s : streams) all_done = all_done && s->done();
    if (all_done) complete();
  }
};

Expected<std::unique_ptr<OpenAiServer>> OpenAiServer::create(Engine& engine, ServerConfig cfg) {
  std::unique_ptr<OpenAiServer> s(new OpenAiServer(engine, std::move(cfg)));
  const EngineInfo info = engine.info();
  if (s->cfg_.model_name.empty()) s->cfg_.model_name = info.model_name;
  s->engine_info_ = info;
  std::optional<std::string> from_model;
  if (!info.chat_template.empty()) from_model = info.chat_template;
  if (s->cfg_.chat_template || from_model) {
    auto t = select_chat_template(s->cfg_.chat_template, from_model);
    if (!t.ok()) return t.status().with_context("chat template");
    s->chat_template_ = std::move(t.value());
  }
  const std::string& rf = s->cfg_.reasoning_format;
  if (rf != "auto" && rf != "none" && rf != "deepseek")
    return invalid_argument("reasoning format: expected auto, none or deepseek, got '" + rf + "'");
  s->reasoning_ = rf == "deepseek" || (rf == "auto" && s->chat_template_ && template_reasons(s->chat_template_->source()));
  const std::string& tf = s->cfg_.tool_call_format;
  if (tf == "auto") {
    if (s->chat_template_) {
      const ToolCallFormat f = detect_tool_call_format(s->chat_template_->source());
      if (tool_format_constrainable(f)) s->parse_ctx_.tool_format = f;
    }
  } else if (tf != "generic") {
    bool found = false;
    for (int k = 0; k <= (int)ToolCallFormat::firefunction && !found; ++k)
      if (tool_call_format_name((ToolCallFormat)k) == tf && tool_format_constrainable((ToolCallFormat)k))
        s->parse_ctx_.tool_format = (ToolCallFormat)k, found = true;
    if (!found)
      return invalid_argument("tool-call format: expected auto, generic, hermes, llama3_json, mistral, "
                              "firefunction_v2, command_r, command_r7b, functionary_v3.1, functionary_v3.2 or "
                              "deepseek_r1, got '" + tf + "'");
  }
  s->parse_ctx_.tok = &engine.tokenizer();
  s->parse_ctx_.chat_template = s->chat_template_ ? &*s->chat_template_ : nullptr;
  s->parse_ctx_.model_name = s->cfg_.model_name;
  s->parse_ctx_.model_aliases = s->cfg_.model_aliases;
  s->parse_ctx_.is_adapter = [p = s.get()](const std::string& m) { return p->is_adapter(m); };
  s->parse_ctx_.n_vocab = info.n_vocab;
  s->parse_ctx_.max_model_len = info.max_model_len;
  s->parse_ctx_.limits = s->cfg_.limits;
  s->parse_ctx_.grammar_cache = &s->grammar_cache_;
  s->responses_ = std::make_unique<ResponseStore>(s->cfg_.responses_store_entries);
  if (const std::string& dir = engine.config().kv_cache_dir; !dir.empty() && info.generates) {
    std::vector<std::string> skipped;
    auto st = SessionStore::open(dir + "/sessions", s->cfg_.max_sessions, &skipped);
    if (!st.ok()) return st.status();
    s->sessions_ = std::move(st.value());
    for (const std::string& f : skipped)
      std::fprintf(stderr, "serval serve: sessions: skipped %s (unreadable, or past --max-sessions)\n", f.c_str());
    // The disk tier's pins live in memory: saved sessions pin their blocks again.
    for (const Session& ss : s->sessions_->all())
      engine.prefix_op(Engine::PrefixOp::pin, ss.tokens, ss.salt, [](Expected<int64_t>) {});
  }
  s->cfg_.observability.model_name = s->cfg_.model_name;
  auto obs = Observability::create(s->cfg_.observability);
  if (!obs.ok()) return obs.status();
  s->obs_ = std::move(obs.value());
  OpenAiServer* raw = s.get();
  s->reaper_ = std::thread([raw] { raw->reaper_loop(); });
  return s;
}

OpenAiServer::~OpenAiServer() {
  {
    std::lock_guard<std::mutex> lk(life_->mu);
    life_->alive = false;
  }
  {
    std::lock_guard<std::mutex> lk(reaper_mu_);
    stop_reaper_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void OpenAiServer::send_json(const std::shared_ptr<http::ResponseChannel>& ch, int status, const std::string& body) {
  ch->send(status, "application/json", body);
}

void OpenAiServer::send_error(const std::shared_ptr<http::ResponseChannel>& ch, const ApiError& e, http::Headers extra) {
  ch->send(e.status, "application/json", e.body(), std::move(extra));
}

void OpenAiServer::method_not_allowed(const std::shared_ptr<http::ResponseChannel>& ch, const char* allow) {
  send_error(ch, method_not_allowed_error(allow), {{"Allow", allow}});
}

int OpenAiServer::key_index(const http::HttpRequest& req) const { return api_key_index(cfg_.api_keys, req); }

void OpenAiServer::begin_drain() { draining_ = true; }

bool OpenAiServer::quiescent() const { return inflight_requests_ == 0 && life_->jobs == 0; }

// Callers hold their own reference to the job (notify lambdas lock a weak
// pointer; the handler and the reaper hold shared pointers), so erasing the
// registry's reference here never destroys the job under its own feet.
void OpenAiServer::job_done(Job& job) {
  inflight_requests_--;
  inflight_tokens_ -= job.reserved_tokens;
  std::lock_guard<std::mutex> lk(mu_);
  jobs_.erase(job.job_id);
}

void OpenAiServer::reaper_loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lk(reaper_mu_);
      if (reaper_cv_.wait_for(lk, std::chrono::milliseconds(100), [this] { return stop_reaper_.load(); })) return;
    }
    std::vector<std::shared_ptr<Job>> expired;
    {
      std::lock_guard<std::mutex> lk(mu_);
      const auto now = clock_type::now();
      for (auto& [id, j] : jobs_)
        if (now > j->deadline) expired.push_back(j);
    }
    for (auto& j : expired) {
      std::lock_guard<std::mutex> lk(j->mu);
      j->fail(ApiError{408, "request exceeded the server's deadline of " + std::to_string(cfg_.request_timeout_s) + " s",
                       "timeout_error", "", "deadline_exceeded"});
    }
  }
}

void OpenAiServer::handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> raw_ch) {
  const std::string& path = req.path;
  auto obs = obs_->begin(req);
  // `plain` answers as is; `ch` is the route's error shape (Anthropic's on /v1/messages).
  auto plain = obs_->wrap(std::move(raw_ch), obs);
  const bool anthropic = path == "/v1/messages" || path == "/v1/messages/count_tokens";
  std::shared_ptr<http::ResponseChannel> ch =
      anthropic ? std::make_shared<ErrorShapeChannel>(plain, &anthropic_error_body) : plain;
  // The page and its files load without a key (the page asks for one); the
  // API calls it makes are checked like any other.
  if (is_webui_path(path)) return serve_webui(req, *ch, cfg_.webui);
  if (path == "/health") {
    if (req.method != "GET") return method_not_allowed(ch, "GET");
    return send_json(ch, 200, R"({"status":"ok"})");
  }
  const int key = key_index(req);
  if (key < 0)
    return send_error(ch, ApiError{401, "missing or invalid API key (Authorization: Bearer ..., or x-api-key)",
                                   "invalid_request_error", "", "invalid_api_key"});
  // Tenants are named by the position of their key (never the key itself).
  obs->set_tenant(cfg_.api_keys.empty() ? "anonymous" : "key" + std::to_string(key + 1));
  if (path == "/ready") {
    if (draining_) return send_error(ch, ApiError{503, "server is draining", "server_error", "", "draining"});
    return send_json(ch, 200, R"({"status":"ready"})");
  }
  if (path == "/metrics") {
    if (req.method != "GET") return method_not_allowed(ch, "GET");
    return ch->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text());
  }
  if (path == "/v1/engine/state") {
    if (req.method != "GET") return method_not_allowed(ch, "GET");
    return handle_engine_state(ch);
  }
  if (cfg_.engine_control && (path == "/v1/engine/pause" || path == "/v1/engine/resume" || path == "/v1/engine/step")) {
    if (req.method != "POST") return method_not_allowed(ch, "POST");
    return handle_engine_control(req, ch);
  }
  if (draining_)
    return send_error(ch, ApiError{503, "server is shutting down; no new requests", "server_error", "", "draining"});
  const bool post = req.method == "POST";
  if (path == "/v1/models") {
    if (req.method != "GET") return method_not_allowed(ch, "GET");
    const EngineInfo info = engine_.info();
    json data = json::array();
    std::vector<std::string> ids = {cfg_.model_name};
    for (size_t i = 0; i < cfg_.listed_aliases && i < cfg_.model_aliases.size(); ++i)
      if (std::find(ids.begin(), ids.end(), cfg_.model_aliases[i]) == ids.end()) ids.push_back(cfg_.model_aliases[i]);
    const int64_t created = unix_now();
    for (const std::string& id : ids)
      data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "serval"},
                      {"max_model_len", info.max_model_len}});
    // LoRA adapters as models of their own, their base as parent (as vLLM lists them).
    for (const LoraInfo& l : engine_.loras())
      data.push_back({{"id", l.name}, {"object", "model"}, {"created", created}, {"owned_by", "serval"},
                      {"root", l.path}, {"parent", cfg_.model_name}, {"max_model_len", info.max_model_len},
                      {"lora", {{"rank", l.rank}, {"scale", l.scale}, {"matrices", l.n_matrices}, {"bytes", l.bytes},
                                {"resident", l.resident}, {"reloads", l.reloads}}}});
    return send_json(ch, 200, dump(json{{"object", "list"}, {"data", data}}));
  }
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_lora_admin(req, ch, path == "/v1/load_lora_adapter");
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_generate(req, std::move(ch), path == "/v1/chat/completions", std::move(obs));
  }
  if (anthropic) {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_messages(req, plain, ch, path == "/v1/messages/count_tokens", std::move(obs));
  }
  if (path == "/v1/responses") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_responses(req, ch, std::move(obs));
  }
  if (path.rfind("/v1/responses/", 0) == 0) {
    if (req.method != "GET" && req.method != "DELETE") return method_not_allowed(ch, "GET, DELETE");
    return handle_stored_response(req, ch);
  }
  if (path == "/v1/embeddings" || path == "/embeddings") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_embed(req, ch, false);
  }
  if (path == "/v1/rerank" || path == "/rerank" || path == "/v1/reranking" || path == "/reranking") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_embed(req, ch, true);
  }
  if (path == "/tokenize") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_tokenize(req, ch);
  }
  if (path == "/detokenize") {
    if (!post) return method_not_allowed(ch, "POST");
    return handle_detokenize(req, ch);
  }
  if (path == "/v1/sessions" || path.rfind("/v1/sessions/", 0) == 0) return handle_session(req, ch);
  if (BatchApi::routes(path)) {
    if (!batch_api_)
      return send_error(ch, ApiError{404, "the Files and Batches APIs are off on this server (see --batch-dir)",
                                     "invalid_request_error", "", "not_found"});
    return batch_api_->handle(req, owner_of(req), ch);
  }
  send_error(ch, ApiError{404, "no route for " + req.method + " " + path, "invalid_request_error", "", "not_found"});
}

bool OpenAiServer::is_adapter(const std::string& name) const {
  if (name.empty()) return false;
  for (const LoraInfo& l : engine_.loras())
    if (l.name == name) return true;
  return false;
}

Status OpenAiServer::check_adapter_name(const std::string& name) const {
  if (name.empty() || name.size() > 256)
    return invalid_argument("lora_name: 1 to 256 characters");
  for (unsigned char ch : name)
    if (ch < 0x20 || ch == 0x7f) return invalid_argument("lora_name: no control characters");
  if (name == cfg_.model_name ||
      std::find(cfg_.model_aliases.begin(), cfg_.model_aliases.end(), name) != cfg_.model_aliases.end())
    return invalid_argument("lora_name: '" + name + "' is the base model's name or an alias");
  return {};
}

// vLLM's runtime adapter routes: POST /v1/load_lora_adapter
// {"lora_name", "lora_path"[, "scale"]} and /v1/unload_lora_adapter
// {"lora_name"}; on only with --lora-runtime (as vLLM needs
// VLLM_ALLOW_RUNTIME_LORA_UPDATING): they read files named by the client.
void OpenAiServer::handle_lora_admin(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch,
                                     bool load) {
  if (!cfg_.lora_runtime)
    return send_error(ch, ApiError{404, "loading LoRA adapters at run time is off on this server (see --lora-runtime)",
                                   "invalid_request_error", "", "not_found"});
  auto pj = parse_json_object(req.body, cfg_.limits.max_json_depth);
  if (auto* e = std::get_if<ApiError>(&pj)) return send_error(ch, *e);
  const auto& j = std::get<nlohmann::ordered_json>(pj);
  for (const auto& [k, v] : j.items())
    if (k != "lora_name" && !(load && (k == "lora_path" || k == "scale")))
      return send_error(ch, bad_request("unknown field '" + k + "'", k));
  auto str = [&](const char* k) -> std::optional<std::string> {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto name = str("lora_name");
  if (!name) return send_error(ch, bad_request("lora_name: expected a string", "lora_name"));
  if (!load) {
    Status st = engine_.unload_lora(*name);
    if (!st.ok())
      return send_error(ch, ApiError{404, "The LoRA adapter '" + *name + "' cannot be found.", "invalid_request_error",
                                     "lora_name", "not_found"});
    return send_json(ch, 200, dump(json{{"object", "lora_adapter"}, {"id", *name}, {"status", "unloaded"},
                                        {"message", "Success: LoRA adapter '" + *name + "' removed successfully."}}));
  }
  if (Status st = check_adapter_name(*name); !st.ok()) return send_error(ch, bad_request(st.message(), "lora_name"));
  const auto path = str("lora_path");
  if (!path || path->empty() || path->size() > 4096)
    return send_error(ch, bad_request("lora_path: expected a file path", "lora_path"));
  float scale = 1.0f;
  if (auto it = j.find("scale"); it != j.end()) {
    if (!it->is_number() || !(it->get<double>() >= -100.0 && it->get<double>() <= 100.0))
      return send_error(ch, bad_request("scale: expected a number in [-100, 100]", "scale"));
    scale = it->get<float>();
  }
  if (is_adapter(*name))
    return send_error(ch, bad_request("The LoRA adapter '" + *name + "' has already been loaded.", "lora_name"));
  Status st = engine_.load_lora(*name, *path, scale);
  if (!st.ok()) {
    ApiError e = bad_request(st.message(), "lora_path");
    if (st.code() == StatusCode::resource_exhausted) e.status = 429;
    return send_error(ch, e);
  }
  return send_json(ch, 200, dump(json{{"object", "lora_adapter"}, {"id", *name}, {"status", "loaded"},
                                      {"message", "Success: LoRA adapter '" + *name + "' added successfully."}}));
}

std::string OpenAiServer::owner_of(const http::HttpRequest& req) const {
  if (cfg_.api_keys.empty()) return "anonymous";
  char buf[32];
  std::snprintf(buf, sizeof buf, "key-%016llx", (unsigned long long)fnv1a64(bearer_token(req)));
  return buf;
}

namespace {

// The response channel of a batch line: the whole response goes to `done`.
class CaptureChannel : public http::ResponseChannel {
 public:
  explicit CaptureChannel(std::function<void(LineReply)> done) : done_(std::move(done)) {}
  void send(int status, std::string, std::string body, http::Headers) override { finish(status, std::move(body)); }
  void start_stream(int, std::string, http::Headers) override {}  // lines are never streamed
  void write(std::string) override {}
  void end() override { finish(500, R"({"error":{"message":"unexpected streamed response","type":"server_error"}})"); }
  void on_disconnect(std::function<void()> fn) override {
    bool now = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (cancelled_) now = true;
      else on_disconnect_ = std::move(fn);
    }
    if (now && fn) fn();
  }
  bool disconnected() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return cancelled_;
  }
  void cancel() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (cancelled_) return;
      cancelled_ = true;
      fn = std::move(on_disconnect_);
    }
    if (fn) fn();
  }

 private:
  void finish(int status, std::string body) {
    std::function<void(LineReply)> done;
    {
      std::lock_guard<std::mutex> lk(mu_);
      done = std::move(done_);
      done_ = nullptr;
    }
    if (done) done(LineReply{status, std::move(body)});
  }
  mutable std::mutex mu_;
  std::function<void(LineReply)> done_;
  std::function<void()> on_disconnect_;
  bool cancelled_ = false;
};

}  // namespace

std::function<void()> OpenAiServer::execute_line(const LineCall& call, std::function<void(LineReply)> done) {
  auto cap = std::make_shared<CaptureChannel>(std::move(done));
  std::function<void()> cancel = [cap] { cap->cancel(); };
  http::HttpRequest req;
  req.method = "POST";
  req.path = call.url;
  req.body = call.body;
  req.remote = "batch";
  auto obs = obs_->begin(req);
  obs->set_tenant("batch");
  auto ch = obs_->wrap(cap, obs);
  if (draining_) {
    send_error(ch, ApiError{503, "server is shutting down; no new requests", "server_error", "", "draining"});
    return cancel;
  }
  InternalCall ic;
  ic.priority = kBatchPriority;
  if (!cfg_.api_keys.empty() && !cfg_.shared_prefix_cache && call.owner.rfind("key-", 0) == 0) {
    ic.salt = std::strtoull(call.owner.c_str() + 4, nullptr, 16);
    if (ic.salt == 0) ic.salt = 1;
  }
  const bool chat = call.url == "/v1/chat/completions";
  if (!chat && call.url != "/v1/completions") {
    send_error(ch, bad_request("url: not a batch endpoint", "url"));
    return cancel;
  }
  handle_generate(req, ch, chat, std::move(obs), &ic);
  return cancel;
}

void OpenAiServer::handle_generate(const http::HttpRequest& http_req, std::shared_ptr<http::ResponseChannel> ch,
                                   bool chat, std::shared_ptr<RequestObservation> obs, const InternalCall* internal,
                                   ApiTranslator* translator) {
  obs->set_generation(false);
  if (!engine_info_.generates)
    return send_error(ch, bad_request("model: '" + cfg_.model_name + "' is an embedding model (" +
                                          engine_info_.architecture + "); it does not generate text (use " +
                                          (engine_info_.pooling == Pooling::rank ? "/v1/rerank" : "/v1/embeddings") + ")",
                                      "model", "model_not_supported"));
  auto parsed = parse_openai_request(http_req.body, chat, parse_ctx_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ch, *e);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);
  if (translator) {
    int64_t n = 0;
    for (const auto& p : r.prompts) n += (int64_t)p.size();
    translator->set_prompt_tokens(n);
  }
  if (internal) {  // a batch line: one JSON response, behind interactive requests
    r.stream = false;
    r.include_usage = false;
    r.priority = internal->priority;
  }

  // Admission: bounded requests and tokens in flight; past them, 429 with a
  // Retry-After estimated from the current drain rate.
  const int64_t max_len = parse_ctx_.max_model_len;
  int64_t need = 0, prompt_total = 0;
  for (const auto& p : r.prompts) {
    const int64_t gen = r.params.max_tokens ? *r.params.max_tokens : max_len - (int64_t)p.size();
    need += ((int64_t)p.size() + gen) * r.n;
    prompt_total += (int64_t)p.size();
  }
  const size_t reqs = ++inflight_requests_;
  const int64_t toks = (inflight_tokens_ += need);
  if (reqs > cfg_.max_inflight_requests || (toks > cfg_.max_inflight_tokens && reqs > 1)) {
    --inflight_requests_;
    inflight_tokens_ -= need;
    const EngineStats st = engine_.stats();
    const double up = std::chrono::duration<double>(clock_type::now() - started_).count();
    const double rate = up > 0 ? (double)st.generated_tokens / up : 0;
    const int64_t retry = rate > 1 ? std::clamp<int64_t>((int64_t)std::ceil((double)toks / rate), 1, 600) : 5;
    return send_error(ch, ApiError{429, "server is at capacity (" + std::to_string(reqs - 1) + " requests, " +
                                            std::to_string(toks - need) + " tokens in flight); retry later",
                                   "rate_limit_error", "", "rate_limit_exceeded"},
                      {{"Retry-After", std::to_string(retry)}});
  }

  const uint64_t salt = internal ? internal->salt : tenant_salt(cfg_, http_req);
  auto job = std::make_shared<Job>();
  life_->jobs++;
  job->counted.life = life_;
  job->srv = this;
  job->id = random_id(chat ? "chatcmpl" : "cmpl");
  job->created = unix_now();
  job->ch = ch;
  job->obs = obs;
  obs->set_generation(r.stream);
  job->reserved_tokens = need;
  job->prompt_tokens = prompt_total;
  job->choices.resize(r.prompts.size() * (size_t)r.n);
  job->prompt_lp_done.assign(r.prompts.size(), false);
  job->prompt_lp_json.assign(r.prompts.size(), json(nullptr));
  if (r.score_only && r.prompt_logprobs < 0) r.prompt_logprobs = 0;  // echo, max_tokens 0: still one prefill
  // Output constrained to JSON or a tool call cannot think first: reasoning
  // is split off where the model writes freely or under a user's own
  // grammar / regex / choice (which may well spell out the <think> block).
  const bool json_only = r.constraint == "tools" || r.constraint == "response_format" || r.constraint == "guided_json";
  if (r.chat && reasoning_ && !json_only)
    for (size_t i = 0; i < job->choices.size(); ++i)
      job->choices[i].think.emplace(prompt_opens_reasoning(r.prompt_texts[i / (size_t)r.n]));
  if (r.chat && r.tools != ToolMode::off && r.tool_format != ToolCallFormat::none && r.stream)
    for (auto& c : job->choices) c.native.emplace(r.tool_format, r.tool_names, r.tool_prefix);
  if (cfg_.request_timeout_s > 0)
    job->deadline = clock_type::now() + std::chrono::milliseconds((int64_t)(cfg_.request_timeout_s * 1000));
  job->req = std::move(r);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job->job_id = next_job_++;
    jobs_[job->job_id] = job;
  }

  {
    std::lock_guard<std::mutex> lk(job->mu);
    for (const auto& p : job->req.prompts) {
      Request er;
      er.prompt = p;
      er.params = job->req.params;
      er.n = job->req.n;
      er.priority = job->req.priority;
      er.tenant_salt = salt;
      er.prompt_logprobs = job->req.prompt_logprobs;
      if (is_adapter(job->req.model)) er.lora = job->req.model;
      auto s = engine_.submit(std::move(er));
      if (!s.ok()) return job->fail(from_status(s.status()));
      job->streams.push_back(*s);
    }
    if (job->req.stream) {
      ch->start_stream(200, "text/event-stream");
      if (job->req.echo && !job->req.logprobs) {  // with logprobs: on_prompt_logprobs() writes it
        for (size_t i = 0; i < job->choices.size(); ++i) {
          json chunk = job->chunk_base();
          chunk["choices"] = json::array({{{"index", i}, {"text", job->req.prompt_texts[i / (size_t)job->req.n]},
                                          {"logprobs", nullptr}, {"finish_reason", nullptr}}});
          job->write_event(chunk);
        }
      }
    }
    std::weak_ptr<Job> weak = job;
    ch->on_disconnect([weak] {
      if (auto j = weak.lock()) j->cancel_all();
    });
    for (auto& s : job->streams)
      s->set_notify([weak] {
        if (auto j = weak.lock()) j->pump();
      });
  }
  // Events that arrived before the notifiers were set are drained here; the
  // job stays alive through jobs_ until it completes.
  job->pump();
}

void OpenAiServer::handle_messages(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& plain,
                                   const std::shared_ptr<http::ResponseChannel>& ch, bool count_tokens,
                                   std::shared_ptr<RequestObservation> obs) {
  auto a = anthropic_to_chat(req.body, count_tokens, cfg_.limits.max_json_depth);
  if (auto* e = std::get_if<ApiError>(&a)) return send_error(ch, *e);
  AnthropicRequest& ar = std::get<AnthropicRequest>(a);
  if (count_tokens) {
    auto parsed = parse_openai_request(dump(ar.chat), true, parse_ctx_);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ch, *e);
    return send_json(ch, 200, dump(json{{"input_tokens", std::get<ParsedRequest>(parsed).prompts[0].size()}}));
  }
  auto translator = std::make_shared<AnthropicTranslator>(ar.model);
  http::HttpRequest chat_req = req;
  chat_req.body = dump(ar.chat);
  handle_generate(chat_req, std::make_shared<TranslatingChannel>(plain, translator), true, std::move(obs), nullptr,
                  translator.get());
}

void OpenAiServer::handle_responses(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch,
                                    std::shared_ptr<RequestObservation> obs) {
  const std::string owner = owner_of(req);
  auto parsed = responses_to_chat(req.body, cfg_.limits.max_json_depth, *responses_, owner);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ch, *e);
  ResponsesRequest& rr = std::get<ResponsesRequest>(parsed);
  http::HttpRequest chat_req = req;
  chat_req.body = dump(rr.chat);
  auto translator = std::make_shared<ResponsesTranslator>(std::move(rr), responses_.get(), owner);
  handle_generate(chat_req, std::make_shared<TranslatingChannel>(ch, translator), true, std::move(obs), nullptr,
                  translator.get());
}

void OpenAiServer::handle_stored_response(const http::HttpRequest& req,
                                          const std::shared_ptr<http::ResponseChannel>& ch) {
  const std::string id = req.path.substr(std::string("/v1/responses/").size());
  const std::string owner = owner_of(req);
  auto not_found = [&] {
    send_error(ch, ApiError{404, "no stored response with id '" + id + "'", "invalid_request_error", "", "not_found"});
  };
  if (req.method == "DELETE") {
    if (!responses_->erase(id, owner)) return not_found();
    return send_json(ch, 200, dump(json{{"id", id}, {"object", "response"}, {"deleted", true}}));
  }
  auto e = responses_->get(id, owner);
  if (!e) return not_found();
  send_json(ch, 200, dump(e->response));
}

void OpenAiServer::handle_embed(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch,
                                bool rerank) {
  const EngineInfo& info = engine_info_;
  const std::string name = "'" + cfg_.model_name + "'";
  if (info.pooling == Pooling::none)
    return send_error(ch, bad_request("model: " + name +
                                          " does not produce embeddings (a generation model; serve it with --pooling "
                                          "mean|cls|last to embed with it)",
                                      "model", "model_not_supported"));
  if (rerank && info.pooling != Pooling::rank)
    return send_error(ch, bad_request("model: " + name + " is not a reranker (its pooling is " +
                                          pooling_name(info.pooling) + "; use /v1/embeddings)",
                                      "model", "model_not_supported"));
  if (!rerank && info.pooling == Pooling::rank)
    return send_error(ch, bad_request("model: " + name + " is a reranker: it scores pairs (use /v1/rerank)", "model",
                                      "model_not_supported"));
  const int64_t max_inputs = engine_.config().max_embed_inputs;
  EmbedRequest er;
  std::shared_ptr<EmbeddingsRequest> emb;
  std::shared_ptr<RerankRequest> rr;
  // The inputs move to the engine; the parsed request keeps what the response needs.
  if (rerank) {
    auto p = parse_rerank_request(req.body, parse_ctx_, max_inputs, info.max_embed_len);
    if (auto* e = std::get_if<ApiError>(&p)) return send_error(ch, *e);
    rr = std::make_shared<RerankRequest>(std::move(std::get<RerankRequest>(p)));
    er.inputs = std::move(rr->inputs);
  } else {
    auto p = parse_embeddings_request(req.body, parse_ctx_, max_inputs, info.max_embed_len, info.embedding_dim);
    if (auto* e = std::get_if<ApiError>(&p)) return send_error(ch, *e);
    emb = std::make_shared<EmbeddingsRequest>(std::move(std::get<EmbeddingsRequest>(p)));
    er.inputs = std::move(emb->inputs);
  }
  if (const std::string& m = rr ? rr->model : emb->model; is_adapter(m))
    return send_error(ch, bad_request("model: '" + m + "' is a LoRA adapter: adapters generate, they do not embed",
                                      "model", "model_not_supported"));
  // Admission: embeddings count against the same bounds as generation.
  int64_t need = 0;
  for (const auto& in : er.inputs) need += (int64_t)in.size();
  if (!admit(ch, need)) return;
  auto release = [this, need] { unadmit(need); };
  auto h = engine_.embed(std::move(er));
  if (!h.ok()) {
    release();
    Status st = h.status();
    // The engine names inputs; a rerank request's inputs are its documents.
    if (rr && st.message().rfind("input[", 0) == 0) st = Status(st.code(), "documents" + st.message().substr(5));
    return send_error(ch, from_status(st));
  }
  std::shared_ptr<EmbedHandle> handle = *h;
  std::weak_ptr<EmbedHandle> weak = handle;
  ch->on_disconnect([weak] {
    if (auto hh = weak.lock()) hh->cancel();
  });
  // Runs once, on the engine thread (or here, if already done); a server
  // destroyed meanwhile (life_->alive false) is not touched.
  handle->set_notify([this, life = life_, ch, handle, emb, rr, release] {
    std::lock_guard<std::mutex> lk(life->mu);
    if (!life->alive) return;
    release();
    if (!handle->error.ok()) return send_error(ch, from_status(handle->error));
    send_json(ch, 200, rr ? rerank_response(*rr, *handle) : embeddings_response(*emb, *handle));
  });
}

namespace {

json session_json(const Session& s) {
  return {{"id", s.id},
          {"object", "session"},
          {"created", s.created},
          {"tokens", (int64_t)s.tokens.size()},
          {"saved_tokens", s.saved_tokens}};
}

}  // namespace

void OpenAiServer::handle_session(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch) {
  if (!sessions_)
    return send_error(ch, ApiError{400, "sessions need the disk tier of the KV cache (serve with --kv-cache-dir)",
                                   "invalid_request_error", "", "sessions_disabled"});
  const std::string owner = owner_of(req);
  const std::string rest = req.path.size() > 13 ? req.path.substr(13) : "";  // after "/v1/sessions/"
  if (req.path == "/v1/sessions") {
    if (req.method != "GET") return method_not_allowed(ch, "GET");
    json data = json::array();
    for (const Session& ss : sessions_->list(owner)) data.push_back(session_json(ss));
    return send_json(ch, 200, dump(json{{"object", "list"}, {"data", data}}));
  }
  std::string id = rest, action;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    id = rest.substr(0, slash);
    action = rest.substr(slash + 1);
  }
  if (!valid_session_id(id))
    return send_error(ch, bad_request("session id: 1 to 128 of A-Z a-z 0-9 _ . - (not starting with '.')", "id"));
  if (action == "save") {
    if (req.method != "POST") return method_not_allowed(ch, "POST");
    return save_session(req, ch, id);
  }
  const std::optional<Session> found = sessions_->get(owner, id);
  if (!found && (action.empty() || action == "restore"))
    return send_error(ch, ApiError{404, "no session '" + id + "'", "invalid_request_error", "id", "not_found"});
  if (action == "restore") {
    if (req.method != "POST") return method_not_allowed(ch, "POST");
    const Session ss = *found;
    return engine_.prefix_op(Engine::PrefixOp::restore, ss.tokens, ss.salt,
                             [this, life = life_, ch, ss](Expected<int64_t> n) {
                               std::lock_guard<std::mutex> lk(life->mu);
                               if (!life->alive) return;
                               if (!n.ok()) return send_error(ch, from_status(n.status()));
                               json j = session_json(ss);
                               j["restored_tokens"] = *n;
                               send_json(ch, 200, dump(j));
                             });
  }
  if (!action.empty())
    return send_error(ch, ApiError{404, "no route for " + req.method + " " + req.path, "invalid_request_error", "",
                                   "not_found"});
  if (req.method == "GET") return send_json(ch, 200, dump(session_json(*found)));
  if (req.method != "DELETE") return method_not_allowed(ch, "GET, DELETE");
  sessions_->erase(owner, id);
  engine_.prefix_op(Engine::PrefixOp::unpin, found->tokens, found->salt, [](Expected<int64_t>) {});
  send_json(ch, 200, dump(json{{"id", id}, {"object", "session.deleted"}, {"deleted", true}}));
}

// Save: the body is a completions or chat completions body (its prompt, as
// that request would build it: "add_generation_prompt": false leaves the
// assistant header off). The prompt runs as a one-token request (prefix hits
// count; the rest is computed and cached), then its full blocks are pinned.
void OpenAiServer::save_session(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch,
                                const std::string& id) {
  json body;
  if (auto err = body_object(req.body, cfg_.limits.max_json_depth, &body)) return send_error(ch, *err);
  const bool chat = body.contains("messages");
  auto parsed = parse_openai_request(req.body, chat, parse_ctx_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ch, *e);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);
  if (r.prompts.size() != 1) return send_error(ch, bad_request("prompt: a session saves one prompt", "prompt"));
  Session ss;
  ss.id = id;
  ss.owner = owner_of(req);
  ss.salt = tenant_salt(cfg_, req);
  ss.tokens = r.prompts[0];
  ss.created = unix_now();
  const int64_t need = (int64_t)ss.tokens.size() + 1;
  if (!admit(ch, need)) return;
  auto release = [this, need] { unadmit(need); };
  Request er;
  er.prompt = ss.tokens;
  er.params.temperature = 0;
  er.params.max_tokens = 1;
  er.params.ignore_eos = true;
  er.tenant_salt = ss.salt;
  er.speculate = false;
  auto sub = engine_.submit(std::move(er));
  if (!sub.ok()) {
    release();
    return send_error(ch, from_status(sub.status()));
  }
  std::shared_ptr<RequestStream> stream = *sub;
  // Called from the engine thread (notify) and once here: one at a time.
  struct Progress {
    std::mutex mu;
    Status err;
    bool fired = false;
  };
  auto prog = std::make_shared<Progress>();
  // The stream holds this callback: a weak reference avoids a cycle (the
  // engine keeps the stream alive while it can still notify).
  auto on_event = [this, life = life_, ch, weak = std::weak_ptr<RequestStream>(stream), prog, ss, release]() mutable {
    const std::shared_ptr<RequestStream> stream = weak.lock();
    if (!stream) return;
    std::lock_guard<std::mutex> plk(prog->mu);
    OutputEvent ev;
    while (stream->next_for(&ev, 0))
      if (!ev.error.ok()) prog->err = ev.error;
    if (prog->fired || (!stream->done() && prog->err.ok())) return;
    prog->fired = true;
    const Status err = prog->err;
    if (!err.ok()) {
      std::lock_guard<std::mutex> lk(life->mu);
      if (!life->alive) return;
      release();
      return send_error(ch, from_status(err));
    }
    engine_.prefix_op(Engine::PrefixOp::pin, ss.tokens, ss.salt,
                      [this, life, ch, ss, release](Expected<int64_t> n) mutable {
                        std::lock_guard<std::mutex> lk(life->mu);
                        if (!life->alive) return;
                        release();
                        if (!n.ok()) return send_error(ch, from_status(n.status()));
                        ss.saved_tokens = *n;
                        const std::optional<Session> old = sessions_->get(ss.owner, ss.id);
                        if (Status st = sessions_->put(ss); !st.ok()) {
                          engine_.prefix_op(Engine::PrefixOp::unpin, ss.tokens, ss.salt, [](Expected<int64_t>) {});
                          return send_error(ch, from_status(st));
                        }
                        if (old)  // replaced: its pins go (the new ones are taken already)
                          engine_.prefix_op(Engine::PrefixOp::unpin, old->tokens, old->salt, [](Expected<int64_t>) {});
                        send_json(ch, 200, dump(session_json(ss)));
                      });
  };
  stream->set_notify(on_event);
  on_event();  // events queued before the notify was set
}

bool OpenAiServer::admit(const std::shared_ptr<http::ResponseChannel>& ch, int64_t need) {
  const size_t reqs = ++inflight_requests_;
  const int64_t toks = (inflight_tokens_ += need);
  if (reqs <= cfg_.max_inflight_requests && (toks <= cfg_.max_inflight_tokens || reqs == 1)) return true;
  unadmit(need);
  send_error(ch, ApiError{429, "server is at capacity (" + std::to_string(reqs - 1) + " requests, " +
                                   std::to_string(toks - need) + " tokens in flight); retry later",
                          "rate_limit_error", "", "rate_limit_exceeded"},
             {{"Retry-After", "1"}});
  return false;
}

void OpenAiServer::unadmit(int64_t need) {
  --inflight_requests_;
  inflight_tokens_ -= need;
}

void OpenAiServer::handle_tokenize(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch) {
  json j;
  if (auto err = body_object(req.body, cfg_.limits.max_json_depth, &j)) return send_error(ch, *err);
  const Tokenizer& tok = engine_.tokenizer();
  bool add_special = true;
  if (j.contains("add_special")) {
    if (!j["add_special"].is_boolean()) return send_error(ch, bad_request("add_special: expected a boolean", "add_special"));
    add_special = j["add_special"].get<bool>();
  }
  std::vector<TokenId> ids;
  if (j.contains("prompt") && j["prompt"].is_string()) {
    ids = tok.encode(j["prompt"].get<std::string>(), add_special && tok.add_bos(), true);
  } else if (j.contains("messages")) {
    std::string body = req.body;
    auto parsed = parse_openai_request(body, true, parse_ctx_);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ch, *e);
    ids = std::get<ParsedRequest>(parsed).prompts[0];
  } else {
    return send_error(ch, bad_request("prompt: expected a string (or messages)", "prompt"));
  }
  json pieces = json::array();
  for (TokenId t : ids) pieces.push_back(tok.token_to_piece(t, true));
  send_json(ch, 200,
            dump(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", parse_ctx_.max_model_len},
                      {"token_strs", pieces}}));
}

void OpenAiServer::handle_detokenize(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch) {
  json j;
  if (auto err = body_object(req.body, cfg_.limits.max_json_depth, &j)) return send_error(ch, *err);
  if (!j.contains("tokens") || !j["tokens"].is_array())
    return send_error(ch, bad_request("tokens: expected an array of token ids", "tokens"));
  std::vector<TokenId> ids;
  for (const auto& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= parse_ctx_.n_vocab)
      return send_error(ch, bad_request("tokens: ids must be integers in [0, " + std::to_string(parse_ctx_.n_vocab) + ")",
                                        "tokens", "invalid_token_id"));
    ids.push_back((TokenId)t.get<int64_t>());
  }
  // The text /tokenize would have been given: its space prefix goes, BOS or not.
  send_json(ch, 200, dump(json{{"prompt", engine_.tokenizer().decode(ids, false, /*whole_text=*/true)}}));
}

std::string OpenAiServer::metrics_text() const {
  const EngineStats s = engine_.stats();
  obs_->set_engine_busy_s(s.step_seconds);
  metrics::ExpositionWriter w;
  obs_->write_metrics(w, s, inflight_requests_.load());
  if (cfg_.metrics_vllm_names) obs_->write_vllm_aliases(w, s, engine_.config().block_size);
  return w.take();
}

void OpenAiServer::handle_engine_control(const http::HttpRequest& req,
                                         const std::shared_ptr<http::ResponseChannel>& ch) {
  if (req.path == "/v1/engine/pause") {
    engine_.pause();
  } else if (req.path == "/v1/engine/resume") {
    engine_.resume();
  } else {  // step
    if (!engine_.paused())
      return send_error(ch, ApiError{409, "the engine is not paused (POST /v1/engine/pause first)",
                                     "invalid_request_error", "", "not_paused"});
    int64_t steps = 1;
    if (!req.body.empty()) {
      json body;
      if (auto err = body_object(req.body, cfg_.limits.max_json_depth, &body)) return send_error(ch, *err);
      if (body.contains("steps")) {
        const json& v = body["steps"];
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1000)
          return send_error(ch, ApiError{400, "'steps' must be an integer in [1, 1000]", "invalid_request_error",
                                         "steps", "invalid_value"});
        steps = v.get<int64_t>();
      }
    }
    engine_.step((int)steps);
  }
  send_json(ch, 200, dump(json{{"paused", engine_.paused()}}));
}

void OpenAiServer::handle_engine_state(const std::shared_ptr<http::ResponseChannel>& ch) {
  const EngineStats s = engine_.stats();
  // The API requests in flight, oldest first (bounded; the count is exact).
  constexpr size_t kMaxListed = 256;
  std::vector<std::shared_ptr<Job>> jobs;
  size_t n_jobs = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    n_jobs = jobs_.size();
    for (const auto& [id, j] : jobs_) {
      if (jobs.size() == kMaxListed) break;
      jobs.push_back(j);
    }
  }
  json list = json::array();
  for (const auto& j : jobs) {
    const RequestObservation::Progress p = j->obs->progress();
    list.push_back({{"id", j->id},
                    {"request_id", p.request_id},
                    {"tenant", p.tenant},
                    {"phase", p.first_token ? "generating" : "queued_or_prefill"},
                    {"age_s", p.age_s},
                    {"stream", p.stream},
                    {"completion_tokens", p.completion_tokens},
                    {"prompt_tokens", j->prompt_tokens}});
  }
  const double hit_rate = s.prefix_query_tokens ? (double)s.prefix_hit_tokens / (double)s.prefix_query_tokens : 0.0;
  json j = {{"model", cfg_.model_name},
            {"requests",
             {{"running", s.running},
              {"waiting", s.waiting},
              {"http_in_flight", inflight_requests_.load()},
              {"in_flight", list},
              {"in_flight_listed", list.size()},
              {"in_flight_total", n_jobs}}},
            {"kv_cache",
             {{"blocks_used", s.kv_blocks_used},
              {"blocks_total", s.kv_blocks_total},
              {"blocks_peak", s.kv_blocks_peak},
              {"usage_ratio", s.kv_blocks_total ? (double)s.kv_blocks_used / s.kv_blocks_total : 0.0},
              {"block_size", engine_.config().block_size},
              {"type", kv_type_name(engine_.config().kv_type)},
              {"bytes_per_token", engine_.info().kv_bytes_per_token}}},
            {"prefix_cache",
             {{"enabled", engine_.config().enable_prefix_caching},
              {"cached_blocks", s.prefix_cached_blocks},
              {"query_tokens", s.prefix_query_tokens},
              {"hit_tokens", s.prefix_hit_tokens},
              {"hit_rate", hit_rate},
              {"tier_hit_tokens", s.tier_hit_tokens}}},
            {"kv_tiers",
             {{"enabled", s.kv_tiers.block_bytes > 0},
              {"block_bytes", s.kv_tiers.block_bytes},
              {"ram", {{"capacity_blocks", s.kv_tiers.ram_capacity_blocks},
                       {"blocks", s.kv_tiers.ram_blocks},
                       {"hits", s.kv_tiers.ram_hits},
                       {"misses", s.kv_tiers.ram_misses},
                       {"evictions", s.kv_tiers.ram_evictions}}},
              {"disk", {{"budget_bytes", s.kv_tiers.disk_budget_bytes},
                        {"bytes", s.kv_tiers.disk_bytes},
                        {"files", s.kv_tiers.disk_files},
                        {"hits", s.kv_tiers.disk_hits},
                        {"misses", s.kv_tiers.disk_misses},
                        {"writes", s.kv_tiers.disk_writes},
                        {"write_drops", s.kv_tiers.disk_write_drops},
                        {"evictions", s.kv_tiers.disk_evictions},
                        {"corrupt", s.kv_tiers.disk_corrupt},
                        {"foreign", s.kv_tiers.disk_foreign},
                        {"recovered", s.kv_tiers.disk_recovered},
                        {"pinned", s.kv_tiers.disk_pinned},
                        {"prefetches", s.kv_tiers.disk_prefetches},
                        {"staged_reads", s.kv_tiers.disk_staged_reads},
                        {"staged_loads", s.kv_tiers.disk_staged_loads},
                        {"staged_drops", s.kv_tiers.disk_staged_drops},
                        {"staged_bytes", s.kv_tiers.disk_staged_bytes}}},
              {"promotions", s.kv_tiers.loads},
              {"promotion_seconds", s.kv_tiers.load_seconds},
              {"load_failures", s.tier_load_failures}}},
            {"totals",
             {{"steps", s.steps},
              {"requests_finished", s.requests_finished},
              {"prompt_tokens", s.prompt_tokens},
              {"generated_tokens", s.generated_tokens},
              {"preemptions", s.preemptions}}},
            {"draining", draining_.load()}};
  // Latency histograms as cumulative bucket counts: the dashboard takes
  // percentiles over a sliding window from the differences between polls.
  json latency = json::object();
  for (const auto& [name, h] : obs_->latency_histograms()) {
    const metrics::Histogram::Snapshot snap = h->snapshot();
    latency[name] = {{"bounds", h->bounds()}, {"cumulative", snap.cumulative}, {"sum", snap.sum}};
  }
  j["latency"] = std::move(latency);
  const EngineConfig& ec = engine_.config();
  const EngineInfo info = engine_.info();
  j["config"] = {{"architecture", info.architecture},
                 {"context", info.max_model_len},
                 {"threads", ec.n_threads > 0 ? ec.n_threads : ThreadPool::default_threads()},
                 {"max_seqs", ec.max_seqs},
                 {"max_batch_tokens", ec.max_batch_tokens},
                 {"chunked_prefill", ec.enable_chunked_prefill},
                 {"kv_memory_bytes", ec.kv_memory_bytes},
                 {"kv_type", kv_type_name(ec.kv_type)},
                 {"block_size", ec.block_size},
                 {"prefix_caching", ec.enable_prefix_caching},
                 {"kv_cache_ram_bytes", ec.kv_cache_ram_bytes},
                 {"kv_cache_dir", ec.kv_cache_dir},
                 {"speculative", ec.spec.mode == SpecConfig::Mode::none        ? "off"
                                 : ec.spec.mode == SpecConfig::Mode::ngram ? "ngram"
                                                                           : "draft model"}};
  j["build"] = {{"version", SERVAL_VERSION_STRING},
                {"compiler", __VERSION__},
                {"kernels", info.kernels},
                {"uptime_s", std::chrono::duration<double>(clock_type::now() - started_).count()}};
  send_json(ch, 200, dump(j));
}

}  // namespace serval::server
