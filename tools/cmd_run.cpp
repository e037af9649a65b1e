// serval run -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p M] [--seed S] [-t THREADS]
//
// Single-sequence generation on the reference forward pass: streams text to
// stdout as it is generated, prints prompt and generation speed on stderr.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "sampler/sampler.h"
#include "sampler/stop_conditions.h"
#include "sampler/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

int cmd_run(int argc, char** argv) {
  const std::string cmd = "serval run";
  CLI::App app("Generate text from a prompt, streaming it to stdout", cmd);
  std::string model_path, prompt, prompt_file;
  int n_predict = 128, threads = 0, top_k = 40, ctx = 0, logprobs = 0;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, typical_p = 1.0f, repeat_penalty = 1.0f;
  float freq_penalty = 0.0f, presence_penalty = 0.0f;
  int repeat_last_n = 64;
  std::optional<uint64_t> seed;
  std::vector<std::string> stops;
  bool ignore_eos = false, no_bos = false, verbose_prompt = false;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  auto* p_opt = app.add_option("-p,--prompt", prompt, "prompt text");
  app.add_option("-f,--file", prompt_file, "read the prompt from a file")->excludes(p_opt);
  app.add_option("-n,--n-predict", n_predict, "tokens to generate (-1: until EOS or the context is full)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("-c,--ctx-size", ctx, "context size (0: the model's, at most 4096 by default)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--temp", temp, "temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
  app.add_option("--top-k", top_k, "top-k (0: off)")->check(CLI::Range(0, 1 << 24));
  app.add_option("--top-p", top_p, "top-p (1: off)");
  app.add_option("--min-p", min_p, "min-p (0: off)");
  app.add_option("--typical", typical_p, "locally typical sampling (1: off)");
  app.add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1: off)");
  app.add_option("--repeat-last-n", repeat_last_n, "penalty window (-1: whole history, 0: off)");
  app.add_option("--frequency-penalty", freq_penalty, "frequency penalty");
  app.add_option("--presence-penalty", presence_penalty, "presence penalty");
  app.add_option("--seed", seed, "random seed (default: random)");
  app.add_option("--stop", stops, "stop string (repeatable)");
  app.add_option("--logprobs", logprobs, "print the top-N log-probabilities of each token on stderr")
      ->check(CLI::Range(0, 20));
  app.add_flag("--ignore-eos", ignore_eos, "keep generating after EOS");
  app.add_flag("--no-bos", no_bos, "do not add BOS even if the model asks for it");
  app.add_flag("--verbose-prompt", verbose_prompt, "print the prompt's tokens on stderr");
  app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  if (auto rc = parse(app, argc, argv)) return *rc;

  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) return fail(cmd, "cannot read prompt file '" + prompt_file + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }

  auto model = Model::load(model_path);
  if (!model.ok()) return fail(cmd, model.status().message());
  const Model& m = **model;
  auto tok = Tokenizer::from_gguf(m.file());
  if (!tok.ok()) return fail(cmd, tok.status().message());
  if (tok->n_vocab() != m.config().n_vocab)
    return fail(cmd, "tokenizer has " + std::to_string(tok->n_vocab()) + " tokens but the model has " +
                         std::to_string(m.config().n_vocab));

  SamplingParams sp;
  sp.temperature = temp;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  sp.typical_p = typical_p;
  sp.repetition_penalty = repeat_penalty;
  sp.frequency_penalty = freq_penalty;
  sp.presence_penalty = presence_penalty;
  sp.penalty_last_n = repeat_last_n;
  sp.seed = seed;
  sp.stop = stops;
  sp.ignore_eos = ignore_eos;
  sp.logprobs = logprobs;
  if (n_predict >= 0) sp.max_tokens = n_predict;
  if (n_predict == 0) return 0;
  auto sampler = Sampler::create(sp, (int32_t)m.config().n_vocab);
  if (!sampler.ok()) return fail(cmd, sampler.status().message());

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

  ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
  ReferenceForward fwd(m, n_ctx, &pool);
  std::vector<float> logits((size_t)m.config().n_vocab);
  std::vector<TokenId> eog;
  for (TokenId t = 0; t < tok->n_vocab(); ++t)
    if (tok->is_eog(t)) eog.push_back(t);

  // The prompt text is echoed as the user typed it; generated text follows.
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  for (size_t i = 0; i < tokens.size(); ++i) {
    Status st = fwd.eval(tokens[i], i + 1 == tokens.size() ? std::span<float>(logits) : std::span<float>());
    if (!st.ok()) return fail(cmd, st.message(), 1);
  }
  const auto t1 = clock::now();

  StreamingDetokenizer detok(*tok);
  StopMatcher stop(sp.stop);
  std::string out;
  int32_t n_gen = 0;
  FinishReason reason = FinishReason::none;
  while (reason == FinishReason::none) {
    const TokenId next = sampler->sample(logits, tokens);
    if (logprobs > 0) {
      TokenLogprobs lp = compute_logprobs(logits, next, logprobs);
      std::fprintf(stderr, "[%d %.4f |", next, lp.chosen.logprob);
      for (const auto& t : lp.top) std::fprintf(stderr, " %d:%.4f", t.token, t.logprob);
      std::fprintf(stderr, "]\n");
    }
    tokens.push_back(next);
    ++n_gen;
    reason = check_token_stop(sp, next, n_gen, eog);
    // A stop token (EOS, stop_token_ids) ends generation without being shown.
    if (reason != FinishReason::stop) {
      out.clear();
      if (stop.feed(detok.push(next), out)) reason = FinishReason::stop;
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
    }
    if (reason != FinishReason::none) break;
    if (fwd.n_past() >= n_ctx) {
      reason = FinishReason::length;
      break;
    }
    Status st = fwd.eval(next, logits);
    if (!st.ok()) return fail(cmd, st.message(), 1);
  }
  if (!stop.stopped()) {
    out = detok.flush();
    std::string tail;
    if (!stop.feed(out, tail)) stop.finish(tail);
    std::fwrite(tail.data(), 1, tail.size(), stdout);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const auto t2 = clock::now();
  const double pp = std::chrono::duration<double>(t1 - t0).count();
  const double tg = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr,
               "\nprompt: %zu tokens in %.3f s (%.1f tok/s) | generation: %d tokens in %.3f s (%.1f tok/s) | "
               "finish: %s | threads: %d | seed: %llu\n",
               tokens.size() - (size_t)n_gen, pp, (double)(tokens.size() - (size_t)n_gen) / std::max(pp, 1e-9), n_gen,
               tg, n_gen / std::max(tg, 1e-9), finish_reason_name(reason), pool.n_threads(),
               (unsigned long long)sampler->seed());
  return 0;
}

}  // namespace serval::cli
