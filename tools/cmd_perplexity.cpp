// serval perplexity -m MODEL -f TEXT [--ctx N] [--chunks N] [-t N] [--kv-type T]
//                   [--kl-divergence-base FILE [--kl-divergence]]
// serval imatrix -m MODEL -f TEXT -o FILE [--ctx N] [--chunks N] [-t N]
//
// The CLI of src/quantize/perplexity.h and imatrix.h. perplexity alone prints
// PPL; with --kl-divergence-base it also saves the log-probabilities there;
// with --kl-divergence too it reads that file instead and compares (-f is then
// optional: the file holds the tokens). Results go to stdout, progress to
// stderr (terminals only).
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli_util.h"
#include "commands.h"
#include "common/thread_pool.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "quantize/perplexity.h"

namespace serval::cli {
namespace {

constexpr uintmax_t kMaxTextBytes = 256u << 20;

void chunk_progress(int32_t done, int32_t total) {
  std::fprintf(stderr, "\rchunk %d/%d", done, total);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

struct EvalFlags {
  std::string model, text;
  int ctx = 512, chunks = 0, threads = 0;
  KvType kv_type = KvType::f32;

  void add(CLI::App& app, bool text_required) {
    app.add_option("-m,--model", model, "GGUF model file")->required();
    auto* f = app.add_option("-f,--file", text, "plain-text file to evaluate");
    if (text_required) f->required();
    app.add_option("-c,--ctx", ctx, "tokens per chunk")->check(CLI::Range(16, 1 << 16));
    app.add_option("--chunks", chunks, "at most this many chunks (0: all)")->check(CLI::Range(0, 1 << 20));
    app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
    cli::add_kv_type_option(app, &kv_type);
  }
  int n_threads() const { return threads > 0 ? threads : ThreadPool::default_threads(); }
  // Options for the library; progress on stderr only when it is a terminal.
  quant::EvalOptions options(ThreadPool* pool) const {
    quant::EvalOptions o;
    o.n_ctx = ctx;
    o.max_chunks = chunks;
    o.kv_type = kv_type;
    o.pool = pool;
    if (isatty(STDERR_FILENO)) o.progress = chunk_progress;
    return o;
  }
};

// Reads and tokenizes the text; empty optional after printing the error.
std::optional<std::vector<int32_t>> text_tokens(const std::string& cmd, const std::string& path, const Tokenizer& tok) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) {
    fail(cmd, "cannot read text file '" + path + "': " + ec.message());
    return std::nullopt;
  }
  if (size > kMaxTextBytes) {
    fail(cmd, "text file '" + path + "' is larger than 256 MiB");
    return std::nullopt;
  }
  std::string text;
  if (!read_file(path, text)) {
    fail(cmd, "cannot read text file '" + path + "'");
    return std::nullopt;
  }
  return tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  const std::string cmd = "serval perplexity";
  CLI::App app("Perplexity of a model over a text; KL divergence against a saved reference", cmd);
  EvalFlags fl;
  fl.add(app, false);
  std::string base;
  bool kld = false;
  app.add_option("--kl-divergence-base", base, "file of reference log-probabilities: written, or read with "
                                               "--kl-divergence");
  app.add_flag("--kl-divergence", kld, "compare with --kl-divergence-base instead of writing it");
  if (auto rc = parse(app, argc, argv)) return *rc;
  if (kld && base.empty()) return fail(cmd, "--kl-divergence needs --kl-divergence-base FILE");
  if (!kld && fl.text.empty()) return fail(cmd, "--file is required (the text to evaluate)");

  auto lm = load_model(cmd, fl.model);
  if (!lm) return 2;
  ThreadPool pool(fl.n_threads());
  const quant::EvalOptions opt = fl.options(&pool);
  std::vector<int32_t> chunked;
  if (!fl.text.empty()) {
    auto toks = text_tokens(cmd, fl.text, *lm->tok);
    if (!toks) return 2;
    auto c = quant::chunk_tokens(*toks, *lm->model, opt);
    if (!c.ok()) return fail(cmd, c.status().message());
    chunked = std::move(c.value());
  }

  if (kld) {
    auto r = quant::kl_divergence(*lm->model, base, opt, chunked);
    if (!r.ok()) return fail(cmd, r.status().message(), r.status().code() == StatusCode::io_error ? 1 : 2);
    std::printf("chunks: %d, scored tokens: %lld\n", r->ppl.n_chunks, (long long)r->ppl.n_scored);
    std::printf("PPL: %.4f +/- %.4f (base %.4f)\n", r->ppl.ppl, r->ppl.ppl_err, r->base_ppl);
    std::printf("PPL ratio: %.5f (ln ratio %.6f +/- %.6f)\n", r->ppl_ratio, r->ln_ratio, r->ln_ratio_err);
    std::printf("Mean KLD: %.6f +/- %.6f (median %.6f, max %.6f)\n", r->kl_mean, r->kl_err, r->kl_median, r->kl_max);
    std::printf("Same top p: %.3f +/- %.3f %%\n", 100 * r->top1, 100 * r->top1_err);
    return 0;
  }
  auto r = quant::perplexity(*lm->model, chunked, opt, base);
  if (!r.ok()) return fail(cmd, r.status().message(), r.status().code() == StatusCode::io_error ? 1 : 2);
  std::printf("chunks: %d, scored tokens: %lld\n", r->n_chunks, (long long)r->n_scored);
  std::printf("PPL: %.4f +/- %.4f\n", r->ppl, r->ppl_err);
  if (!base.empty()) std::fprintf(stderr, "%s: saved log-probabilities to %s\n", cmd.c_str(), base.c_str());
  return 0;
}

int cmd_imatrix(int argc, char** argv) {
  const std::string cmd = "serval imatrix";
  CLI::App app("Importance matrix (sums of squared activations per input channel) over a text", cmd);
  EvalFlags fl;
  fl.add(app, true);
  std::string out;
  app.add_option("-o,--output", out, "imatrix file to write (llama.cpp legacy format)")->required();
  if (auto rc = parse(app, argc, argv)) return *rc;

  auto lm = load_model(cmd, fl.model);
  if (!lm) return 2;
  ThreadPool pool(fl.n_threads());
  const quant::EvalOptions opt = fl.options(&pool);
  auto toks = text_tokens(cmd, fl.text, *lm->tok);
  if (!toks) return 2;
  auto chunked = quant::chunk_tokens(*toks, *lm->model, opt);
  if (!chunked.ok()) return fail(cmd, chunked.status().message());
  quant::ImatrixCollector collector(*lm->model);
  auto r = quant::perplexity(*lm->model, *chunked, opt, "", &collector);
  if (!r.ok()) return fail(cmd, r.status().message(), 1);
  const quant::Imatrix im = collector.result(std::filesystem::path(fl.text).filename().string());
  Status st = quant::write_imatrix(im, out);
  if (!st.ok()) return fail(cmd, st.message(), 1);
  std::printf("PPL: %.4f +/- %.4f over %d chunks\n", r->ppl, r->ppl_err, r->n_chunks);
  std::fprintf(stderr, "%s: wrote %zu entries (%d chunks) to %s\n", cmd.c_str(), im.entries.size(), im.last_call,
               out.c_str());
  return 0;
}

}  // namespace serval::cli
