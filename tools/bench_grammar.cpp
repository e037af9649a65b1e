// serval bench grammar: the cost of constrained decoding.
//
// Interleaves R runs of one request generating G tokens without a grammar
// and with one (default: any JSON object), on the engine, and reports the
// median per-token decode time of each. Then replays the constrained run's
// tokens through a fresh GrammarMatcher and times, per token, the work
// constrained decoding adds: the mask (trie walk or cache hit), applying it
// in the sampler, and advancing the state. The headline figure is that time
// as a percentage of the unconstrained decode time per token; the uncached
// figure (every mask a full trie walk) is the worst case.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "engine/token_trie_for.h"
#include "load_model.h"
#include "sampler/grammar/grammar.h"
#include "sampler/grammar/matcher.h"
#include "sampler/sampler.h"
#include "serval/engine.h"

namespace serval::cli {
namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Run {
  double ms_per_token = 0;  // request wall time / tokens (the prompt is a few tokens)
  std::vector<TokenId> tokens;
};

Run generate(Engine& engine, const std::vector<TokenId>& prompt, const SamplingParams& params) {
  Request r;
  r.prompt = prompt;
  r.params = params;
  Run out;
  auto st = engine.submit(std::move(r));
  if (!st.ok()) {
    std::fprintf(stderr, "serval bench grammar: %s\n", st.status().message().c_str());
    std::exit(1);
  }
  OutputEvent ev;
  const clock_type::time_point start = clock_type::now();
  clock_type::time_point last = start;
  int n = 0;
  while ((*st)->next(&ev)) {
    if (!ev.error.ok()) {
      std::fprintf(stderr, "serval bench grammar: %s\n", ev.error.message().c_str());
      std::exit(1);
    }
    last = clock_type::now();
    ++n;
    out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
  }
  if (n > 0) out.ms_per_token = std::chrono::duration<double, std::milli>(last - start).count() / n;
  return out;
}

struct Replay {
  double mask_ms = 0, apply_ms = 0, accept_ms = 0, max_mask_ms = 0;
};

// Per-token means over the replay of `tokens`.
Replay replay(const GrammarPtr& g, const std::shared_ptr<const TokenTrie>& trie, const std::vector<TokenId>& tokens,
              bool cache, int32_t n_vocab) {
  GrammarMatcher m(g, trie);
  m.set_mask_cache(cache);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  Sampler plain(p, n_vocab), masked(p, n_vocab);
  std::vector<float> logits((size_t)n_vocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float& x : logits) x = nd(rng);
  std::vector<uint64_t> bits;
  Replay r;
  double plain_ms = 0;
  for (TokenId t : tokens) {
    const auto t0 = clock_type::now();
    m.fill_mask(bits);
    const auto t1 = clock_type::now();
    masked.sample(logits, {}, bits);
    const auto t2 = clock_type::now();
    plain.sample(logits, {});
    const auto t3 = clock_type::now();
    m.accept_token(t);
    const auto t4 = clock_type::now();
    const double mask = std::chrono::duration<double, std::milli>(t1 - t0).count();
    r.mask_ms += mask;
    r.max_mask_ms = std::max(r.max_mask_ms, mask);
    r.apply_ms += std::chrono::duration<double, std::milli>(t2 - t1).count();
    plain_ms += std::chrono::duration<double, std::milli>(t3 - t2).count();
    r.accept_ms += std::chrono::duration<double, std::milli>(t4 - t3).count();
  }
  const double n = (double)std::max<size_t>(1, tokens.size());
  r.mask_ms /= n;
  r.apply_ms = std::max(0.0, r.apply_ms - plain_ms) / n;  // the extra sampler cost of the mask
  r.accept_ms /= n;
  return r;
}

}  // namespace

