// serval bench throughput: drives the engine directly (no HTTP) with N requests
// at concurrency C and prints throughput, latency percentiles and KV figures.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench_http.h"
#include "bench_model.h"
#include "cli_util.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "spec_flags.h"
#include "commands.h"
#include "common/splitmix.h"
#include "common/stats.h"
#include "model/model.h"
#include "serval/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {
namespace {

using clock_type = std::chrono::steady_clock;

struct RunResult {
  int concurrency = 0;
  double wall_s = 0, gen_tok_s = 0, prefill_tok_s = 0;
  double ttft_mean = 0, ttft_p50 = 0, ttft_p99 = 0, ttft_first = 0, ttft_rest_p50 = 0;
  double itl_mean = 0, itl_p50 = 0, itl_p99 = 0;
  double decode_tok_s = 0;  // streams in flight x per-stream rate after the first token
  int64_t gen_tokens = 0, prompt_tokens = 0, errors = 0;
  EngineStats stats;
};

// Prompts of prompt_len random ordinary tokens (the first shared_prefix of
// them common to all), or the tokens of a prompt file for every request.
std::vector<std::vector<TokenId>> build_prompts(const Tokenizer& tok, int n_requests, int prompt_len, int shared_prefix,
                                                uint64_t seed, const std::vector<TokenId>& file_prompt) {
  std::vector<std::vector<TokenId>> prompts((size_t)n_requests);
  if (!file_prompt.empty()) {
    for (auto& p : prompts) p = file_prompt;
    return prompts;
  }
  // Ordinary (non-control) tokens to build prompts from.
  std::vector<TokenId> pool;
  for (TokenId t = 0; t < tok.n_vocab(); ++t)
    if (!tok.is_control(t) && !tok.is_eog(t) && t != tok.bos()) pool.push_back(t);
  if (pool.empty()) pool.push_back(0);
  uint64_t s = seed;
  std::vector<TokenId> prefix;
  if (tok.bos() >= 0) prefix.push_back(tok.bos());
  while ((int)prefix.size() < shared_prefix) prefix.push_back(pool[splitmix64_next(s) % pool.size()]);
  for (auto& p : prompts) {
    p = prefix;
    if (p.empty() && tok.bos() >= 0) p.push_back(tok.bos());
    while ((int)p.size() < prompt_len) p.push_back(pool[splitmix64_next(s) % pool.size()]);
  }
  return prompts;
}

// Input-grounded prompts: each prompt S becomes S + G + S, where G is the
// target's own greedy continuation of S (gen_len tokens), so a continuation
// that copies from its input reproduces G.
void make_grounded(const std::shared_ptr<const Model>& model, const Tokenizer& tok, EngineConfig ecfg,
                   std::vector<std::vector<TokenId>>* prompts, int gen_len) {
  ecfg.spec = SpecConfig{};
  auto engine = Engine::create(model, tok, ecfg);
  if (!engine.ok()) {
    std::fprintf(stderr, "serval bench: %s\n", engine.status().message().c_str());
    std::exit(2);
  }
  for (auto& p : *prompts) {
    Request r;
    r.prompt = p;
    r.params.temperature = 0;
    r.params.max_tokens = gen_len;
    r.params.ignore_eos = true;
    auto st = (*engine)->submit(std::move(r));
    std::vector<TokenId> g;
    OutputEvent ev;
    while (st.ok() && (*st)->next(&ev) && ev.error.ok()) g.insert(g.end(), ev.tokens.begin(), ev.tokens.end());
    const std::vector<TokenId> s = p;
    p.insert(p.end(), g.begin(), g.end());
    p.insert(p.end(), s.begin() + (tok.bos() >= 0 && s.front() == tok.bos() ? 1 : 0), s.end());
  }
}

RunResult run_once(const std::shared_ptr<const Model>& model, const Tokenizer& tok, const EngineConfig& ecfg,
                   const std::vector<std::vector<TokenId>>& prompts, int concurrency, int gen_len) {
  const int n_requests = (int)prompts.size();
  auto engine_or = Engine::create(model, tok, ecfg);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "serval bench: %s\n", engine_or.status().message().c_str());
    std::exit(2);
  }
  Engine& engine = **engine_or;
  log_kv_cache("serval bench", engine);
  std::mutex mu;
  std::vector<double> ttft((size_t)n_requests, 0), itl;
  double decode_s = 0;       // summed over requests: first to last token
  int64_t decode_tokens = 0;  // summed over requests: tokens after the first event
  std::atomic<int> next{0};
  std::atomic<int64_t> gen{0}, errors{0};
  const auto t0 = clock_type::now();
  auto client = [&] {
    std::vector<double> my_itl;
    double my_decode_s = 0;
    int64_t my_decode_tokens = 0;
    for (;;) {
      const int i = next++;
      if (i >= n_requests) break;
      Request r;
      r.prompt = prompts[(size_t)i];
      r.params.temperature = 0;
      r.params.max_tokens = gen_len;
      r.params.ignore_eos = true;
      const auto ts = clock_type::now();
      auto st = engine.submit(std::move(r));
      if (!st.ok()) {
        ++errors;
        continue;
      }
      OutputEvent ev;
      auto last = ts, first_at = ts;
      bool first = true;
      while ((*st)->next(&ev)) {
        if (!ev.error.ok()) {
          ++errors;
          break;
        }
        const auto now = clock_type::now();
        if (first) {
          ttft[(size_t)i] = std::chrono::duration<double>(now - ts).count();
          first_at = now;
        } else {
          my_itl.push_back(std::chrono::duration<double>(now - last).count());
          my_decode_tokens += (int64_t)ev.tokens.size();
        }
        first = false;
        last = now;
        gen += (int64_t)ev.tokens.size();
      }
      my_decode_s += std::chrono::duration<double>(last - first_at).count();
    }
    std::lock_guard<std::mutex> lk(mu);
    itl.insert(itl.end(), my_itl.begin(), my_itl.end());
    decode_s += my_decode_s;
    decode_tokens += my_decode_tokens;
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) threads.emplace_back(client);
  for (auto& t : threads) t.join();
  RunResult r;
  r.concurrency = concurrency;
  r.wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  r.gen_tokens = gen;
  r.errors = errors;
  for (const auto& p : prompts) r.prompt_tokens += (int64_t)p.size();
  r.gen_tok_s = (double)gen / r.wall_s;
  r.prefill_tok_s = (double)r.prompt_tokens / r.wall_s;
  r.ttft_mean = mean_of(ttft);
  r.ttft_p50 = percentile(ttft, 50);
  r.ttft_p99 = percentile(ttft, 99);
  r.ttft_first = ttft.empty() ? 0 : ttft[0];
  r.ttft_rest_p50 = ttft.size() > 1 ? percentile(std::vector<double>(ttft.begin() + 1, ttft.end()), 50) : 0;
  r.itl_mean = mean_of(itl);
  r.itl_p50 = percentile(itl, 50);
  r.itl_p99 = percentile(itl, 99);
  r.stats = engine.stats();
  r.decode_tok_s = decode_s > 0 ? (double)std::min(concurrency, n_requests) * (double)decode_tokens / decode_s : 0.0;
  return r;
}

