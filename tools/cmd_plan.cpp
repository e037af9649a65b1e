// serval plan: capacity planning from the engine's own measurements.
//
//   serval plan profile -m MODEL [-t N] [-o profile.json]
//     measures this machine on this model: prefill chunks by size, decode
//     steps by batch and context depth (the batched forward), the engine's
//     own per-step cost (real requests), KV bytes per token and the roofline;
//     fits the step-time model (src/plan/profile.h) and writes the profile.
//   serval plan -p profile.json --rate R (--prompt-len P --gen-len G | --trace FILE)
//               [--slo-ttft-p99 S] [--slo-itl-p99 S] [--kv-memory M] [-o json]
//     predicts one replica at the given settings with the queueing model
//     (src/plan/queue_model.h) and recommends settings and replicas.
//   ... --validate --url URL
//     also replays the workload against a running server (bench http's open
//     loop) and prints predicted against measured.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_http.h"
#include "bench_model.h"
#include "cli_util.h"
#include "commands.h"
#include "common/json_depth.h"
#include "common/roofline.h"
#include "common/stats.h"
#include "common/thread_pool.h"
#include "kernels/matmul.h"
#include "kv_cache/kv_storage.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "model/batch_forward.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/queue_model.h"
#include "serval/engine.h"

namespace serval::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) { return percentile(std::move(v), 50); }

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  return "unknown";
}

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Progress on a terminal: one rewritten line on stderr.
struct Progress {
  bool tty = isatty(2) != 0;
  int done = 0, total = 0;
  void step(const std::string& what) {
    ++done;
    if (tty) std::fprintf(stderr, "\r\033[K[%d/%d] %s", done, total, what.c_str());
  }
  void end() {
    if (tty) std::fprintf(stderr, "\r\033[K");
  }
};

// ---- serval plan profile ----------------------------------------------------