int cmd_bench_grammar(int argc, char** argv) {
  const std::string cmd = "serval bench grammar";
  CLI::App app("Constrained-decoding overhead: decode time per token with and without a grammar, and the "
               "grammar's own time per token (mask + advance) replayed on the generated tokens", cmd);
  std::string model_path, grammar_file, schema_file, prompt_text = "Once upon a time";
  int gen_len = 64, runs = 3, threads = 0;
  uint64_t seed = 1;
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("--grammar", grammar_file, "GBNF file (default: any JSON object)");
  app.add_option("--schema", schema_file, "JSON Schema file instead of --grammar");
  app.add_option("--gen-len", gen_len, "tokens per request")->check(CLI::Range(2, 4096));
  app.add_option("--runs", runs, "runs of each (medians are reported)")->check(CLI::Range(1, 100));
  app.add_option("--prompt", prompt_text, "prompt text");
  app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  app.add_option("--seed", seed, "sampling seed");
  if (auto rc = parse(app, argc, argv)) return *rc;

  Expected<GrammarPtr> g = Status(StatusCode::internal, "unset");
  std::string source = "any JSON object";
  if (!grammar_file.empty() || !schema_file.empty()) {
    const std::string& path = grammar_file.empty() ? schema_file : grammar_file;
    std::string text;
    if (!read_file(path, text)) return fail(cmd, "cannot read '" + path + "'");
    g = grammar_file.empty() ? compile_json_schema(text) : compile_gbnf(text);
    source = path;
  } else {
    g = compile_json_object();
  }
  if (!g.ok()) return fail(cmd, g.status().message());

  auto loaded = load_model(cmd, model_path);
  if (!loaded) return 2;
  const Tokenizer& tok = *loaded->tok;
  EngineConfig ec;
  ec.n_threads = threads;
  ec.kv_memory_bytes = 256u << 20;
  ec.max_model_len = std::min<int64_t>(loaded->model->config().n_ctx_train, 4096);
  auto engine = Engine::create(loaded->model, tok, ec);
  if (!engine.ok()) return fail(cmd, engine.status().message());
  const std::vector<TokenId> prompt = tok.encode(prompt_text, tok.add_bos(), false);
  if ((int64_t)prompt.size() + gen_len >= ec.max_model_len) return fail(cmd, "--gen-len exceeds the context");

  SamplingParams plain;
  plain.temperature = 1.0f;
  plain.seed = seed;
  plain.max_tokens = gen_len;
  plain.ignore_eos = true;
  SamplingParams constrained = plain;
  constrained.ignore_eos = false;
  constrained.grammar = *g;
  generate(**engine, prompt, plain);  // warm-up
  std::vector<double> t_plain, t_grammar;
  Run last;
  for (int i = 0; i < runs; ++i) {
    t_plain.push_back(generate(**engine, prompt, plain).ms_per_token);
    last = generate(**engine, prompt, constrained);
    t_grammar.push_back(last.ms_per_token);
  }
  auto trie = token_trie_for(tok);
  std::vector<double> mask_c, mask_u, apply, accept, max_u;
  for (int i = 0; i < runs; ++i) {
    Replay c = replay(*g, trie, last.tokens, true, tok.n_vocab());
    Replay u = replay(*g, trie, last.tokens, false, tok.n_vocab());
    mask_c.push_back(c.mask_ms);
    mask_u.push_back(u.mask_ms);
    max_u.push_back(u.max_mask_ms);
    apply.push_back(c.apply_ms);
    accept.push_back(c.accept_ms);
  }
  const double dp = median(t_plain), dg = median(t_grammar);
  const double extra_c = median(mask_c) + median(apply) + median(accept);
  const double extra_u = median(mask_u) + median(apply) + median(accept);
  std::printf("serval bench grammar: %s | vocab %d | grammar: %s | %d tokens x %d runs (medians)\n",
              model_path.c_str(), tok.n_vocab(), source.c_str(), (int)last.tokens.size(), runs);
  std::printf("  decode per token: plain %.3f ms, constrained %.3f ms (end to end %+.1f %%)\n", dp, dg,
              dp > 0 ? 100.0 * (dg - dp) / dp : 0.0);
  std::printf("  grammar per token: mask %.4f ms (cached), %.4f ms (uncached, max %.4f) + apply %.4f + advance %.4f ms\n",
              median(mask_c), median(mask_u), median(max_u), median(apply), median(accept));
  std::printf("  overhead vs plain decode: %.2f %% (cached), %.2f %% (every mask a full trie walk)\n",
              dp > 0 ? 100.0 * extra_c / dp : 0.0, dp > 0 ? 100.0 * extra_u / dp : 0.0);
  std::printf("  constrained output: %s\n", tok.decode(last.tokens).substr(0, 160).c_str());
  return 0;
}

}  // namespace serval::cli
