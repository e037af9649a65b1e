// serval bench model: llama-bench's two tests on one model, straight through the
// batched forward (no engine, no sampling), so the figures compare with
// llama-bench's line for line:
//   pp<P>: one sequence's P-token prompt from an empty cache, in chunks of
//          --ubatch tokens, logits for the last token only;
//   tg<N>: N tokens one at a time from an empty cache, logits each time.
// Tokens are random ids (as llama-bench's). Each test runs once unmeasured,
// then -r times; t/s is mean +- sample stddev over the runs. GB/s counts the
// weight bytes one forward reads (every matrix once, plus one embedding row
// per token); GFLOP/s counts 2 * (matrix elements) per token (attention left
// out: small at these lengths).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_model.h"
#include "cli_util.h"
#include "common/stats.h"
#include "common/thread_pool.h"
#include "kernels/matmul.h"
#include "kv_cache/kv_storage.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "tp_flag.h"
#include "model/batch_forward.h"
#include "model/model.h"

namespace serval::cli {
namespace {

struct Test {
  int n_prompt = 0, n_gen = 0;
  int n_depth = 0;  // tokens already in the context (prefilled, not timed)
  std::vector<double> seconds;  // measured runs
};

class Runner {
 public:
  // link: rank 0 of a tensor-parallel run (--tp): each batch goes to the other ranks first.
  Runner(const Model& m, KvStorage& kv, ThreadPool* pool, int ubatch, TensorParallelLink* link = nullptr)
      : m_(m), fwd_(m, kv, pool), ubatch_(ubatch), rng_(1234), link_(link) {
    for (BlockId b = 0; b < kv.n_blocks(); ++b) table_.push_back(b);
    fwd_.set_collective(link);
  }