int cmd_plan_profile(int argc, char** argv) {
  const std::string cmd = argc > 0 ? argv[0] : "serval plan profile";
  CLI::App app("Measures prefill, decode and the engine's step cost of a model on this machine (a few minutes at "
               "most) and writes the capacity profile `serval plan -p` reads",
               cmd);
  std::string model_path, out_path;
  int threads = 0, max_batch = 64, max_chunk = 512, max_depth = 2048, reps = 3;
  bool no_roofline = false;
  std::string kv_budget_text = "1G";
  app.add_option("-m,--model", model_path, "GGUF model")->required();
  app.add_option("-o,--output", out_path, "profile file (default: standard output)");
  app.add_option("-t,--threads", threads, "compute threads (default: physical cores)")->check(CLI::Range(0, 1024));
  app.add_option("--max-batch", max_batch, "largest decode batch measured (powers of two up to it)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--max-chunk", max_chunk, "largest prefill chunk measured, tokens (powers of two up to it)")
      ->check(CLI::Range(2, 16384))
      ->capture_default_str();
  app.add_option("--max-depth", max_depth, "deepest context the decode steps are measured at")
      ->check(CLI::Range(64, 1 << 20))
      ->capture_default_str();
  app.add_option("-r,--rounds", reps, "rounds over every point (each point keeps the median of its rounds)")
      ->check(CLI::Range(1, 50))
      ->capture_default_str();
  app.add_option("--kv-budget", kv_budget_text, "memory for the KV cache the decode points use (512M, 2G)")
      ->capture_default_str();
  app.add_flag("--no-roofline", no_roofline, "skip the bandwidth and peak-throughput probes");
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(app, &kv_type);
  if (auto rc = parse(app, argc, argv)) return *rc;
  auto kv_budget = parse_kv_memory(kv_budget_text);
  if (!kv_budget.ok()) return fail(cmd, "--kv-budget: " + kv_budget.status().message());
  if (!out_path.empty()) {  // fail before minutes of measuring, not after
    std::error_code ec;
    const bool existed = std::filesystem::exists(out_path, ec);
    {
      std::ofstream probe(out_path, std::ios::app);
      if (!probe) return fail(cmd, "cannot write '" + out_path + "'");
    }
    if (!existed) std::filesystem::remove(out_path, ec);
  }

  auto loaded = load_model(cmd, model_path);
  if (!loaded) return 2;
  const Model& m = *loaded->model;
  const ModelConfig& c = m.config();
  if (std::string why = kv_type_check(kv_type, c.head_dim); !why.empty()) return fail(cmd, why);
  const int nt = threads > 0 ? threads : ThreadPool::default_threads();
  const int64_t n_ctx = std::min<int64_t>(c.n_ctx_train > 0 ? c.n_ctx_train : 4096, 4096);
  const KvGeometry g{(int32_t)c.n_layers, (int32_t)c.kv_dim(), 16, kv_type};
  const int64_t budget_tokens = (int64_t)(*kv_budget / std::max<size_t>(1, g.bytes_per_token()));

  plan::Profile p;
  p.cpu = cpu_model_name();
  p.cores = (int32_t)std::thread::hardware_concurrency();
  p.threads = nt;
  p.isa = kernels::active_isa_name();
  p.build = std::string("serval 0.1.0, ") + __VERSION__;
  p.created = utc_now();
  const ModelFigures mf = model_figures(m);
  p.model_path = model_path;
  p.model_arch = c.arch;
  p.model_type = mf.type_name;
  p.model_bytes = mf.file_bytes;
  p.weight_bytes_per_token = mf.matrix_bytes + mf.embd_row_bytes;
  p.n_ctx = n_ctx;
  p.kv_type = kv_type_name(kv_type);
  p.kv_bytes_per_token = g.bytes_per_token();
  p.block_size = g.block_size;

  std::vector<int> chunks, batches;
  for (int n = 1; n <= max_chunk; n *= 2) chunks.push_back(n);
  if (chunks.back() != max_chunk) chunks.push_back(max_chunk);
  for (int b = 1; b <= max_batch; b *= 2) batches.push_back(b);
  if (batches.back() != max_batch) batches.push_back(max_batch);
  std::vector<int64_t> depths;
  for (int64_t d : {int64_t{32}, int64_t{512}, (int64_t)max_depth})
    if (d + 1 < n_ctx && (depths.empty() || d > depths.back())) depths.push_back(d);
  // Points whose KV does not fit the budget are skipped (each seq its own blocks).
  std::vector<std::pair<int, int64_t>> decode_points;
  for (int b : batches)
    for (int64_t d : depths)
      if ((int64_t)b * (d + 16) <= budget_tokens) decode_points.emplace_back(b, d);
  // Chunks are measured from position 0 and again deeper in the context
  // (the attention of a chunk against what precedes it).
  const int64_t prefill_depth = std::clamp<int64_t>(n_ctx - max_chunk - 1, 0, 512) / 16 * 16;
  const int64_t need_tokens = std::max<int64_t>(prefill_depth + max_chunk + 16, [&] {
    int64_t mx = 0;
    for (auto [b, d] : decode_points) mx = std::max(mx, (int64_t)b * ((d + 16) / 16 * 16 + 16));
    return mx;
  }());
  if (max_chunk >= n_ctx) return fail(cmd, "--max-chunk " + std::to_string(max_chunk) + " is not below the context of " + std::to_string(n_ctx));

  // The engine is measured at 1, 16 and --max-batch streams.
  std::vector<int> engine_batches{1};
  for (int b : {std::min(max_batch, 16), max_batch})
    if (b > engine_batches.back()) engine_batches.push_back(b);
  Progress prog;
  {
    auto kv = KvStorage::create(g, (int32_t)((need_tokens + 15) / 16));
    if (!kv.ok()) return fail(cmd, kv.status().message(), 1);
    ThreadPool pool(nt);
    BatchForward fwd(m, *kv, nt > 1 ? &pool : nullptr);
    std::mt19937 rng(1234);
    std::uniform_int_distribution<TokenId> tok(0, (TokenId)c.n_vocab - 1);
    std::vector<float> logits;
    const int32_t n_blocks = kv->n_blocks();
    // One timed reading: the median of the runs after an untimed one,
    // repeated until 0.1 s have been timed (short steps are noisy), at most 500.
    auto time_batch = [&](const Batch& b) -> Expected<double> {
      std::vector<double> s;
      double total = 0;
      for (int r = 0; r < 2 || (total < 0.1 && r <= 500); ++r) {
        const auto t0 = Clock::now();
        SERVAL_RETURN_IF_ERROR(fwd.forward(b, &logits));
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r > 0) s.push_back(dt), total += dt;
      }
      return median(s);
    };
    std::vector<BlockId> all(n_blocks);
    for (int32_t i = 0; i < n_blocks; ++i) all[i] = i;
    // A point: one sequence's chunk (batch 0) or a decode batch, and its batch.
    struct Point {
      int n = 0;          // chunk tokens, or sequences
      int64_t pos = 0;    // chunk start, or decode depth
      bool decode = false;
      std::string what;
      std::vector<double> readings;
    };
    std::vector<Point> points;
    for (int64_t start : {int64_t{0}, prefill_depth}) {
      for (int n : chunks)
        if (start == 0 || n >= 2)
          points.push_back({n, start, false, "prefill chunk of " + std::to_string(n) + " tokens at position " + std::to_string(start), {}});
      if (prefill_depth == 0) break;
    }
    for (auto [bsz, d] : decode_points)
      points.push_back({bsz, d, true, "decode step of " + std::to_string(bsz) + " sequences at depth " + std::to_string(d), {}});
    auto batch_of = [&](const Point& pt) {
      Batch b;
      if (!pt.decode) {
        b.tokens.resize((size_t)pt.n);
        for (auto& x : b.tokens) x = tok(rng);
        const size_t blocks = (size_t)((pt.pos + pt.n + 15) / 16);  // the table a real sequence would have
        b.seqs = {BatchSeq{pt.pos, pt.n, std::span<const BlockId>(all).first(blocks), true}};
        return b;
      }
      const size_t per = (size_t)((pt.pos + 1 + 15) / 16);
      for (int i = 0; i < pt.n; ++i) {
        b.tokens.push_back(tok(rng));
        // The K/V before position d is whatever the pool holds: the arithmetic
        // (and so the time) does not depend on the values.
        b.seqs.push_back(BatchSeq{pt.pos, 1, std::span<const BlockId>(all).subspan((size_t)i * per, per), true});
      }
      return b;
    };
    {  // warm the caches, pages and threads before the first timed point
      const Batch w = batch_of(Point{std::min(64, max_chunk), 0, false, "", {}});
      for (int i = 0; i < 3; ++i)
        if (auto st = fwd.forward(w, &logits); !st.ok()) return fail(cmd, st.message(), 1);
    }
    // Rounds over every point, alternating direction, so a slow spell of a
    // shared machine touches one reading of many points rather than every
    // reading of a few; each point keeps the median of its rounds.
    prog.total = (int)(points.size() * (size_t)reps + engine_batches.size()) + 1 + (no_roofline ? 0 : 1);
    for (int round = 0; round < reps; ++round) {
      for (size_t k = 0; k < points.size(); ++k) {
        Point& pt = points[round % 2 == 0 ? k : points.size() - 1 - k];
        prog.step("round " + std::to_string(round + 1) + "/" + std::to_string(reps) + ": " + pt.what);
        auto sec = time_batch(batch_of(pt));
        if (!sec.ok()) return fail(cmd, sec.status().message(), 1);
        pt.readings.push_back(*sec);
      }
    }
    for (const Point& pt : points) {
      if (pt.decode) p.decode.push_back({pt.n, pt.pos, median(pt.readings)});
      else p.prefill.push_back({pt.n, median(pt.readings), pt.pos});
    }
  }
  // The engine around the forward: real requests, median inter-token latency.
  for (int bsz : engine_batches) {
    prog.step("engine decode, " + std::to_string(bsz) + " streams");
    EngineConfig ec;
    ec.n_threads = nt;
    ec.kv_type = kv_type;
    ec.kv_memory_bytes = std::min<size_t>(*kv_budget, (size_t)bsz * 256 * g.bytes_per_token() + (64u << 20));
    ec.max_seqs = std::max(bsz, 1);
    ec.max_model_len = n_ctx;
    auto engine = Engine::create(loaded->model, *loaded->tok, ec);
    if (!engine.ok()) return fail(cmd, engine.status().message(), 1);
    const int prompt_len = 32, gen_len = bsz > 16 ? 40 : 64;  // a large batch steps slowly
    std::vector<std::vector<double>> itls((size_t)bsz);
    std::vector<std::thread> th;
    std::mutex mu;
    std::string err;
    for (int i = 0; i < bsz; ++i)
      th.emplace_back([&, i] {
        Request r;
        std::mt19937 lr(77 + i);
        for (int k = 0; k < prompt_len; ++k) r.prompt.push_back((TokenId)(lr() % (uint32_t)c.n_vocab));
        r.params.temperature = 0;
        r.params.max_tokens = gen_len;
        r.params.ignore_eos = true;
        auto st = (*engine)->submit(std::move(r));
        if (!st.ok()) {
          std::lock_guard<std::mutex> lk(mu);
          err = st.status().message();
          return;
        }
        OutputEvent ev;
        Clock::time_point last{};
        int seen = 0;
        while ((*st)->next(&ev)) {
          if (!ev.error.ok()) {
            std::lock_guard<std::mutex> lk(mu);
            err = ev.error.message();
            return;
          }
          const auto now = Clock::now();
          // Skip the first quarter: the streams' prompts are still being admitted.
          if (seen++ > gen_len / 4) itls[(size_t)i].push_back(std::chrono::duration<double>(now - last).count());
          last = now;
        }
      });
    for (auto& t : th) t.join();
    if (!err.empty()) return fail(cmd, "engine measurement: " + err, 1);
    std::vector<double> all_itl;
    for (auto& v : itls) all_itl.insert(all_itl.end(), v.begin(), v.end());
    p.engine.push_back({bsz, prompt_len + gen_len * 5 / 8, median(all_itl)});  // mean context of the timed tokens
  }
  if (!no_roofline) {
    prog.step("roofline: memory bandwidth and peak throughput");
    if (auto bw = measure_read_bandwidth(nt, 512, 3); bw.ok()) p.mem_read_gb_s = bw->median;
    for (const RooflinePeak& pk : measure_peaks(nt, 3, 0.25)) {
      if (!pk.available || pk.bf16) continue;  // the kernels' peaks only: fp32 FMA and int8
      double& dst = pk.fp32 ? p.fp32_gflops : p.int8_gops;
      dst = std::max(dst, pk.figure.median);
    }
  }
  prog.step("fitting the step-time model");
  prog.end();
  if (auto st = plan::fit_step_model(&p); !st.ok()) return fail(cmd, st.message(), 1);
  const std::string text = plan::to_json(p).dump(2) + "\n";
  if (out_path.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) return fail(cmd, "cannot write '" + out_path + "'", 1);
  }
  std::fprintf(stderr,
               "%s: %s (%s, %s) on %s, %d threads: decode %.3f ms at batch 1, %.3f ms at batch %d; prefill %.0f tok/s "
               "at %d-token chunks; KV %s %llu bytes/token; read bandwidth %.1f GB/s%s%s\n",
               cmd.c_str(), model_path.c_str(), p.model_arch.c_str(), p.model_type.c_str(), p.isa.c_str(), nt,
               plan::decode_step_seconds(p, 1, 32) * 1e3, plan::decode_step_seconds(p, max_batch, 32) * 1e3, max_batch,
               (double)max_chunk / plan::chunk_step_seconds(p, max_chunk, 0), max_chunk,
               p.kv_type.c_str(), (unsigned long long)p.kv_bytes_per_token, p.mem_read_gb_s,
               out_path.empty() ? "" : " -> ", out_path.c_str());
  return 0;
}

