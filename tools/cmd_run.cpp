// serval run -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p M] [--seed S] [-t THREADS]
//            [--beam-width W [--num-return N] [--length-penalty L] [--num-beam-groups G --diversity-penalty D]]
//            [--penalty-alpha A --top-k K]
//
// Single-request generation through the engine (paged KV, batched forward): streams text to
// stdout as it is generated, prints prompt and generation speed on stderr.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "sampler/grammar/grammar.h"

#include "cli_util.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "tp_flag.h"
#include "sampling_flags.h"
#include "spec_flags.h"
#include "commands.h"
#include "common/thread_pool.h"
#include "kv_cache/kv_storage.h"
#include "model/model.h"
#include "serval/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

int cmd_run(int argc, char** argv) {
  const std::string cmd = "serval run";
  CLI::App app("Generate text from a prompt, streaming it to stdout", cmd);
  std::string model_path, prompt, prompt_file;
  int n_predict = 128, threads = 0, ctx = 0, logprobs = 0;
  SamplingFlags sampling;
  std::string kv_memory = "1G";
  std::vector<std::string> stops;
  bool ignore_eos = false, no_bos = false, verbose_prompt = false;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  auto* p_opt = app.add_option("-p,--prompt", prompt, "prompt text");
  app.add_option("-f,--file", prompt_file, "read the prompt from a file")->excludes(p_opt);
  app.add_option("-n,--n-predict", n_predict, "tokens to generate (-1: until EOS or the context is full)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("-c,--ctx-size", ctx, "context size (0: the model's, at most 4096 by default)")
      ->check(CLI::Range(0, 1 << 20));
  sampling.add_to(app);
  app.add_option("--stop", stops, "stop string (repeatable)");
  app.add_option("--logprobs", logprobs, "print the top-N log-probabilities of each token on stderr")
      ->check(CLI::Range(0, 20));
  app.add_flag("--ignore-eos", ignore_eos, "keep generating after EOS");
  app.add_flag("--no-bos", no_bos, "do not add BOS even if the model asks for it");
  app.add_flag("--verbose-prompt", verbose_prompt, "print the prompt's tokens on stderr");
  app.add_option("--kv-memory", kv_memory, "KV cache pool: bytes (512M, 2G) or a fraction of free RAM");
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(app, &kv_type);
  app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  std::string grammar, grammar_file, json_schema, regex;
  auto* g1 = app.add_option("--grammar", grammar, "constrain the output to this GBNF grammar (docs/STRUCTURED_OUTPUT.md)");
  auto* g2 = app.add_option("--grammar-file", grammar_file, "read the GBNF grammar from a file")->excludes(g1);
  auto* g3 = app.add_option("-j,--json-schema", json_schema, "constrain the output to JSON valid under this schema")
                 ->excludes(g1)->excludes(g2);
  app.add_option("--regex", regex, "constrain the output to full matches of this regex")
      ->excludes(g1)->excludes(g2)->excludes(g3);
  // Search decoding (docs/SEARCH_DECODING.md).
  int beam_width = 0, num_return = 1, num_beam_groups = 1;
  float length_penalty = 1.0f, diversity_penalty = 0.0f, penalty_alpha = 0.0f;
  std::string early_stopping = "false";
  app.add_option("--beam-width", beam_width, "beam search with this many beams (0: off)")->check(CLI::Range(0, 16));
  app.add_option("--num-return", num_return, "beam search: print the N best sequences")->check(CLI::Range(1, 16));
  app.add_option("--length-penalty", length_penalty, "beam search: score = sum_logprob / length^this");
  app.add_option("--early-stopping", early_stopping, "beam search: false, true or never")
      ->check(CLI::IsMember({"false", "true", "never"}));
  app.add_option("--num-beam-groups", num_beam_groups, "diverse beam search: beam groups (divide --beam-width)")
      ->check(CLI::Range(1, 16));
  app.add_option("--diversity-penalty", diversity_penalty, "diverse beam search: Hamming diversity penalty");
  app.add_option("--penalty-alpha", penalty_alpha, "contrastive search with --top-k candidates (0: off)");
  SpecFlags spec;
  spec.add_to(app);
  TpFlag tp;
  tp.add_to(app);
  if (auto rc = parse(app, argc, argv)) return *rc;
  if (auto rc = tp.join(cmd)) return *rc;
  if (!grammar_file.empty() && !read_file(grammar_file, grammar))
    return fail(cmd, "cannot read grammar file '" + grammar_file + "'");
  Expected<GrammarPtr> constraint = GrammarPtr();
  if (!grammar.empty()) constraint = compile_gbnf(grammar);
  else if (!json_schema.empty()) constraint = compile_json_schema(json_schema);
  else if (!regex.empty()) constraint = compile_regex(regex);
  if (!constraint.ok()) return fail(cmd, constraint.status().message());

  if (!prompt_file.empty() && !read_file(prompt_file, prompt))
    return fail(cmd, "cannot read prompt file '" + prompt_file + "'");

  auto loaded = load_model(cmd, model_path, true, tp.shard());
  if (!loaded) return 2;
  if (tp.worker()) return tp.run_worker(cmd, *loaded->model, threads);
  const std::shared_ptr<const Model>& shared_model = loaded->model;
  const Model& m = *shared_model;
  const Tokenizer* tok = loaded->tok.get();
  if (tok->n_vocab() != m.config().n_vocab)
    return fail(cmd, "tokenizer has " + std::to_string(tok->n_vocab()) + " tokens but the model has " +
                         std::to_string(m.config().n_vocab));

  SamplingParams sp;
  sampling.apply(&sp);
  sp.stop = stops;
  sp.ignore_eos = ignore_eos;
  sp.logprobs = logprobs;
  sp.grammar = *constraint;
  sp.beam_width = beam_width;
  sp.length_penalty = length_penalty;
  sp.early_stopping = early_stopping == "true"    ? EarlyStopping::yes
                      : early_stopping == "never" ? EarlyStopping::never
                                                  : EarlyStopping::heuristic;
  sp.num_beam_groups = num_beam_groups;
  sp.diversity_penalty = diversity_penalty;
  sp.penalty_alpha = penalty_alpha;
  if (n_predict >= 0) sp.max_tokens = n_predict;
  if (n_predict == 0) return 0;
  if (Status st = sp.validate((int32_t)m.config().n_vocab); !st.ok()) return fail(cmd, st.message());
  if (num_return > 1 && !sp.beam_search()) return fail(cmd, "--num-return: needs beam search (--beam-width)");

  std::vector<TokenId> tokens = tok->encode(prompt, /*add_special=*/!no_bos, /*parse_special=*/true);
  if (no_bos && !tokens.empty() && tokens.front() == tok->bos()) tokens.erase(tokens.begin());
  if (tokens.empty()) return fail(cmd, "the prompt is empty (and the model adds no BOS)");
  const int64_t n_ctx = ctx > 0 ? ctx : std::min<int64_t>(m.config().n_ctx_train, 4096);
  if ((int64_t)tokens.size() >= n_ctx)
    return fail(cmd, "the prompt has " + std::to_string(tokens.size()) + " tokens, the context only " +
                         std::to_string(n_ctx));
  if (verbose_prompt) {
    for (TokenId t : tokens) std::fprintf(stderr, "%6d -> '%s'\n", t, tok->token_to_piece(t, true).c_str());
  }

  EngineConfig ec;
  ec.n_threads = threads;
  ec.tp = tp.engine_link();
  ec.max_model_len = n_ctx;
  if (auto rc = spec.resolve(cmd, &ec.spec)) return *rc;
  auto kvb = parse_kv_memory(kv_memory);
  if (!kvb.ok()) return fail(cmd, kvb.status().message());
  // A single sequence never needs more than its context's worth of blocks.
  ec.kv_type = kv_type;
  size_t per_token = KvGeometry{(int32_t)m.config().n_layers, (int32_t)m.config().kv_dim(), 16, kv_type}.bytes_per_token();
  if (ec.spec.draft_model)
    per_token += KvGeometry{(int32_t)ec.spec.draft_model->config().n_layers,
                            (int32_t)ec.spec.draft_model->config().kv_dim(), 16, kv_type}
                     .bytes_per_token();
  // Beam and contrastive search run beam_width / top_k sequences.
  const size_t n_seqs = (size_t)std::max({1, sp.beam_width, sp.contrastive_search() ? sp.top_k : 1});
  ec.kv_memory_bytes = std::min<size_t>(*kvb, n_seqs * (size_t)(n_ctx + 64 + 16 * 4) * per_token);
  const int64_t prompt_len = (int64_t)tokens.size();
  auto engine = Engine::create(shared_model, *tok, ec);
  if (!engine.ok()) return fail(cmd, engine.status().message());
  log_kv_cache(cmd, **engine);

  // The prompt text is echoed as the user typed it; generated text follows.
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  Request req;
  req.prompt = std::move(tokens);
  req.params = sp;
  req.n = sp.beam_search() ? num_return : 1;
  const int32_t req_n = req.n;
  auto stream = (*engine)->submit(std::move(req));
  if (!stream.ok()) return fail(cmd, stream.status().message());
  OutputEvent ev;
  auto t1 = t0;
  int64_t n_gen = 0;
  FinishReason reason = FinishReason::none;
  while ((*stream)->next(&ev)) {
    if (!ev.error.ok()) return fail(cmd, ev.error.message(), 1);
    if (n_gen == 0) t1 = clock::now();
    n_gen += (int64_t)ev.tokens.size();
    for (const auto& lp : ev.logprobs) {
      std::fprintf(stderr, "[%d %.4f |", lp.chosen.token, lp.chosen.logprob);
      for (const auto& t : lp.top) std::fprintf(stderr, " %d:%.4f", t.token, t.logprob);
      std::fprintf(stderr, "]\n");
    }
    if (req_n > 1)
      std::fprintf(stdout, "\n--- beam %d (score %.4f) ---\n", ev.index + 1, ev.search_score.value_or(0.0));
    std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
    std::fflush(stdout);
    if (ev.finish != FinishReason::none) reason = ev.finish;
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const auto t2 = clock::now();
  // The first token arrives after the prompt's prefill: that time is the prompt's.
  const double pp = std::chrono::duration<double>(t1 - t0).count();
  const double tg = std::chrono::duration<double>(t2 - t1).count();
  const int64_t n_tg = std::max<int64_t>(n_gen - 1, 0);
  if (sp.beam_search()) {  // the hypotheses arrive together at the end: one figure
    std::fprintf(stderr, "\nbeam search: %d beams, %lld prompt tokens, %lld tokens returned, %.3f s | threads: %d\n",
                 sp.beam_width, (long long)prompt_len, (long long)n_gen,
                 std::chrono::duration<double>(t2 - t0).count(), threads > 0 ? threads : ThreadPool::default_threads());
    return 0;
  }
  std::fprintf(stderr,
               "\nprompt: %lld tokens in %.3f s (%.1f tok/s) | generation: %lld tokens in %.3f s (%.1f tok/s) | "
               "finish: %s | threads: %d\n",
               (long long)prompt_len, pp, (double)prompt_len / std::max(pp, 1e-9), (long long)n_gen, tg,
               (double)n_tg / std::max(tg, 1e-9), finish_reason_name(reason),
               threads > 0 ? threads : ThreadPool::default_threads());
  tp.report(cmd, prompt_len + n_gen);
  if (ec.spec.mode != SpecConfig::Mode::none) {
    const EngineStats st = (*engine)->stats();
    std::fprintf(stderr, "speculative: %lld drafts, %lld tokens drafted, %lld accepted (%.1f %%), %.2f accepted per draft\n",
                 (long long)st.spec_drafts, (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
                 st.spec_draft_tokens ? 100.0 * (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens : 0.0,
                 st.spec_mean_accepted);
  }
  return 0;
}

}  // namespace serval::cli