  // One run of the test; returns seconds.
  Expected<double> run(const Test& t) {
    std::uniform_int_distribution<TokenId> tok(0, (TokenId)m_.config().n_vocab - 1);
    int64_t pos = 0;
    Batch b;
    auto prefill = [&](int count) -> Status {
      for (int done = 0; done < count;) {
        const int n = std::min(ubatch_, count - done);
        b.tokens.resize((size_t)n);
        for (auto& x : b.tokens) x = tok(rng_);
        b.seqs = {BatchSeq{pos, n, table_, done + n == count}};
        SERVAL_RETURN_IF_ERROR(forward(b));
        pos += n;
        done += n;
      }
      return Status{};
    };
    SERVAL_RETURN_IF_ERROR(prefill(t.n_depth));
    const auto start = std::chrono::steady_clock::now();
    SERVAL_RETURN_IF_ERROR(prefill(t.n_prompt));
    for (int i = 0; i < t.n_gen; ++i) {
      b.tokens = {tok(rng_)};
      b.seqs = {BatchSeq{pos, 1, table_, true}};
      SERVAL_RETURN_IF_ERROR(forward(b));
      ++pos;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  Status forward(const Batch& b) {
    if (link_) SERVAL_RETURN_IF_ERROR(link_->send_batch(b));
    return fwd_.forward(b, &logits_);
  }

  const Model& m_;
  BatchForward fwd_;
  int ubatch_;
  std::mt19937 rng_;
  TensorParallelLink* link_;
  std::vector<BlockId> table_;
  std::vector<float> logits_;
};

// llama-bench's names: pp512, tg128, pp512 @ d4096.
std::string test_name(const Test& t) {
  std::string name = t.n_prompt > 0 && t.n_gen > 0 ? "pp" + std::to_string(t.n_prompt) + "+tg" + std::to_string(t.n_gen)
                     : t.n_prompt > 0           ? "pp" + std::to_string(t.n_prompt)
                                                : "tg" + std::to_string(t.n_gen);
  if (t.n_depth > 0) name += " @ d" + std::to_string(t.n_depth);
  return name;
}

}  // namespace

ModelFigures model_figures(const Model& m) {
  ModelFigures f;
  for (const auto& t : m.file().tensors()) {
    f.file_bytes += t.n_bytes;
    f.params += t.n_elements;
  }
  const ModelWeights& w = m.weights();
  std::vector<std::pair<DType, uint64_t>> by_type;
  // frac: the share of the matrix one decode token reads (mixture of
  // experts: n_expert_used / n_expert of the experts' matrices, on average).
  auto add = [&](const Matrix& x, double frac = 1.0) {
    if (!x.data) return;
    const uint64_t bytes = row_size(x.type, x.cols) * (uint64_t)x.rows;
    f.matrix_bytes += (uint64_t)((double)bytes * frac);
    f.matrix_elems += (uint64_t)((double)(x.rows * x.cols) * frac);
    auto it = std::find_if(by_type.begin(), by_type.end(), [&](auto& p) { return p.first == x.type; });
    if (it == by_type.end()) by_type.emplace_back(x.type, bytes);
    else it->second += bytes;
  };
  add(w.output);
  const ModelConfig& c = m.config();
  const double active = c.block.moe ? (double)c.n_expert_used / (double)c.n_expert : 1.0;
  for (const LayerWeights& l : w.layers) {
    for (const Matrix* x : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router}) add(*x);
    for (const auto* experts : {&l.exp_gate, &l.exp_up, &l.exp_down})
      for (const Matrix& x : *experts) add(x, active);
  }
  f.embd_row_bytes = row_size(w.token_embd.type, w.token_embd.cols);
  auto top = std::max_element(by_type.begin(), by_type.end(), [](auto& a, auto& b) { return a.second < b.second; });
  f.type_name = top == by_type.end() ? "?" : dtype_name(top->first);
  return f;
}

int cmd_bench_model(int argc, char** argv) {
  const std::string cmd = "serval bench model";
  CLI::App app("llama-bench's pp/tg tests through the batched forward", cmd);
  std::string model_path, format = "md";
  int n_prompt = 512, n_gen = 128, n_depth = 0, reps = 5, threads = 0, ubatch = 512;
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("-p,--n-prompt", n_prompt, "prompt tokens of the pp test (0: none)")->check(CLI::Range(0, 65536));
  app.add_option("-n,--n-gen", n_gen, "generated tokens of the tg test (0: none)")->check(CLI::Range(0, 65536));
  app.add_option("-d,--n-depth", n_depth, "tokens already in the context when each test starts (prefilled, not timed)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("-r,--repetitions", reps, "measured runs per test")->check(CLI::Range(1, 1000));
  app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  app.add_option("-b,--ubatch", ubatch, "prompt tokens per forward call")->check(CLI::Range(1, 65536));
  app.add_option("-o,--output", format, "md or json")->check(CLI::IsMember({"md", "json"}));
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(app, &kv_type);
  TpFlag tp;
  tp.add_to(app);
  if (auto rc = parse(app, argc, argv)) return *rc;
  if (n_prompt == 0 && n_gen == 0) return fail(cmd, "nothing to run: -p and -n are both 0");
  if (auto rc = tp.join(cmd)) return *rc;

  auto loaded = load_model(cmd, model_path, true, tp.shard());
  if (!loaded) return 2;
  if (tp.worker()) return tp.run_worker(cmd, *loaded->model, threads);
  const Model& m = *loaded->model;
  const ModelConfig& c = m.config();
  const int64_t ctx = (int64_t)n_depth + std::max(n_prompt, n_gen);
  if (c.n_ctx_train > 0 && ctx > c.n_ctx_train)
    return fail(cmd, "-d plus -p/-n of " + std::to_string(ctx) + " exceed the model's context of " +
                         std::to_string(c.n_ctx_train));
  if (std::string why = kv_type_check(kv_type, c.head_dim); !why.empty()) return fail(cmd, why);
  const KvGeometry g{(int32_t)c.n_layers, (int32_t)c.kv_dim(), 16, kv_type};
  std::fprintf(stderr, "%s: KV cache %s, %zu bytes/token\n", cmd.c_str(), kv_type_name(kv_type), g.bytes_per_token());
  auto kv = KvStorage::create(g, (int32_t)((ctx + 15) / 16));
  if (!kv.ok()) return fail(cmd, kv.status().message());
  const int nt = threads > 0 ? threads : ThreadPool::default_threads();
  ThreadPool pool(nt);
  if (TensorParallelLink* link = tp.engine_link()) {
    if (Status st = link->send_pool(kv->n_blocks(), 16, kv_type); !st.ok()) return fail(cmd, st.message(), 1);
  }
  Runner runner(m, *kv, nt > 1 ? &pool : nullptr, ubatch, tp.engine_link());
  // With --tp: this rank's shard, so GB/s and GFLOP/s are per rank.
  const ModelFigures mf = model_figures(m);

  std::vector<Test> tests;
  if (n_prompt > 0) tests.push_back({n_prompt, 0, n_depth, {}});
  if (n_gen > 0) tests.push_back({0, n_gen, n_depth, {}});

  const std::string backend = std::string("CPU (") + kernels::active_isa_name() + ")" +
                              (tp.size > 1 ? " tp" + std::to_string(tp.size) : "");
  const std::string model_type = c.arch + " " + mf.type_name;
  nlohmann::json out = nlohmann::json::array();
  if (format == "md") {
    std::printf("| model | size | params | backend | threads | test | t/s | GB/s | GFLOP/s |\n");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  }
  for (Test& t : tests) {
    for (int r = 0; r <= reps; ++r) {
      auto s = runner.run(t);
      if (!s.ok()) return fail(cmd, s.status().message(), 1);
      if (r > 0) t.seconds.push_back(*s);  // run 0 warms caches and pages
    }
    const int tokens = t.n_prompt + t.n_gen;
    std::vector<double> ts, ns;
    for (double s : t.seconds) {
      ts.push_back(tokens / s);
      ns.push_back(s * 1e9);
    }
    const double avg = mean_of(ts), sd = stddev_of(ts);
    // Weight bytes per forward call: the matrices once, plus the tokens' embedding rows.
    const int64_t calls = t.n_gen > 0 ? t.n_gen : (t.n_prompt + ubatch - 1) / ubatch;
    const double bytes = (double)calls * (double)mf.matrix_bytes + (double)tokens * (double)mf.embd_row_bytes;
    const double mean_s = mean_of(t.seconds);
    const double gbs = bytes / mean_s * 1e-9, gflops = 2.0 * (double)mf.matrix_elems * tokens / mean_s * 1e-9;
    if (format == "md") {
      std::printf("| %s | %.2f MiB | %.2f M | %s | %d | %s | %.2f ± %.2f | %.1f | %.1f |\n", model_type.c_str(),
                  (double)mf.file_bytes / (1 << 20), (double)mf.params * 1e-6, backend.c_str(), nt,
                  test_name(t).c_str(), avg, sd, gbs, gflops);
      std::fflush(stdout);
    }
    out.push_back({{"model_filename", model_path},
                   {"model_type", model_type},
                   {"model_size", mf.file_bytes},
                   {"model_n_params", mf.params},
                   {"backends", "CPU"},
                   {"cpu_isa", kernels::active_isa_name()},
                   {"n_threads", nt},
                   {"n_tp", tp.size},
                   {"n_ubatch", ubatch},
                   {"n_prompt", t.n_prompt},
                   {"n_gen", t.n_gen},
                   {"n_depth", t.n_depth},
                   {"avg_ns", (uint64_t)mean_of(ns)},
                   {"stddev_ns", (uint64_t)stddev_of(ns)},
                   {"avg_ts", avg},
                   {"stddev_ts", sd},
                   {"samples_ns", ns},
                   {"samples_ts", ts},
                   {"weights_gb_s", gbs},
                   {"gflop_s", gflops}});
  }
  if (format == "json") std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace serval::cli