// ---- serval plan ------------------------------------------------------------

// Request lengths from a JSONL trace: serve's access log (prompt_tokens,
// completion_tokens; lines without them are skipped) or lines with
// prompt_len / gen_len.
Expected<std::vector<plan::LengthSample>> read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("--trace: cannot read '" + path + "'");
  std::vector<plan::LengthSample> out;
  std::string line;
  int64_t line_no = 0;
  constexpr int64_t kMaxLines = 1000000;
  constexpr size_t kMaxLine = 1u << 20;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no > kMaxLines) return invalid_argument("--trace: more than 1000000 lines");
    if (line.size() > kMaxLine) return invalid_argument("--trace: line " + std::to_string(line_no) + " is longer than 1 MiB");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (json_nesting_depth(line) > 32)
      return invalid_argument("--trace: line " + std::to_string(line_no) + " nests deeper than 32 levels");
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return invalid_argument("--trace: line " + std::to_string(line_no) + " is not a JSON object");
    auto field = [&](const char* a, const char* b) -> const json* {
      if (j.contains(a)) return &j.at(a);
      if (j.contains(b)) return &j.at(b);
      return nullptr;
    };
    const json* pt = field("prompt_tokens", "prompt_len");
    const json* gt = field("completion_tokens", "gen_len");
    if (!pt || !gt) continue;  // not a generation request
    if (!pt->is_number_integer() || !gt->is_number_integer())
      return invalid_argument("--trace: line " + std::to_string(line_no) + ": token counts must be integers");
    const int64_t pv = pt->get<int64_t>(), gv = gt->get<int64_t>();
    if (pv < 1 || pv > (1 << 24) || gv < 0 || gv > (1 << 24))
      return invalid_argument("--trace: line " + std::to_string(line_no) + ": token counts out of range");
    if (gv == 0) continue;  // nothing generated (an error or max_tokens 0): no decode work
    out.push_back({(int32_t)pv, (int32_t)gv});
  }
  if (out.empty()) return invalid_argument("--trace: no line with prompt and generated token counts in '" + path + "'");
  return out;
}

