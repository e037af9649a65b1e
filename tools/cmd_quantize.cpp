// serval quantize IN.gguf OUT.gguf TYPE [--imatrix FILE] [--threads N] [--allow-requantize]
//
// The CLI of src/quantize/quantize_model.h: one-line errors (status 2 for bad
// input, 1 for I/O), a progress bar on stderr when stderr is a terminal, a
// one-line summary at the end.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli_util.h"
#include "commands.h"
#include "common/thread_pool.h"
#include "quantize/quantize_model.h"

namespace serval::cli {
namespace {

// "[#####.....] 12/201 tensors, 345/1234 MiB" redrawn in place (terminals only).
void draw_progress(size_t done, size_t total, uint64_t bytes, uint64_t bytes_total) {
  constexpr int kWidth = 30;
  const int fill = bytes_total ? (int)((double)bytes / (double)bytes_total * kWidth) : kWidth;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
  bar[kWidth] = '\0';
  std::fprintf(stderr, "\r[%s] %zu/%zu tensors, %.0f/%.0f MiB", bar, done, total, (double)bytes / 1048576.0,
               (double)bytes_total / 1048576.0);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  const std::string cmd = "serval quantize";
  CLI::App app("Quantize a GGUF model (F32/F16/BF16 source) to another type, llama.cpp-compatible", cmd);
  std::string in, out, type, imatrix_path;
  int threads = 0;
  bool allow_requantize = false;
  app.add_option("input", in, "source GGUF (F32, F16 or BF16 weights)")->required();
  app.add_option("output", out, "GGUF file to write")->required();
  app.add_option("type", type, "target type: " + quant::file_type_names())->required();
  app.add_option("--imatrix", imatrix_path, "importance matrix (llama.cpp legacy .dat, e.g. from serval imatrix)");
  app.add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--allow-requantize", allow_requantize, "accept an already-quantized source (loses accuracy)");
  if (auto rc = parse(app, argc, argv)) return *rc;

  auto ft = quant::find_file_type(type);
  if (!ft) return fail(cmd, "unknown type '" + type + "' (valid: " + quant::file_type_names() + ")");
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && std::filesystem::equivalent(in, out, ec))
    return fail(cmd, "input and output are the same file '" + out + "'");

  quant::Imatrix im;
  quant::QuantizeOptions opt;
  opt.file_type = *ft;
  opt.allow_requantize = allow_requantize;
  if (!imatrix_path.empty()) {
    auto r = quant::read_imatrix(imatrix_path);
    if (!r.ok()) return fail(cmd, r.status().message());
    im = std::move(r.value());
    opt.imatrix = &im;
    opt.imatrix_path = imatrix_path;
  }
  ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
  opt.pool = &pool;
  if (isatty(STDERR_FILENO)) opt.progress = draw_progress;
  opt.warn = [&](const std::string& m) { std::fprintf(stderr, "%s: warning: %s\n", cmd.c_str(), m.c_str()); };

  const auto t0 = std::chrono::steady_clock::now();
  auto r = quant::quantize_model(in, out, opt);
  if (!r.ok()) return fail(cmd, r.status().message(), r.status().code() == StatusCode::io_error ? 1 : 2);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "%s: wrote %s (%s): %zu tensors quantized (%zu with imatrix), %zu copied, %zu by the row-length "
               "fallback; %.1f -> %.1f MiB in %.1f s\n",
               cmd.c_str(), out.c_str(), std::string(ft->name).c_str(), r->n_quantized, r->n_imatrix, r->n_copied,
               r->n_fallback, (double)r->in_bytes / 1048576.0, (double)r->out_bytes / 1048576.0, secs);
  return 0;
}

}  // namespace serval::cli
