// serval serve -m MODEL [--host H] [--port P] ...: the OpenAI-compatible server.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <pthread.h>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "kv_type_flag.h"
#include "load_model.h"
#include "tp_flag.h"
#include "spec_flags.h"
#include "commands.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "serval/engine.h"
#include "server/batch_api.h"
#include "server/batch_runner.h"
#include "server/batch_store.h"
#include "server/webui.h"
#include "server/http_server.h"
#include "server/openai_server.h"
#include "tokenizer/tokenizer.h"
#include "model_catalog.h"
#include "serve_router.h"

namespace serval::cli {
namespace {

bool read_file(const std::string& path, std::string* out, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return out->size() <= max_bytes;
}

}  // namespace

std::string default_batch_dir() {
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/serval/batches";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/share/serval/batches";
  return {};
}

int cmd_serve(int argc, char** argv) {
  const std::string cmd = "serval serve";
  CLI::App app("Serve a model behind an OpenAI-compatible HTTP API", cmd);
  std::vector<std::string> aliases;
  std::string model_path, host = "127.0.0.1", api_key_file, chat_template_file, served_name, kv_memory = "1G",
              swap_memory = "0";
  std::vector<std::string> api_keys;
  int port = 8080, threads = 0, http_threads = 2, max_batch_tokens = 256, max_seqs = 64, block_size = 16;
  int64_t ctx = 0;
  size_t max_body = 8u << 20, max_header = 16u << 10, max_queue_requests = 256;
  int64_t max_queue_tokens = 1 << 20;
  double request_timeout = 0, drain_timeout = 30;
  int read_timeout = 30, max_n = 16;
  bool no_prefix_cache = false, shared_prefix_cache = false;
  std::string otlp_endpoint, log_format = "text", price_table_file, energy_source = "cpu";
  double slo_ttft_ms = 0, slo_itl_ms = 0, slo_availability = 0, watts_per_core = 0, grid_intensity = 0;
  std::vector<std::string> model_args;
  app.add_option("-m,--model", model_args,
                 "GGUF model file; or NAME=FILE, repeatable, for router mode (several models, docs/ROUTER.md)");
  std::string models_dir, models_preset, models_memory = "0";
  size_t models_max = 0;
  double idle_unload = 0, models_load_timeout = 120;
  app.add_option("--models-dir", models_dir, "router mode: serve every *.gguf in this folder (named by file stem)");
  app.add_option("--models-preset", models_preset,
                 "router mode: TOML file of per-model settings ([name] with path, aliases, ctx, kv_memory, "
                 "chat_template, draft, pinned)");
  app.add_option("--models-max", models_max, "router mode: models loaded at once (0: no bound); the least recently "
                 "used idle one is unloaded first")
      ->check(CLI::Range((size_t)0, (size_t)1024));
  app.add_option("--models-memory", models_memory,
                 "router mode: bytes of loaded models (file + KV pool; 0: no bound), e.g. 16G");
  app.add_option("--idle-unload", idle_unload, "router mode: unload a model idle this many seconds (0: never)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--models-load-timeout", models_load_timeout,
                 "router mode: seconds a request waits for its model to load before a 503 with Retry-After")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--host", host, "address to listen on");
  app.add_option("--port", port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", api_keys, "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (repeatable)");
  app.add_option("--api-key-file", api_key_file, "file with one API key per line");
  app.add_option("--chat-template", chat_template_file, "Jinja chat template file (overrides the model's)");
  std::string reasoning_format = "auto";
  std::string tool_call_format = "auto";
  app.add_option("--tool-call-format", tool_call_format,
                 "tool calls: auto (the chat template's own format where the grammar can write it), generic "
                 "({\"name\", \"arguments\"}), or hermes, llama3_json, mistral, firefunction_v2, command_r, "
                 "command_r7b, functionary_v3.1, functionary_v3.2, deepseek_r1");
  app.add_option("--reasoning-format", reasoning_format,
                 "chat: split <think> blocks into reasoning_content: auto (when the template shows the model "
                 "reasons), deepseek (always), none (raw text)")
      ->check(CLI::IsMember({"auto", "deepseek", "none"}));
  size_t responses_store = server::ServerConfig{}.responses_store_entries;
  app.add_option("--responses-store", responses_store,
                 "Responses API: responses kept in memory for previous_response_id (least recently used out; 0: "
                 "none)")
      ->check(CLI::Range((size_t)0, (size_t)1 << 20));
  app.add_option("--served-model-name", served_name, "model id in the API (default: general.name)");
  app.add_option("-a,--alias", aliases,
                 "another model id the API accepts and lists (repeatable); the file's name, with or without .gguf, "
                 "is accepted too");
  app.add_option("-t,--threads", threads, "compute threads (default: physical cores)")->check(CLI::Range(0, 1024));
  app.add_option("--http-threads", http_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  app.add_option("--kv-memory", kv_memory, "KV cache pool: bytes (512M, 2G) or a fraction of free RAM");
  std::vector<std::string> loras;
  app.add_option("--lora", loras,
                 "a LoRA adapter (llama.cpp's GGUF adapter format) served as a model of its own: NAME=FILE[:SCALE] "
                 "(repeatable; requests with \"model\": NAME use it, batched with the base and other adapters)");
  int32_t max_loras = 0;
  app.add_option("--max-loras", max_loras,
                 "LoRA adapters held in memory at once; past it the least recently used idle one is dropped and "
                 "read again on its next request (0: all)")
      ->check(CLI::Range(0, Engine::kMaxLoras));
  bool lora_runtime = false;
  app.add_flag("--lora-runtime", lora_runtime,
               "allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read server files named by the "
               "client: enable only for trusted clients)");
  KvType kv_type = EngineConfig{}.kv_type;
  add_kv_type_option(app, &kv_type);
  app.add_option("--swap-memory", swap_memory, "host swap space for preemption by swapping (0: recompute)");
  std::string tier_ram = "0", tier_dir, tier_disk;
  app.add_option("--kv-cache-ram", tier_ram,
                 "host-RAM tier of the prefix cache: blocks the KV pool evicts are kept here (bytes: 4G; 0: off)");
  app.add_option("--kv-cache-dir", tier_dir,
                 "disk tier of the prefix cache: blocks the RAM tier (or the pool) evicts go here, and survive "
                 "restarts");
  app.add_option("--kv-cache-disk", tier_disk, "disk tier budget (bytes: 20G; default 4G with --kv-cache-dir)");
  size_t max_sessions = server::ServerConfig{}.max_sessions;
  app.add_option("--max-sessions", max_sessions, "saved sessions (/v1/sessions; with --kv-cache-dir), at most")
      ->check(CLI::Range((size_t)1, (size_t)1 << 20));
  app.add_option("-c,--ctx-size,--max-model-len", ctx, "context per sequence (0: the model's, at most 4096)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  // 256: on a CPU a step of 512+ prompt tokens takes seconds, and a burst of
  // prompts then waits for the whole step; at 256 the first tokens come out
  // in turn at no cost in throughput (docs/PERFORMANCE.md, "Serving side by side").
  app.add_option("--max-batch-tokens", max_batch_tokens, "token budget of one engine step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-seqs", max_seqs, "sequences per engine step")->check(CLI::Range(1, 1 << 16));
  app.add_option("--block-size", block_size, "KV block size in tokens")->check(CLI::Range(1, 1024));
  app.add_flag("--no-prefix-caching", no_prefix_cache, "disable prefix caching");
  bool swa_full = false;
  app.add_flag("--swa-full", swa_full,
               "sliding-window layers keep the whole context (default: only their window; swapping is then off)");
  bool engine_control = false;
  app.add_flag("--engine-control", engine_control,
               "enable POST /v1/engine/pause, /resume and /step (API key required when keys are set): hold the "
               "engine between steps for deterministic tests or while an operator inspects a replica");
  std::string metrics_compat;
  app.add_option("--metrics-compat", metrics_compat,
                 "also expose /metrics under another engine's names for routers that read them: vllm (the Gateway "
                 "API Inference Extension's endpoint picker, llm-d)")
      ->check(CLI::IsMember({"vllm"}));
  bool no_webui = false;
  app.add_flag("--no-webui", no_webui, "turn off the browser UI (chat and dashboard) at GET /");
  app.add_flag("--shared-prefix-cache", shared_prefix_cache,
               "one prefix cache for all API keys (default: one per key, so tenants cannot see each other's prompts)");
  app.add_option("--max-body-bytes", max_body, "largest request body (413 past it)")->check(CLI::Range((size_t)1024, (size_t)1 << 30));
  app.add_option("--max-header-bytes", max_header, "largest request headers (431 past it)")->check(CLI::Range((size_t)1024, (size_t)1 << 20));
  app.add_option("--read-timeout", read_timeout, "seconds for a request's headers and body to arrive")->check(CLI::Range(1, 3600));
  app.add_option("--max-queue-requests", max_queue_requests, "requests in flight before 429")->check(CLI::Range((size_t)1, (size_t)1 << 20));
  app.add_option("--max-queue-tokens", max_queue_tokens, "prompt + max_tokens in flight before 429")->check(CLI::Range((int64_t)1, (int64_t)1 << 40));
  app.add_option("--max-n", max_n, "largest n per request")->check(CLI::Range(1, 128));
  std::string pooling;
  app.add_option("--pooling", pooling,
                 "serve /v1/embeddings from a generation model: pool its final hidden states by mean, cls (first "
                 "token) or last (default: the file's pooling_type; encoders always embed)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  int32_t max_embed_inputs = EngineConfig{}.max_embed_inputs;
  app.add_option("--max-embed-inputs", max_embed_inputs, "most inputs (or rerank documents) per embeddings request")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--request-timeout", request_timeout, "per-request deadline in seconds (0: none)")->check(CLI::Range(0.0, 86400.0));
  SpecFlags spec;
  spec.add_to(app);
  TpFlag tp;
  tp.add_to(app);
  app.add_option("--drain-timeout", drain_timeout, "seconds to let in-flight requests finish on SIGTERM")->check(CLI::Range(0.0, 86400.0));
  app.add_option("--otlp-endpoint", otlp_endpoint, "export trace spans as OTLP/HTTP JSON to this URL (http://host:4318)");
  app.add_option("--log-format", log_format, "text, or json: one structured access-log line per request on stderr")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--slo-ttft-p99-ms", slo_ttft_ms, "SLO: 99% of requests get their first token within this (0: off)")
      ->check(CLI::Range(0.0, 3.6e6));
  app.add_option("--slo-itl-p99-ms", slo_itl_ms, "SLO: 99% of inter-token gaps are within this (0: off)")
      ->check(CLI::Range(0.0, 3.6e6));
  app.add_option("--slo-availability", slo_availability, "SLO: percent of generation requests answered without a 5xx (e.g. 99.9; 0: off)")
      ->check(CLI::Range(0.0, 99.9999));
  app.add_option("--price-table", price_table_file, "JSON prices per model: {\"model\": {\"input_per_million\": X, \"output_per_million\": Y}}");
  app.add_option("--watts-per-core", watts_per_core, "energy estimate: watts per busy compute thread (0: off)")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--energy-source", energy_source, "cpu (threads x --watts-per-core) or rapl (measured package power when readable)")
      ->check(CLI::IsMember({"cpu", "rapl"}));
  app.add_option("--grid-intensity", grid_intensity, "carbon intensity of the power, g CO2e per kWh (0: off)")
      ->check(CLI::Range(0.0, 5000.0));
  std::string batch_dir;
  int batch_concurrency = 8;
  bool batch_fsync = false, no_batch = false;
  server::BatchLimits batch_limits;
  app.add_option("--batch-dir", batch_dir,
                 "Files and Batches APIs: where uploads, results and the job database (SQLite) live "
                 "(default: $XDG_DATA_HOME/serval/batches or ~/.local/share/serval/batches)");
  app.add_flag("--no-batch", no_batch, "turn the Files and Batches APIs off");
  app.add_option("--batch-concurrency", batch_concurrency,
                 "batch lines in flight at once (they run behind every interactive request)")
      ->check(CLI::Range(1, 4096));
  int batch_prefill_tokens = 64;
  app.add_option("--batch-prefill-tokens", batch_prefill_tokens,
                 "most prompt tokens of batch lines in one engine step (0: the whole budget), so no step is long "
                 "because of batch work; batch lines also yield every step in which an interactive request prefills")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--batch-fsync", batch_fsync,
               "fsync every committed batch line and file (survives power loss, not only a crash; slower)");
  app.add_option("--batch-max-lines", batch_limits.max_lines, "most lines in one batch input file")
      ->check(CLI::Range((size_t)1, (size_t)10'000'000));
  app.add_option("--batch-max-line-bytes", batch_limits.max_line_bytes, "longest line of a batch input file")
      ->check(CLI::Range((size_t)256, (size_t)64 << 20));
  if (auto rc = parse(app, argc, argv)) return *rc;
  const bool router_mode = !models_dir.empty() || !models_preset.empty() || model_args.size() > 1 ||
                           (model_args.size() == 1 && is_named_model_arg(model_args[0]));
  if (model_args.empty() && !router_mode) return fail(cmd, "give a model: -m FILE (or router mode: -m NAME=FILE, --models-dir DIR)");
  if (!router_mode) {
    model_path = model_args[0];
    if (models_max || models_memory != "0" || idle_unload > 0)
      return fail(cmd, "--models-max, --models-memory and --idle-unload are for router mode (-m NAME=FILE, --models-dir)");
  } else {
    const char* single_only = !loras.empty() ? "--lora" : lora_runtime ? "--lora-runtime" : !served_name.empty() ? "--served-model-name"
                            : !aliases.empty() ? "--alias (use the preset's aliases)" : !tier_dir.empty() ? "--kv-cache-dir"
                            : tp.size > 1 ? "--tp" : !batch_dir.empty() ? "--batch-dir" : nullptr;
    if (single_only)
      return fail(cmd, std::string(single_only) + " is not available in router mode (several models); " +
                           (loras.empty() ? "serve one model for it"
                                          : "give a model's adapters in the preset: lora = [\"NAME=FILE[:SCALE]\"]"));
    no_batch = true;
  }

  if (!api_key_file.empty()) {
    std::string text;
    if (!read_file(api_key_file, &text, 1 << 20)) return fail(cmd, "cannot read --api-key-file '" + api_key_file + "'");
    std::stringstream ss(text);
    std::string line;
    while (std::getline(ss, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) api_keys.push_back(line);
    }
    if (api_keys.empty()) return fail(cmd, "--api-key-file '" + api_key_file + "' holds no key");
  }
  server::ServerConfig scfg;
  scfg.api_keys = api_keys;
  scfg.reasoning_format = reasoning_format;
  scfg.tool_call_format = tool_call_format;
  scfg.responses_store_entries = responses_store;
  scfg.max_sessions = max_sessions;
  scfg.shared_prefix_cache = shared_prefix_cache;
  scfg.engine_control = engine_control;
  scfg.webui = !no_webui;
  scfg.metrics_vllm_names = metrics_compat == "vllm";
  scfg.lora_runtime = lora_runtime;
  scfg.model_name = served_name;
  for (const std::string& a : aliases)
    if (a.empty() || a.size() > 256 || std::any_of(a.begin(), a.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
      return fail(cmd, "--alias: a model id is 1 to 256 characters without control characters");
  scfg.model_aliases = aliases;
  scfg.listed_aliases = aliases.size();
  for (std::string& id : model_file_ids(model_path)) scfg.model_aliases.push_back(std::move(id));
  if (!chat_template_file.empty()) {
    std::string t;
    if (!read_file(chat_template_file, &t, 256 * 1024))
      return fail(cmd, "cannot read --chat-template '" + chat_template_file + "' (or larger than 256 KiB)");
    scfg.chat_template = t;
  }
  scfg.max_inflight_requests = max_queue_requests;
  scfg.max_inflight_tokens = max_queue_tokens;
  scfg.request_timeout_s = request_timeout;
  scfg.limits.max_n = max_n;
  server::ObservabilityConfig& oc = scfg.observability;
  oc.otlp_endpoint = otlp_endpoint;
  oc.log_json = log_format == "json";
  oc.slo_ttft_s = slo_ttft_ms / 1000.0;
  oc.slo_itl_s = slo_itl_ms / 1000.0;
  oc.slo_availability = std::round(slo_availability * 1e6) / 1e8;  // percent -> ratio, no 0.999000...1
  if (!price_table_file.empty()) {
    std::string text;
    if (!read_file(price_table_file, &text, 1 << 20))
      return fail(cmd, "cannot read --price-table '" + price_table_file + "' (or larger than 1 MiB)");
    auto t = server::PriceTable::parse(text);
    if (!t.ok()) return fail(cmd, "--price-table '" + price_table_file + "': " + t.status().message());
    oc.prices = std::move(t.value());
  }
  oc.energy.watts_per_core = watts_per_core;
  oc.energy.n_threads = threads > 0 ? threads : ThreadPool::default_threads();
  oc.energy.grid_g_per_kwh = grid_intensity;
  oc.energy.use_rapl = energy_source == "rapl";
  if (oc.energy.use_rapl && !server::EnergyModel(oc.energy).rapl())
    std::fprintf(stderr, "serval serve: --energy-source rapl: %s is not readable; %s\n", oc.energy.rapl_path.c_str(),
                 watts_per_core > 0 ? "estimating from --watts-per-core" : "no energy figures (set --watts-per-core)");

  auto kvb = parse_kv_memory(kv_memory);
  if (!kvb.ok()) return fail(cmd, kvb.status().message());
  size_t swap_bytes = 0;
  if (swap_memory != "0") {
    auto sb = parse_kv_memory(swap_memory);
    if (!sb.ok()) return fail(cmd, "--swap-memory: " + sb.status().message());
    swap_bytes = *sb;
  }

  size_t tier_ram_bytes = 0, tier_disk_bytes = 0;
  if (tier_ram != "0") {
    auto b = parse_kv_memory(tier_ram);
    if (!b.ok()) return fail(cmd, "--kv-cache-ram: " + b.status().message());
    tier_ram_bytes = *b;
  }
  if (!tier_disk.empty() && tier_dir.empty()) return fail(cmd, "--kv-cache-disk needs --kv-cache-dir");
  if (!tier_dir.empty()) {
    const std::string t = tier_disk.empty() ? "4G" : tier_disk;
    if (t.find_first_not_of("0123456789.") == std::string::npos && t.find('.') != std::string::npos)
      return fail(cmd, "--kv-cache-disk: expected bytes (e.g. 20G), got '" + t + "'");
    auto b = parse_kv_memory(t);
    if (!b.ok()) return fail(cmd, "--kv-cache-disk: " + b.status().message());
    tier_disk_bytes = *b;
  }

  // The engine settings every model shares (single and router mode).
  auto base_engine_config = [&] {
    EngineConfig ec;
    ec.n_threads = threads;
    ec.kv_memory_bytes = *kvb;
    ec.swap_memory_bytes = swap_bytes;
    ec.kv_cache_ram_bytes = tier_ram_bytes;
    ec.block_size = block_size;
    ec.kv_type = kv_type;
    ec.max_batch_tokens = max_batch_tokens;
    ec.max_seqs = max_seqs;
    ec.max_model_len = ctx;
    ec.enable_prefix_caching = !no_prefix_cache;
    ec.swa_full = swa_full;
    ec.max_n = max_n;
    ec.pooling = pooling == "mean" ? Pooling::mean : pooling == "cls" ? Pooling::cls
               : pooling == "last" ? Pooling::last : Pooling::none;
    ec.max_embed_inputs = max_embed_inputs;
    return ec;
  };
  if (router_mode) {
    RouterServeArgs ra;
    ra.named = model_args;
    ra.dir = models_dir;
    ra.preset = models_preset;
    ra.models_max = models_max;
    ra.idle_unload_s = idle_unload;
    ra.load_timeout_s = models_load_timeout;
    if (models_memory != "0") {
      auto b = parse_kv_memory(models_memory);
      if (!b.ok()) return fail(cmd, "--models-memory: " + b.status().message());
      ra.models_memory = *b;
    }
    ra.threads = threads;
    ra.scfg = scfg;
    ra.ec = base_engine_config();
    EngineConfig& ec = ra.ec;
    if (auto rc = spec.resolve(cmd, &ec.spec)) return *rc;
    ec.max_loras = max_loras;  // per model, for the preset's adapters
    ra.http.host = host;
    ra.http.port = (uint16_t)port;
    ra.http.n_threads = http_threads;
    ra.http.max_body_bytes = max_body;
    ra.http.max_header_bytes = max_header;
    ra.http.read_timeout_s = read_timeout;
    ra.drain_timeout_s = drain_timeout;
    ra.webui = !no_webui;
    return serve_router(cmd, std::move(ra));
  }

  // Signals go to a dedicated thread (blocked here, before any thread starts).
  sigset_t sigs = block_stop_signals();

  // MPI starts threads of its own: after the mask, so signals reach only the signal thread.
  if (auto rc = tp.join(cmd)) return *rc;
  auto loaded = load_model(cmd, model_path, /*generation=*/false, tp.shard());
  if (!loaded) return 2;
  const std::shared_ptr<const Model>& m = loaded->model;
  const Tokenizer* tok = loaded->tok.get();
  if (tp.worker()) return tp.run_worker(cmd, *loaded->model, threads);
  EngineConfig ec = base_engine_config();
  ec.tp = tp.engine_link();
  ec.kv_cache_dir = tier_dir;
  ec.kv_cache_disk_bytes = tier_disk_bytes;
  if (auto rc = spec.resolve(cmd, &ec.spec)) return *rc;
  if (!no_batch) {  // batch lines are background work (docs/BATCH.md)
    ec.background_priority = server::OpenAiServer::kBatchPriority;
    ec.background_prefill_tokens = batch_prefill_tokens;
  }
  ec.max_loras = max_loras;
  auto engine = Engine::create(m, *tok, ec);
  if (!engine.ok()) return fail(cmd, engine.status().message());
  auto api = server::OpenAiServer::create(**engine, scfg);
  if (!api.ok()) return fail(cmd, api.status().message());
  server::OpenAiServer* api_raw = api->get();
  for (const std::string& spec_text : loras) {
    auto ad = parse_lora_arg(spec_text);
    if (!ad.ok()) return fail(cmd, "--lora " + ad.status().message());
    const std::string& name = ad->name;
    const std::string& file = ad->path;
    const float scale = ad->scale;
    if (Status st = api_raw->check_adapter_name(name); !st.ok()) return fail(cmd, "--lora " + name + ": " + st.message());
    if (Status st = (*engine)->load_lora(name, file, scale); !st.ok())
      return fail(cmd, "--lora " + name + ": " + st.message());
  }

  // Files and Batches APIs: a store (SQLite + files), a runner thread that
  // sends lines through the API at the lowest priority, and the routes.
  std::unique_ptr<server::BatchStore> batch_store;
  std::unique_ptr<server::BatchRunner> batch_runner;
  std::unique_ptr<server::BatchApi> batch_api;
  if (!no_batch) {
    const bool explicit_dir = !batch_dir.empty();
    if (!explicit_dir) batch_dir = default_batch_dir();
    batch_limits.max_file_bytes = std::min(batch_limits.max_file_bytes, max_body);
    auto store = batch_dir.empty() ? Expected<std::unique_ptr<server::BatchStore>>(io_error("no HOME for a default folder"))
                                   : server::BatchStore::open({batch_dir, "", batch_fsync});
    if (!store.ok()) {
      if (explicit_dir) return fail(cmd, "--batch-dir: " + store.status().message());
      std::fprintf(stderr, "serval serve: warning: Files and Batches APIs off: %s (set --batch-dir)\n",
                   store.status().message().c_str());
    } else {
      batch_store = std::move(store.value());
      server::BatchRunnerConfig rc;
      rc.concurrency = batch_concurrency;
      rc.limits = batch_limits;
      batch_runner = std::make_unique<server::BatchRunner>(
          *batch_store,
          [api_raw](const server::LineCall& c, std::function<void(server::LineReply)> done) {
            return api_raw->execute_line(c, std::move(done));
          },
          rc);
      batch_api = std::make_unique<server::BatchApi>(*batch_store, *batch_runner, batch_limits);
      api_raw->set_batch_api(batch_api.get());
      batch_runner->start();
      std::fprintf(stderr, "serval serve: batches in %s (%d lines in flight at most)\n", batch_dir.c_str(),
                   batch_concurrency);
    }
  }

  http::HttpServerConfig hcfg;
  hcfg.host = host;
  hcfg.port = (uint16_t)port;
  hcfg.n_threads = http_threads;
  hcfg.max_body_bytes = max_body;
  hcfg.max_header_bytes = max_header;
  hcfg.read_timeout_s = read_timeout;
  auto http_server = http::HttpServer::create(
      hcfg, [api_raw](http::HttpRequest r, std::shared_ptr<http::ResponseChannel> ch) { api_raw->handle(std::move(r), std::move(ch)); },
      &server::http_layer_error_body);
  if (!http_server.ok()) return fail(cmd, http_server.status().message(), 1);
  http::HttpServer* hs = http_server->get();

  // Batch lines in flight are cancelled, not waited for: uncommitted, they run again after a restart.
  server::BatchRunner* const batches = batch_runner.get();
  SignalDrain signal_drain = drain_on_signal(
      sigs, cmd, drain_timeout,
      {[api_raw] { return api_raw->in_flight(); },
       [api_raw, batches] {
         api_raw->begin_drain();
         if (batches) batches->stop();
       },
       {}, [hs] { hs->stop(); }});
  const EngineInfo info = (*engine)->info();
  if (info.generates) log_kv_cache(cmd, **engine);
  if (info.pooling != Pooling::none)
    std::fprintf(stderr, "serval serve: %s %s (pooling %s, %lld %s)%s\n",
                 info.pooling == Pooling::rank ? "/v1/rerank" : "/v1/embeddings",
                 info.generates ? "on as well" : info.pooling == Pooling::rank ? "only: a reranker" : "only: an embedding model",
                 pooling_name(info.pooling), (long long)info.embedding_dim,
                 info.pooling == Pooling::rank ? "score per document" : "dimensions",
                 info.generates ? "" : "; generation routes answer 400");
  std::fprintf(stderr, "serval serve: listening on http://%s:%u  model '%s' (%s, context %lld, %d compute threads)\n",
               host.c_str(), (unsigned)hs->port(), api_raw->model_name().c_str(), info.architecture.c_str(),
               (long long)info.max_model_len, threads > 0 ? threads : ThreadPool::default_threads());
  if (!no_webui && server::webui_built())
    std::fprintf(stderr, "serval serve: web UI (chat, dashboard) at http://%s:%u/\n", host.c_str(), (unsigned)hs->port());
  std::fflush(stderr);
  hs->run();
  // Batch lines still running are cancelled, not committed: they run again on restart.
  if (batch_runner) batch_runner->stop();
  const size_t left = api_raw->in_flight();
  signal_drain.finish();
  http_server->reset();
  api->reset();
  engine->reset();
  return stopped_status(cmd, left);
}

}  // namespace serval::cli