// The sum of a Prometheus counter's samples (every label set) in an
// exposition text; nullopt when absent.
std::optional<double> counter_sum(const std::string& text, const std::string& name) {
  double sum = 0;
  bool any = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    const size_t sp = line.rfind(' ');
    try {
      sum += std::stod(std::string(line.substr(sp + 1)));
      any = true;
    } catch (...) {
    }
  }
  if (!any) return std::nullopt;
  return sum;
}

json percentiles_json(const plan::Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
}

json prediction_json(const plan::Prediction& r) {
  return {{"completed", r.completed},
          {"duration_s", r.duration_s},
          {"requests_per_s", r.req_s},
          {"gen_tok_s", r.gen_tok_s},
          {"prompt_tok_s", r.prompt_tok_s},
          {"ttft_s", percentiles_json(r.ttft)},
          {"itl_s", percentiles_json(r.itl)},
          {"e2e_s", percentiles_json(r.e2e)},
          {"busy_frac", r.busy_frac},
          {"prefill_time_frac", r.prefill_time_frac},
          {"mean_batch", r.mean_batch},
          {"mean_step_tokens", r.mean_step_tokens},
          {"kv_mean_frac", r.kv_mean_frac},
          {"kv_peak_frac", r.kv_peak_frac},
          {"preemptions", r.preemptions},
          {"max_waiting", r.max_waiting},
          {"saturated", r.saturated}};
}

json shape_json(const plan::EngineShape& s, uint64_t kv_bytes_per_token) {
  return {{"max_seqs", s.max_seqs},
          {"max_batch_tokens", s.max_batch_tokens},
          {"kv_blocks", s.kv_blocks},
          {"kv_memory_bytes", (uint64_t)s.kv_blocks * (uint64_t)s.block_size * kv_bytes_per_token},
          {"block_size", s.block_size},
          {"max_model_len", s.max_model_len}};
}

std::string bytes_text(double b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2fG", b / (1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.0fM", std::ceil(b / (1u << 20)));
  return buf;
}

