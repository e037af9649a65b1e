// serval batch -m MODEL IN.jsonl OUT.jsonl: OpenAI batch input lines run
// offline through the same engine and API code as `serval serve`, with the
// same output and error line format. Resumable: every finished line is
// committed to a state file (SQLite, OUT.jsonl.state by default) before it
// counts, so a killed run rerun with the same command continues from the
// first unfinished line and repeats nothing that was committed.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "serval/engine.h"
#include "server/batch_runner.h"
#include "server/batch_store.h"
#include "server/openai_server.h"

namespace serval::cli {
namespace {

namespace fs = std::filesystem;

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 359999) return "--:--";
  const int t = (int)(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

bool final_status(const std::string& s) {
  return s == "completed" || s == "failed" || s == "cancelled" || s == "expired";
}

}  // namespace

int cmd_batch(int argc, char** argv) {
  const std::string cmd = "serval batch";
  CLI::App app("Run an OpenAI batch file (JSONL: custom_id, method, url, body) offline; resumable", cmd);
  std::string model_path, in_path, out_path, state_path, chat_template_file, served_name, kv_memory = "1G";
  std::vector<std::string> aliases;
  int threads = 0, concurrency = 16, max_batch_tokens = 512, max_seqs = 64;
  int64_t ctx = 0;
  bool restart = false, no_progress = false;
  server::BatchLimits limits;
  app.add_option("-m,--model", model_path, "GGUF model file")->required();
  app.add_option("input", in_path, "input JSONL file (one request per line)")->required();
  app.add_option("output", out_path, "output JSONL file (errors go to OUTPUT's name with .errors.jsonl)")->required();
  app.add_option("--state", state_path, "state file for resuming (default: OUTPUT.state)");
  app.add_flag("--restart", restart, "discard the state file and start from the first line");
  app.add_option("--concurrency", concurrency, "lines in flight at once")->check(CLI::Range(1, 4096));
  app.add_option("-t,--threads", threads, "compute threads (default: physical cores)")->check(CLI::Range(0, 1024));
  app.add_option("--kv-memory", kv_memory, "KV cache pool: bytes (512M, 2G) or a fraction of free RAM");
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(app, &kv_type);
  app.add_option("-c,--ctx-size,--max-model-len", ctx, "context per sequence (0: the model's, at most 4096)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  app.add_option("--max-batch-tokens", max_batch_tokens, "token budget of one engine step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-seqs", max_seqs, "sequences per engine step")->check(CLI::Range(1, 1 << 16));
  app.add_option("--chat-template", chat_template_file, "Jinja chat template file (overrides the model's)");
  app.add_option("--served-model-name", served_name, "model id the lines' \"model\" may name (default: general.name)");
  app.add_option("-a,--alias", aliases, "another model id the lines may name (repeatable)");
  app.add_option("--max-lines", limits.max_lines, "most lines in the input")->check(CLI::Range((size_t)1, (size_t)10'000'000));
  app.add_option("--max-file-bytes", limits.max_file_bytes, "largest input file")
      ->check(CLI::Range((size_t)1, (size_t)1 << 40));
  app.add_flag("--no-progress", no_progress, "no progress line on a terminal");
  if (auto rc = parse(app, argc, argv)) return *rc;

  std::error_code ec;
  if (!fs::is_regular_file(in_path, ec)) return fail(cmd, "cannot read the input '" + in_path + "'");
  const std::string in_abs = fs::absolute(in_path).lexically_normal().string();
  const std::string out_abs = fs::absolute(out_path).lexically_normal().string();
  if (in_abs == out_abs) return fail(cmd, "the output must not be the input file");
  std::string err_path = out_abs;
  if (err_path.ends_with(".jsonl")) err_path.resize(err_path.size() - 6);
  err_path += ".errors.jsonl";
  if (state_path.empty()) state_path = out_abs + ".state";
  if (restart) {
    for (const char* sfx : {"", "-wal", "-shm"}) fs::remove(state_path + sfx, ec);
  }
  auto kvb = parse_kv_memory(kv_memory);
  if (!kvb.ok()) return fail(cmd, kvb.status().message());
  std::string chat_template;
  if (!chat_template_file.empty() && (!read_file(chat_template_file, chat_template) || chat_template.size() > 256 * 1024))
    return fail(cmd, "cannot read --chat-template '" + chat_template_file + "' (or larger than 256 KiB)");

  // The state: one batch over the input, kept beside the output.
  server::BatchStore::Options so;
  so.dir = fs::path(state_path).parent_path().string();
  if (so.dir.empty()) so.dir = ".";
  so.db_path = state_path;
  so.files_dir = false;
  auto store = server::BatchStore::open(so);
  if (!store.ok()) return fail(cmd, "state file '" + state_path + "': " + store.status().message(), 1);
  const std::vector<std::string> all = {"validating", "in_progress", "finalizing", "cancelling",
                                        "completed",  "failed",      "cancelled",  "expired"};
  std::vector<server::BatchRecord> found = (*store)->batches_in(all);
  std::string batch_id;
  bool resumed = false;
  if (!found.empty()) {
    const server::BatchRecord& b = found.front();
    std::optional<server::FileRecord> f = (*store)->file("local", b.input_file_id);
    std::string content;
    const bool same_input = f && f->path == in_abs && read_file(in_abs, content) &&
                            (b.input_hash == 0 || server::fnv1a64(content) == b.input_hash);
    if (!same_input || b.output_path != out_abs)
      return fail(cmd, "the state file '" + state_path + "' belongs to another input or output (or the input changed); "
                       "pass --restart to start over");
    batch_id = b.id;
    resumed = true;
  } else {
    auto f = (*store)->add_file_ref("local", in_abs, (int64_t)fs::file_size(in_abs, ec));
    if (!f.ok()) return fail(cmd, f.status().message(), 1);
    server::BatchRecord b;
    b.owner = "local";
    b.endpoint = "*";
    b.input_file_id = f->id;
    b.output_path = out_abs;
    b.error_path = err_path;
    b.completion_window = "none";
    auto added = (*store)->add_batch(b);
    if (!added.ok()) return fail(cmd, added.status().message(), 1);
    batch_id = added->id;
  }

  auto loaded = load_model(cmd, model_path);
  if (!loaded) return 2;
  EngineConfig ec_cfg;
  ec_cfg.n_threads = threads;
  ec_cfg.kv_memory_bytes = *kvb;
  ec_cfg.kv_type = kv_type;
  ec_cfg.max_batch_tokens = max_batch_tokens;
  ec_cfg.max_seqs = max_seqs;
  ec_cfg.max_model_len = ctx;
  auto engine = Engine::create(loaded->model, *loaded->tok, ec_cfg);
  if (!engine.ok()) return fail(cmd, engine.status().message());
  server::ServerConfig scfg;
  scfg.model_name = served_name;
  scfg.model_aliases = aliases;
  for (std::string& id : model_file_ids(model_path)) scfg.model_aliases.push_back(std::move(id));
  if (!chat_template.empty()) scfg.chat_template = chat_template;
  scfg.max_inflight_requests = (size_t)concurrency + 16;
  scfg.observability.log_json = false;
  auto api = server::OpenAiServer::create(**engine, scfg);
  if (!api.ok()) return fail(cmd, api.status().message());
  server::OpenAiServer* api_raw = api->get();

  server::BatchRunnerConfig rc;
  rc.concurrency = concurrency;
  rc.limits = limits;
  rc.poll_s = 0.1;
  server::BatchRunner runner(
      **store,
      [api_raw](const server::LineCall& c, std::function<void(server::LineReply)> done) {
        return api_raw->execute_line(c, std::move(done));
      },
      rc);

  const bool tty = !no_progress && isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  std::mutex mu;
  server::BatchProgress last;
  // Rates count only this run's lines (a resumed run starts from the committed ones).
  int64_t first_done = 0, first_tokens = 0;
  if (resumed) {
    const server::RequestCounts c0 = (*store)->counts(batch_id, found.front().total);
    first_done = c0.completed + c0.failed;
    first_tokens = (*store)->completion_tokens(batch_id);
  }
  double last_draw = -1;
  runner.set_progress([&](const server::BatchProgress& p) {
    std::lock_guard<std::mutex> lk(mu);
    last = p;
    const int64_t done = p.counts.completed + p.counts.failed;
    if (!tty || p.counts.total == 0) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el - last_draw < 0.1 && done < p.counts.total) return;
    last_draw = el;
    const double rate = el > 0 ? (double)(done - first_done) / el : 0;
    const double tps = el > 0 ? (double)(p.completion_tokens - first_tokens) / el : 0;
    const int width = 24;
    const int fill = (int)((double)width * (double)done / (double)p.counts.total);
    std::string bar(width, ' ');
    for (int i = 0; i < fill && i < width; ++i) bar[(size_t)i] = '#';
    std::fprintf(stderr, "\r[%s] %lld/%lld lines%s  %.1f lines/s  %.0f tok/s  ETA %s   ", bar.c_str(), (long long)done,
                 (long long)p.counts.total,
                 p.counts.failed ? (" (" + std::to_string(p.counts.failed) + " failed)").c_str() : "", rate, tps,
                 fmt_duration(rate > 0 ? (double)(p.counts.total - done) / rate : -1).c_str());
    std::fflush(stderr);
  });
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (resumed)
    std::fprintf(stderr, "serval batch: resuming from %s\n", state_path.c_str());
  runner.start();
  std::optional<server::BatchRecord> b;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_signal) break;
    b = (*store)->batch("", batch_id);
    if (b && final_status(b->status)) break;
  }
  runner.stop();
  if (tty) std::fprintf(stderr, "\n");
  if (g_signal) {
    std::fprintf(stderr, "serval batch: interrupted; finished lines are kept in %s: run the same command to resume\n",
                 state_path.c_str());
    return 130;
  }
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const server::RequestCounts c = (*store)->counts(batch_id, b->total);
  const int64_t tokens = (*store)->completion_tokens(batch_id);
  if (b->status == "failed") {
    std::string why = b->errors_json;
    return fail(cmd, "the input was refused: " + why, 2);
  }
  std::fprintf(stderr, "serval batch: %lld lines: %lld ok, %lld failed in %.1f s (%.1f lines/s, %.0f tokens/s) -> %s%s\n",
               (long long)c.total, (long long)c.completed, (long long)c.failed, el,
               el > 0 ? (double)(c.completed + c.failed - first_done) / el : 0.0,
               el > 0 ? (double)(tokens - first_tokens) / el : 0.0, out_abs.c_str(),
               c.failed ? (", errors in " + err_path).c_str() : "");
  return c.failed ? 1 : 0;
}

}  // namespace serval::cli