nlohmann::json to_json(const RunResult& r) {
  const auto& s = r.stats;
  return {{"concurrency", r.concurrency},
          {"wall_s", r.wall_s},
          {"gen_tokens", r.gen_tokens},
          {"gen_tok_s", r.gen_tok_s},
          {"prefill_tok_s", r.prefill_tok_s},
          {"ttft_mean_s", r.ttft_mean},
          {"ttft_p50_s", r.ttft_p50},
          {"ttft_p99_s", r.ttft_p99},
          {"ttft_first_s", r.ttft_first},
          {"ttft_rest_p50_s", r.ttft_rest_p50},
          {"itl_mean_s", r.itl_mean},
          {"itl_p50_s", r.itl_p50},
          {"itl_p99_s", r.itl_p99},
          // Steady-state decode rate: streams in flight x tokens per second of one
          // stream after its first token (events carry several tokens with speculation).
          {"decode_tok_s", r.decode_tok_s},
          // The decode-only steps' own rate: generated tokens / wall time of the
          // steps that ran no prompt token (EngineStats::decode_steps).
          {"decode_step_tok_s", s.decode_step_seconds > 0 ? (double)s.decode_step_tokens / s.decode_step_seconds : 0.0},
          {"decode_steps", s.decode_steps},
          {"decode_step_tokens", s.decode_step_tokens},
          // MoE: experts read per layer in those steps (0 for a dense model).
          {"decode_step_experts_per_layer",
           s.decode_step_moe_passes > 0 ? (double)s.decode_step_expert_reads / (double)s.decode_step_moe_passes : 0.0},
          {"kv_blocks_total", s.kv_blocks_total},
          {"kv_blocks_peak", s.kv_blocks_peak},
          {"kv_swa_blocks_total", s.kv_swa_blocks_total},
          {"kv_swa_blocks_peak", s.kv_swa_blocks_peak},
          {"kv_seq_bytes_peak", s.kv_seq_bytes_peak},
          {"kv_seq_bytes_decode", s.kv_seq_bytes_decode_peak},
          {"kv_seq_bytes_decode_full_attention", s.kv_seq_bytes_decode_full},
          {"kv_waste_pct", 100.0 * s.kv_waste_ratio},
          {"prefix_hit_rate", s.prefix_query_tokens ? (double)s.prefix_hit_tokens / (double)s.prefix_query_tokens : 0.0},
          {"preemptions", s.preemptions},
          {"spec_drafts", s.spec_drafts},
          {"spec_draft_tokens", s.spec_draft_tokens},
          {"spec_accepted_tokens", s.spec_accepted_tokens},
          {"spec_acceptance_rate", s.spec_draft_tokens ? (double)s.spec_accepted_tokens / (double)s.spec_draft_tokens : 0.0},
          {"spec_mean_accepted", s.spec_mean_accepted},
          {"errors", r.errors}};
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  const std::string cmd = "serval bench";
  // Subcommands with their own parsers: argv[0] becomes "serval bench NAME".
  struct Delegate {
    const char* name;
    int (*run)(int, char**);
  };
  for (const Delegate& d : {Delegate{"http", cmd_bench_http}, Delegate{"model", cmd_bench_model},
                            Delegate{"grammar", cmd_bench_grammar}}) {
    if (argc >= 2 && std::string_view(argv[1]) == d.name) {
      std::string name = "serval bench " + std::string(d.name);
      argv[1] = name.data();
      return d.run(argc - 1, argv + 1);
    }
  }
  CLI::App app(
      "Benchmarks (also: serval bench http --url URL ... — load an OpenAI-compatible server; serval bench model "
      "-m MODEL ... — llama-bench's pp/tg tests; serval bench grammar -m MODEL — constrained-decoding overhead)",
      cmd);
  app.require_subcommand(1);
  auto* tp = app.add_subcommand("throughput", "drive the engine directly with concurrent requests");
  std::string model_path, format = "text", kv_mem = "1G", conc_list = "1";
  int n_requests = 16, prompt_len = 64, gen_len = 64, shared_prefix = 0, threads = 0;
  int max_batch_tokens = 512, max_seqs = 64, block_size = 16;
  uint64_t seed = 1;
  tp->add_option("-m,--model", model_path, "GGUF model")->required();
  tp->add_option("--requests", n_requests, "number of requests")->check(CLI::Range(1, 100000));
  tp->add_option("--concurrency", conc_list, "requests in flight; a comma-separated list runs each in turn");
  tp->add_option("--prompt-len", prompt_len, "prompt tokens per request")->check(CLI::Range(1, 1 << 20));
  tp->add_option("--gen-len", gen_len, "generated tokens per request")->check(CLI::Range(1, 1 << 20));
  tp->add_option("--shared-prefix", shared_prefix, "leading prompt tokens shared by all requests")
      ->check(CLI::Range(0, 1 << 20));
  tp->add_option("-o,--output", format, "text or json")->check(CLI::IsMember({"text", "json"}));
  tp->add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  tp->add_option("--kv-memory", kv_mem, "KV pool: bytes (512M, 2G) or a fraction of free RAM");
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(*tp, &kv_type);
  tp->add_option("--max-batch-tokens", max_batch_tokens, "token budget per step")->check(CLI::Range(1, 1 << 20));
  tp->add_option("--max-seqs", max_seqs, "sequences per step")->check(CLI::Range(1, 1 << 16));
  tp->add_option("--block-size", block_size, "KV block size in tokens")->check(CLI::Range(1, 1024));
  bool swa_full = false;
  tp->add_flag("--swa-full", swa_full, "sliding-window layers keep the whole context (no window bound)");
  tp->add_option("--seed", seed, "prompt seed");
  std::string prompt_file;
  int repeat = 1;
  bool grounded = false;
  tp->add_flag("--grounded", grounded,
               "input-grounded prompts: each prompt P becomes P + G + P, G = the model's greedy continuation of P "
               "(--gen-len tokens), so copying from the input pays");
  tp->add_option("--prompt-file", prompt_file, "every request's prompt is this text (with BOS); overrides --prompt-len");
  tp->add_option("--repeat", repeat, "runs per configuration; the median run (by gen tok/s) is reported")
      ->check(CLI::Range(1, 100));
  SpecFlags spec;
  spec.add_to(*tp);
  if (auto rc = parse(app, argc, argv)) return *rc;

  std::vector<int> concs;
  {
    std::stringstream ss(conc_list);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        size_t used = 0;
        int c = std::stoi(item, &used);
        if (used != item.size() || c < 1 || c > 4096) throw std::invalid_argument("range");
        concs.push_back(c);
      } catch (...) {
        return fail(cmd, "--concurrency: expected integers in [1, 4096], got '" + conc_list + "'");
      }
    }
  }
  if (concs.empty()) return fail(cmd, "--concurrency: empty");
  if (shared_prefix > prompt_len) return fail(cmd, "--shared-prefix must not exceed --prompt-len");
  auto kvb = parse_kv_memory(kv_mem);
  if (!kvb.ok()) return fail(cmd, kvb.status().message());
  auto loaded = load_model(cmd, model_path);
  if (!loaded) return 2;
  const std::shared_ptr<const Model>& m = loaded->model;
  const Tokenizer* tok = loaded->tok.get();
  std::vector<TokenId> file_prompt;
  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) return fail(cmd, "cannot read prompt file '" + prompt_file + "'");
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().size() > (1u << 24)) return fail(cmd, "--prompt-file: larger than 16 MiB");
    file_prompt = tok->encode(text.str(), /*add_special=*/true, /*parse_special=*/false);
    if (file_prompt.empty()) return fail(cmd, "--prompt-file: no tokens");
    prompt_len = (int)file_prompt.size();
  }
  SpecConfig spec_cfg;
  if (auto rc = spec.resolve(cmd, &spec_cfg)) return *rc;
  const bool speculating = spec_cfg.mode != SpecConfig::Mode::none;

  EngineConfig ec;
  ec.n_threads = threads;
  ec.kv_memory_bytes = *kvb;
  ec.block_size = block_size;
  ec.kv_type = kv_type;
  ec.max_batch_tokens = max_batch_tokens;
  ec.max_seqs = max_seqs;
  ec.swa_full = swa_full;
  const int total_len = grounded ? 2 * prompt_len + 2 * gen_len : prompt_len + gen_len;
  ec.max_model_len = std::min<int64_t>(m->config().n_ctx_train, std::max(4096, total_len + 1));
  if (total_len > ec.max_model_len)
    return fail(cmd, "the prompt and --gen-len tokens (twice each with --grounded) exceed the model's context of " +
                         std::to_string(ec.max_model_len));

  auto prompts = build_prompts(*tok, n_requests, prompt_len, shared_prefix, seed, file_prompt);
  if (grounded) make_grounded(m, *tok, ec, &prompts, gen_len);
  EngineConfig spec_ec = ec;
  spec_ec.spec = spec_cfg;
  // The median of `repeat` runs of one configuration, by gen tok/s.
  auto median_run = [&](std::vector<RunResult> v) {
    std::sort(v.begin(), v.end(), [](const RunResult& a, const RunResult& b) { return a.gen_tok_s < b.gen_tok_s; });
    return v[v.size() / 2];
  };
  auto print_run = [&](const char* label, const RunResult& r, const nlohmann::json& j) {
    std::printf(
        "%sconcurrency %d: %lld requests in %.2f s | gen %.1f tok/s | prefill %.1f tok/s\n"
        "  TTFT mean %.4f p50 %.4f p99 %.4f s (first %.4f, rest p50 %.4f) | ITL mean %.4f p50 %.4f p99 %.4f s\n"
        "  decode %.1f tok/s (streams in flight x per-stream rate after the first token) | decode-only steps %.1f "
        "tok/s (%lld steps that ran no prompt token)\n"
        "  KV blocks peak %d/%d, waste %.2f %% | prefix hit rate %.3f | preemptions %lld | errors %lld\n",
        label, r.concurrency, (long long)n_requests, r.wall_s, r.gen_tok_s, r.prefill_tok_s, r.ttft_mean, r.ttft_p50,
        r.ttft_p99, r.ttft_first, r.ttft_rest_p50, r.itl_mean, r.itl_p50, r.itl_p99, r.decode_tok_s,
        (double)j["decode_step_tok_s"], (long long)r.stats.decode_steps,
        r.stats.kv_blocks_peak, r.stats.kv_blocks_total, (double)j["kv_waste_pct"], (double)j["prefix_hit_rate"],
        (long long)r.stats.preemptions, (long long)r.errors);
    if (r.stats.kv_swa_blocks_total > 0 && r.stats.kv_seq_bytes_decode_full > 0)
      std::printf("  KV bytes per sequence: decode %.2f MiB (full attention %.2f MiB: %.1f %%), peak in prefill "
                  "%.2f MiB | sliding-window blocks peak %d/%d\n",
                  (double)r.stats.kv_seq_bytes_decode_peak / 1048576.0,
                  (double)r.stats.kv_seq_bytes_decode_full / 1048576.0,
                  100.0 * (double)r.stats.kv_seq_bytes_decode_peak / (double)r.stats.kv_seq_bytes_decode_full,
                  (double)r.stats.kv_seq_bytes_peak / 1048576.0, r.stats.kv_swa_blocks_peak,
                  r.stats.kv_swa_blocks_total);
    if (r.stats.n_expert > 0 && !r.stats.expert_tokens.empty()) {
      // Router balance: tokens per expert, summed over layers.
      std::vector<int64_t> per((size_t)r.stats.n_expert, 0);
      for (size_t i = 0; i < r.stats.expert_tokens.size(); ++i) per[i % per.size()] += r.stats.expert_tokens[i];
      const auto [lo, hi] = std::minmax_element(per.begin(), per.end());
      int64_t total = 0;
      for (int64_t v : per) total += v;
      std::printf("  experts: %d, tokens routed per expert (all layers) min %lld mean %.1f max %lld\n",
                  r.stats.n_expert, (long long)*lo, (double)total / (double)per.size(), (long long)*hi);
      if (r.stats.decode_step_moe_passes > 0)
        std::printf("  decode-only steps read %.1f of %d experts per layer (%.1f tokens per step)\n",
                    (double)j["decode_step_experts_per_layer"], r.stats.n_expert, (double)r.stats.decode_step_tokens / (double)r.stats.decode_steps);
    }
    if (r.stats.spec_drafts > 0 || r.stats.spec_draft_tokens > 0)
      std::printf("  speculative: %lld drafts, %lld tokens drafted, %lld accepted (acceptance %.1f %%), "
                  "%.2f accepted per draft\n",
                  (long long)r.stats.spec_drafts, (long long)r.stats.spec_draft_tokens,
                  (long long)r.stats.spec_accepted_tokens, 100.0 * (double)j["spec_acceptance_rate"],
                  r.stats.spec_mean_accepted);
    std::fflush(stdout);
  };

  nlohmann::json all = nlohmann::json::array();
  for (int c : concs) {
    // Baseline and speculative runs alternate, so both see the same machine.
    std::vector<RunResult> base_runs, spec_runs;
    for (int i = 0; i < repeat; ++i) {
      base_runs.push_back(run_once(m, *tok, ec, prompts, c, gen_len));
      if (speculating) spec_runs.push_back(run_once(m, *tok, spec_ec, prompts, c, gen_len));
    }
    const RunResult base = median_run(base_runs);
    auto j = to_json(base);
    if (format == "text") print_run(speculating ? "no speculation, " : "", base, j);
    if (speculating) {
      const RunResult sr = median_run(spec_runs);
      auto sj = to_json(sr);
      if (format == "text") {
        print_run(spec.draft_model.empty() ? "ngram speculation, " : "draft-model speculation, ", sr, sj);
        std::printf("  speculative vs not (medians of %d): gen tok/s x%.2f, decode tok/s x%.2f\n", repeat,
                    sr.gen_tok_s / base.gen_tok_s, base.decode_tok_s > 0 ? sr.decode_tok_s / base.decode_tok_s : 0.0);
      }
      j = {{"concurrency", c},
           {"baseline", j},
           {"speculative", sj},
           {"gen_tok_s_ratio", sr.gen_tok_s / base.gen_tok_s},
           {"decode_tok_s_ratio", base.decode_tok_s > 0 ? sr.decode_tok_s / base.decode_tok_s : 0.0}};
    }
    all.push_back(j);
  }
  if (format == "json") {
    nlohmann::json out = all.size() == 1 ? all[0] : nlohmann::json{{"runs", all}};
    if (all.size() > 1 && !speculating) out["gen_tok_s_ratio_last_vs_first"] = (double)all.back()["gen_tok_s"] / (double)all[0]["gen_tok_s"];
    std::printf("%s\n", out.dump().c_str());
  } else if (all.size() > 1 && !speculating) {
    const auto ratio = [&](const char* key) {
      const double first = all[0][key];
      return first > 0 ? (double)all.back()[key] / first : 0.0;
    };
    std::printf("concurrency %d vs %d: gen tok/s x%.2f, decode tok/s x%.2f, decode-only steps x%.2f\n", concs.back(),
                concs.front(), ratio("gen_tok_s"), ratio("decode_tok_s"), ratio("decode_step_tok_s"));
  }
  return 0;
}

}  // namespace serval::cli