void print_prediction(const plan::Prediction& r) {
  std::printf("  throughput  %.3f req/s | gen %.1f tok/s | prompt %.1f tok/s (%lld requests in %.1f s)\n", r.req_s,
              r.gen_tok_s, r.prompt_tok_s, (long long)r.completed, r.duration_s);
  auto pl = [](const char* name, const plan::Percentiles& p) {
    std::printf("  %-5s       p50 %.4f  p90 %.4f  p99 %.4f  mean %.4f s\n", name, p.p50, p.p90, p.p99, p.mean);
  };
  pl("TTFT", r.ttft);
  pl("ITL", r.itl);
  pl("E2E", r.e2e);
  std::printf("  engine      busy %.0f %% (%.0f %% of it on prompts) | %.1f sequences, %.1f tokens per step | KV mean "
              "%.1f %%, peak %.1f %% | preemptions %lld | waiting at most %lld\n",
              100 * r.busy_frac, 100 * r.prefill_time_frac, r.mean_batch, r.mean_step_tokens, 100 * r.kv_mean_frac, 100 * r.kv_peak_frac,
              (long long)r.preemptions, (long long)r.max_waiting);
  if (r.saturated)
    std::printf("  OVERLOADED: requests arrive faster than they finish; the queue grows for as long as the load "
                "lasts, so latencies depend on the run's length (%lld requests here)\n",
                (long long)r.completed);
}

int cmd_plan_predict(int argc, char** argv) {
  const std::string cmd = argc > 0 ? argv[0] : "serval plan";
  CLI::App app("Capacity planning: predicts throughput, TTFT and ITL of a replica for a workload from a profile "
               "('serval plan profile'), and recommends settings and the number of replicas for latency "
               "objectives. 'serval plan profile --help' for the measurement.",
               cmd);
  std::string profile_path, trace_path, kv_text, format = "text", url, api_key;
  double rate = 0, slo_ttft = 0, slo_itl = 0;
  int prompt_len = 0, gen_len = 0, requests = 1000, max_seqs = 64, max_batch_tokens = 256, ctx = 0;
  int max_replicas = 64;
  uint64_t seed = 1;
  bool validate = false;
  app.add_option("-p,--profile", profile_path, "profile from 'serval plan profile'")->required();
  app.add_option("--rate", rate, "requests per second (Poisson arrivals)")->required();
  app.add_option("--prompt-len", prompt_len, "prompt tokens per request");
  app.add_option("--gen-len", gen_len, "generated tokens per request");
  app.add_option("--trace", trace_path,
                 "JSONL of request lengths instead: serve's --log-format json access log (prompt_tokens, "
                 "completion_tokens) or {\"prompt_len\":P,\"gen_len\":G} lines; each request draws one");
  app.add_option("--requests", requests, "requests in the modelled run (from an idle replica)")
      ->capture_default_str();
  app.add_option("--seed", seed, "arrival and length seed")->capture_default_str();
  app.add_option("--slo-ttft-p99", slo_ttft, "objective: time to first token, 99th percentile, seconds")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--slo-itl-p99", slo_itl, "objective: inter-token latency, 99th percentile, seconds")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--kv-memory", kv_text, "KV pool per replica (512M, 2G); default: serve's 1G for the prediction, "
                                          "sized by the planner for the recommendation");
  app.add_option("--max-seqs", max_seqs, "the replica's --max-seqs for the prediction")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--max-batch-tokens", max_batch_tokens, "the replica's --max-batch-tokens for the prediction")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-c,--ctx", ctx, "context per sequence (default: the profile's, at most 4096)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--max-replicas", max_replicas, "most replicas the recommendation may use")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("-o,--output", format, "text or json")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  app.add_flag("--validate", validate,
               "also replay the workload against a running server (--url) with bench http's open loop and print "
               "predicted against measured");
  app.add_option("--url", url, "with --validate: the server, http://host:port");
  app.add_option("--api-key", api_key, "with --validate: sent as 'Authorization: Bearer KEY'");
  bool calibrate = false;
  app.add_flag("--calibrate", calibrate,
               "with --validate: predict from the profile rescaled to the machine's speed measured just before the run "
               "(three lone requests' inter-token latency against the profile's batch-1 decode step; the ratio is "
               "measured and reported before and after the run either way)");
  if (auto rc = parse(app, argc, argv)) return *rc;

  if (!(rate > 0) || !std::isfinite(rate) || rate > 1e6)
    return fail(cmd, "--rate: expected requests per second in (0, 1e6], got " + std::to_string(rate));
  if (requests < 1 || requests > 1000000) return fail(cmd, "--requests: expected 1..1000000");
  const bool fixed = prompt_len != 0 || gen_len != 0;
  if (fixed == !trace_path.empty())
    return fail(cmd, "give either --prompt-len and --gen-len, or --trace (one of the two)");
  if (fixed && (prompt_len < 1 || gen_len < 1))
    return fail(cmd, "--prompt-len and --gen-len: expected >= 1 token each, got " + std::to_string(prompt_len) + " and " +
                         std::to_string(gen_len));
  if (validate && url.empty()) return fail(cmd, "--validate needs --url (the running server)");
  if (validate && !fixed) return fail(cmd, "--validate replays fixed lengths: use --prompt-len/--gen-len, not --trace");
  if (!validate && !url.empty()) return fail(cmd, "--url is only used with --validate");

  auto prof = plan::read_profile(profile_path);
  if (!prof.ok()) return fail(cmd, prof.status().message());
  const plan::Profile& p = *prof;

  plan::Workload w;
  w.rate = rate;
  w.n_requests = requests;
  w.seed = seed;
  if (fixed) {
    w.lengths = {{prompt_len, gen_len}};
  } else {
    auto t = read_trace(trace_path);
    if (!t.ok()) return fail(cmd, t.status().message());
    w.lengths = std::move(*t);
  }
  const int64_t max_len = ctx > 0 ? ctx : std::min<int64_t>(p.n_ctx, 4096);
  if (ctx > p.n_ctx)
    return fail(cmd, "--ctx " + std::to_string(ctx) + " exceeds the profiled model's context of " + std::to_string(p.n_ctx));
  int64_t kv_bytes = 0;
  if (!kv_text.empty()) {
    auto kb = parse_kv_memory(kv_text);
    if (!kb.ok()) return fail(cmd, "--kv-memory: " + kb.status().message());
    kv_bytes = (int64_t)*kb;
  }
  plan::EngineShape shape;
  shape.max_seqs = max_seqs;
  shape.max_batch_tokens = max_batch_tokens;
  shape.block_size = p.block_size;
  shape.max_model_len = max_len;
  shape.kv_blocks = plan::kv_blocks_for(p, kv_bytes > 0 ? kv_bytes : (int64_t)1 << 30, p.block_size);
  if (auto st = plan::validate_inputs(shape, w); !st.ok()) return fail(cmd, st.message());

  const plan::Prediction pred = plan::simulate(p, shape, w);
  plan::Slo slo{slo_ttft, slo_itl};
  plan::PlanOptions opt;
  opt.kv_memory_bytes = kv_bytes;
  opt.max_replicas = max_replicas;
  opt.max_model_len = max_len;
  const plan::Recommendation rec = plan::recommend(p, w, slo, opt);

  // Validation: replay against the server, then predict again at the prompt
  // length the server actually counted (bench http's prompts are words).
  std::optional<bench_http::RunResult> measured;
  plan::Prediction pred_at_measured = pred;
  double measured_prompt = 0;
  double engine_steps = -1, engine_busy_s = -1;  // from the server's /metrics (-1: not available)
  // Calibration: the machine's speed just before (and after) the run, as the
  // ratio of a lone request's median inter-token latency to the profile's
  // batch-1 decode step (0: not measured). With --calibrate the prediction
  // shown against the measurement uses the profile scaled by the `before` ratio.
  double drift_before = 0, drift_after = 0;
  // The same for prefill: a lone request's time to first token against the
  // profile's step of one chunk of its prompt. Prefill is bound by compute,
  // decode by memory bandwidth, and on a shared machine the two move apart.
  double prefill_drift_before = 0, prefill_drift_after = 0;
  plan::Prediction pred_uncalibrated = pred;
  std::optional<plan::Prediction> pred_calibrated;
  if (validate) {
    bench_http::Options bo;
    bo.url = url;
    bo.api_key = api_key;
    bo.requests = requests;
    bo.prompt_len = prompt_len;
    bo.gen_len = gen_len;
    bo.rate = rate;
    bo.seed = seed;
    bo.concurrency = {std::min(requests, 1024)};

    // Prompts no earlier run sent: the model assumes no prefix-cache hits.
    bo.prompt_salt = bench_http::fresh_prompt_salt();
    auto target = bench_http::make_plan(bo);
    if (!target.ok()) return fail(cmd, target.status().message(), 1);
    std::fprintf(stderr, "%s: replaying %d requests at %.3f req/s against %s ...\n", cmd.c_str(), requests, rate,
                 url.c_str());
    // The engine's own step count and busy time, from /metrics around the run.
    auto scrape = [&]() -> std::optional<std::pair<double, double>> {
      auto m = bench_http::http_get(target->target, "/metrics", api_key, 10);
      if (!m.ok()) return std::nullopt;
      auto steps = counter_sum(*m, "serval_engine_steps_total");
      auto busy = counter_sum(*m, "serval_engine_busy_seconds_total");
      if (!steps || !busy) return std::nullopt;
      return std::make_pair(*steps, *busy);
    };
    {  // two requests one at a time, not counted: a cold server is slower
      bench_http::Options wo = bo;
      wo.rate = 0;
      wo.requests = 2;
      if (auto w = bench_http::run_load(wo, *target, 1); !w.ok()) return fail(cmd, w.status().message(), 1);
    }
    // Returns {decode ratio, prefill ratio} (0 where not measured).
    auto probe = [&]() -> std::pair<double, double> {
      bench_http::Options co = bo;
      co.rate = 0;
      co.requests = 3;
      auto c = bench_http::run_load(co, *target, 1);
      if (!c.ok() || c->completed == 0) return {0, 0};
      const double want = plan::decode_step_seconds(p, 1, (int64_t)prompt_len + gen_len / 2);
      const double decode = want > 0 && !c->itl.empty() ? plan::percentiles_of(c->itl).p50 / want : 0;
      const int64_t lone_prompt = std::max<int64_t>(1, std::llround((double)c->prompt_tokens / (double)c->completed));
      const double want_ttft = plan::chunk_step_seconds(p, std::min<int64_t>(lone_prompt, p.n_ctx - 1), 0);
      const double prefill = want_ttft > 0 && !c->ttft.empty() ? plan::percentiles_of(c->ttft).p50 / want_ttft : 0;
      return {decode, prefill};
    };
    std::tie(drift_before, prefill_drift_before) = probe();
    const auto before = scrape();
    auto r = bench_http::run_load(bo, *target, bo.concurrency[0]);
    if (!r.ok()) return fail(cmd, r.status().message(), 1);
    const auto after = scrape();
    std::tie(drift_after, prefill_drift_after) = probe();
    if (before && after) {
      engine_steps = after->first - before->first;
      engine_busy_s = after->second - before->second;
    }
    if (r->completed == 0) return fail(cmd, "every request failed: " + r->last_error, 1);
    measured = std::move(*r);
    measured_prompt = (double)measured->prompt_tokens / (double)measured->completed;
    plan::Workload wm = w;
    wm.lengths = {{(int32_t)std::lround(measured_prompt), gen_len}};
    if (plan::validate_inputs(shape, wm).ok()) {
      pred_uncalibrated = plan::simulate(p, shape, wm);
      if (drift_before > 0) pred_calibrated = plan::simulate(plan::scaled(p, drift_before), shape, wm);
      pred_at_measured = calibrate && pred_calibrated ? *pred_calibrated : pred_uncalibrated;
    }
  }

  if (format == "json") {
    json j = {{"profile",
               {{"path", profile_path},
                {"model", p.model_path},
                {"cpu", p.cpu},
                {"threads", p.threads},
                {"kv_bytes_per_token", p.kv_bytes_per_token}}},
              {"workload",
               {{"rate", rate}, {"requests", requests}, {"seed", seed}, {"length_samples", w.lengths.size()}}},
              {"settings", shape_json(shape, p.kv_bytes_per_token)},
              {"prediction", prediction_json(pred)}};
    json rj = {{"feasible", rec.feasible},
               {"replicas", rec.replicas},
               {"settings", shape_json(rec.shape, p.kv_bytes_per_token)},
               {"per_replica", prediction_json(rec.per_replica)},
               {"max_rate_per_replica", rec.max_rate_per_replica},
               {"headroom", rec.headroom},
               {"binding", rec.binding},
               {"why", rec.why}};
    if (slo_ttft > 0) rj["slo_ttft_p99_s"] = slo_ttft;
    if (slo_itl > 0) rj["slo_itl_p99_s"] = slo_itl;
    j["recommendation"] = rj;
    if (measured) {
      const auto& m = *measured;
      const double wall = std::max(m.wall_s, 1e-9);
      j["validation"] = {{"measured_prompt_tokens", measured_prompt},
                         {"predicted", prediction_json(pred_at_measured)},
                         {"measured",
                          {{"completed", m.completed},
                           {"failed", m.failed},
                           {"requests_per_s", (double)m.completed / wall},
                           {"gen_tok_s", (double)m.gen_tokens / wall},
                           {"ttft_s", percentiles_json(plan::percentiles_of(m.ttft))},
                           {"itl_s", percentiles_json(plan::percentiles_of(m.itl))},
                           {"e2e_s", percentiles_json(plan::percentiles_of(m.e2e))},
                           {"max_start_lag_s", m.max_start_lag_s},
                           {"engine_steps", engine_steps >= 0 ? json(engine_steps) : json(nullptr)},
                           {"engine_busy_s", engine_busy_s >= 0 ? json(engine_busy_s) : json(nullptr)}}}};
      j["validation"]["predicted"]["steps"] = pred_at_measured.steps;
      j["validation"]["predicted"]["busy_s"] = pred_at_measured.busy_frac * pred_at_measured.duration_s;
      j["validation"]["calibration"] = {{"drift_before", drift_before > 0 ? json(drift_before) : json(nullptr)},
                                        {"drift_after", drift_after > 0 ? json(drift_after) : json(nullptr)},
                                        {"prefill_drift_before", prefill_drift_before > 0 ? json(prefill_drift_before) : json(nullptr)},
                                        {"prefill_drift_after", prefill_drift_after > 0 ? json(prefill_drift_after) : json(nullptr)},
                                        {"applied", calibrate && pred_calibrated.has_value()}};
      j["validation"]["predicted_uncalibrated"] = prediction_json(pred_uncalibrated);
      j["validation"]["predicted_calibrated"] = pred_calibrated ? prediction_json(*pred_calibrated) : json(nullptr);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("profile: %s (%s %s) on %s, %d threads, %s; KV %s %llu bytes/token; decode step %.3f ms at batch 1\n",
              p.model_path.c_str(), p.model_arch.c_str(), p.model_type.c_str(), p.cpu.c_str(), p.threads,
              p.isa.c_str(), p.kv_type.c_str(), (unsigned long long)p.kv_bytes_per_token,
              plan::decode_step_seconds(p, 1, 32) * 1e3);
  if (fixed)
    std::printf("workload: %.3f req/s (Poisson), prompt %d, gen %d tokens, %d requests, seed %llu\n", rate, prompt_len,
                gen_len, requests, (unsigned long long)seed);
  else
    std::printf("workload: %.3f req/s (Poisson), lengths drawn from %zu trace requests, %d requests, seed %llu\n", rate,
                w.lengths.size(), requests, (unsigned long long)seed);
  std::printf("\none replica at --max-seqs %d --max-batch-tokens %d --kv-memory %s (%lld blocks of %d tokens):\n",
              shape.max_seqs, shape.max_batch_tokens,
              bytes_text((double)shape.kv_blocks * shape.block_size * (double)p.kv_bytes_per_token).c_str(),
              (long long)shape.kv_blocks, shape.block_size);
  print_prediction(pred);
  std::string objectives;
  if (slo_ttft > 0) objectives += "TTFT p99 <= " + std::to_string(slo_ttft).substr(0, 6) + " s";
  if (slo_itl > 0) objectives += std::string(objectives.empty() ? "" : ", ") + "ITL p99 <= " + std::to_string(slo_itl).substr(0, 6) + " s";
  if (objectives.empty()) objectives = "no latency objective: the fewest replicas that keep up";
  std::printf("\nrecommendation (%s):\n", objectives.c_str());
  if (!rec.feasible) {
    std::printf("  cannot be met: %s binds — %s\n", rec.binding.c_str(), rec.why.c_str());
  } else {
    std::printf("  %d replica%s, each: serval serve --max-seqs %d --max-batch-tokens %d --kv-memory %s\n", rec.replicas,
                rec.replicas == 1 ? "" : "s", rec.shape.max_seqs, rec.shape.max_batch_tokens,
                bytes_text((double)rec.kv_memory_bytes).c_str());
    std::printf("  each replica at %.3f req/s:\n", rate / rec.replicas);
    print_prediction(rec.per_replica);
    std::printf("  headroom: one replica keeps %s up to %.3f req/s (%+.0f %% over its share)\n",
                slo_ttft > 0 || slo_itl > 0 ? "the objectives" : "up", rec.max_rate_per_replica, 100 * rec.headroom);
    std::printf("  binds first: %s — %s\n", rec.binding.c_str(), rec.why.c_str());
  }
  if (measured) {
    const auto& m = *measured;
    const double wall = std::max(m.wall_s, 1e-9);
    const plan::Percentiles tt = plan::percentiles_of(m.ttft), it = plan::percentiles_of(m.itl),
                            ee = plan::percentiles_of(m.e2e);
    const plan::Prediction& q = pred_at_measured;
    std::printf("\nvalidation against %s (%lld/%d requests ok; the server counted %.1f prompt tokens per request, "
                "predicted at that length):\n",
                url.c_str(), (long long)m.completed, requests, measured_prompt);
    const auto off = [](double a, double b) {
      return a > 0 && b > 0 && (std::fabs(b / a - 1) > 0.1 || std::fabs(a - 1) > 0.1 || std::fabs(b - 1) > 0.1);
    };
    if (drift_before > 0)
      std::printf("  machine speed: a lone request's decode steps ran %.3fx the profile's just before the run, %.3fx "
                  "just after%s\n",
                  drift_before, drift_after,
                  calibrate ? "; the prediction below uses the profile scaled by the first" : "");
    if (prefill_drift_before > 0)
      std::printf("  machine speed: a lone request's time to first token was %.3fx the profile's prefill step just "
                  "before the run, %.3fx just after\n",
                  prefill_drift_before, prefill_drift_after);
    if (!calibrate && (off(drift_before, drift_after) || off(prefill_drift_before, prefill_drift_after)))
      std::printf("  the machine is not running at the profile's speed (more than 10 %% off): expect latency errors\n");
    std::printf("  %-16s %12s %12s %8s\n", "", "predicted", "measured", "error");
    auto row = [](const char* name, double pr, double me) {
      std::printf("  %-16s %12.4g %12.4g %+7.1f%%\n", name, pr, me, me != 0 ? 100 * (pr - me) / me : 0.0);
    };
    row("requests/s", q.req_s, (double)m.completed / wall);
    row("gen tok/s", q.gen_tok_s, (double)m.gen_tokens / wall);
    row("TTFT p50 s", q.ttft.p50, tt.p50);
    row("TTFT p99 s", q.ttft.p99, tt.p99);
    row("ITL p50 s", q.itl.p50, it.p50);
    row("ITL p99 s", q.itl.p99, it.p99);
    row("E2E p50 s", q.e2e.p50, ee.p50);
    row("E2E p99 s", q.e2e.p99, ee.p99);
    if (engine_steps > 0) {
      row("engine steps", (double)q.steps, engine_steps);
      row("engine busy s", q.busy_frac * q.duration_s, engine_busy_s);
      row("s per step", q.busy_frac * q.duration_s / std::max<double>(1, (double)q.steps), engine_busy_s / engine_steps);
    }
    if (m.failed) std::printf("  %lld requests failed (last error: %s)\n", (long long)m.failed, m.last_error.c_str());
    if (m.max_start_lag_s > 0.05)
      std::printf("  note: the load generator started a request %.2f s late\n", m.max_start_lag_s);
  }
  return 0;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "profile") {
    std::string name = "serval plan profile";
    argv[1] = name.data();
    return cmd_plan_profile(argc - 1, argv + 1);
  }
  return cmd_plan_predict(argc, argv);
}

}  // namespace serval::cli
