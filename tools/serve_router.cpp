#include "serve_router.h"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "load_model.h"
#include "model_catalog.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "server/api_error.h"
#include "server/model_router.h"
#include "server/webui.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {
namespace {

// What keeps a model's server alive: destroyed after the server, the engine
// before the model and tokenizer it reads.
struct ModelParts {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Engine> engine;
};

uint64_t file_size_or_0(const std::string& p) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(p, ec);
  return ec ? 0 : (uint64_t)n;
}

Expected<std::unique_ptr<server::ServedModel>> make_model(const RouterServeArgs& a,
                                                          const std::shared_ptr<ThreadPool>& pool,
                                                          const server::RouterModelSpec& s) {
  auto parts = std::make_shared<ModelParts>();
  auto model = Model::load(s.path);
  if (!model.ok()) return model.status();
  parts->model = std::shared_ptr<const Model>(std::move(model.value()));
  auto tok = Tokenizer::from_gguf(parts->model->file());
  if (!tok.ok()) return tok.status();
  parts->tok = std::make_shared<const Tokenizer>(std::move(tok.value()));
  EngineConfig ec = a.ec;
  ec.pool = pool;
  if (s.ctx > 0) ec.max_model_len = s.ctx;
  if (s.kv_memory > 0) ec.kv_memory_bytes = s.kv_memory;
  uint64_t bytes = file_size_or_0(s.path) + ec.kv_memory_bytes + ec.swap_memory_bytes + ec.kv_cache_ram_bytes;
  if (!s.draft_model.empty()) {
    auto d = Model::load(s.draft_model);
    if (!d.ok()) return Status(d.status()).with_context("draft model");
    ec.spec.mode = SpecConfig::Mode::draft_model;
    ec.spec.draft_model = std::shared_ptr<const Model>(std::move(d.value()));
    bytes += file_size_or_0(s.draft_model);
  }
  auto engine = Engine::create(parts->model, *parts->tok, ec);
  if (!engine.ok()) return engine.status();
  parts->engine = std::move(engine.value());
  server::ServerConfig sc = a.scfg;
  sc.model_name = s.name;
  sc.model_aliases = s.aliases;
  sc.listed_aliases = s.aliases.size();
  for (std::string& id : model_file_ids(s.path)) sc.model_aliases.push_back(std::move(id));
  if (!s.chat_template_file.empty()) {
    std::ifstream in(s.chat_template_file, std::ios::binary);
    std::stringstream ss;
    if (in) ss << in.rdbuf();
    if (!in || ss.str().size() > 256 * 1024)
      return invalid_argument("chat_template: cannot read '" + s.chat_template_file + "' (or larger than 256 KiB)");
    sc.chat_template = ss.str();
  }
  auto api = server::OpenAiServer::create(*parts->engine, sc);
  if (!api.ok()) return api.status();
  for (const server::RouterModelSpec::Adapter& ad : s.loras) {
    if (Status st = (*api)->check_adapter_name(ad.name); !st.ok()) return Status(st).with_context("lora " + ad.name);
    if (Status st = parts->engine->load_lora(ad.name, ad.path, ad.scale); !st.ok())
      return Status(st).with_context("lora " + ad.name);
    bytes += file_size_or_0(ad.path);
  }
  auto served = std::make_unique<server::ServedModel>();
  served->max_model_len = parts->engine->info().max_model_len;
  served->api = std::move(api.value());
  served->bytes = (size_t)bytes;
  served->owner = std::move(parts);
  return served;
}

}  // namespace

int serve_router(const std::string& cmd, RouterServeArgs a) {
  auto specs = build_model_catalog(a.named, a.dir, a.preset);
  if (!specs.ok()) return fail(cmd, specs.status().message());
  server::RouterConfig rc;
  rc.api_keys = a.scfg.api_keys;
  rc.models_max = a.models_max;
  rc.models_memory = a.models_memory;
  rc.idle_unload_s = a.idle_unload_s;
  rc.load_wait_s = a.load_timeout_s;
  rc.kv_bytes_default = a.ec.kv_memory_bytes;
  rc.engine_extra_bytes = a.ec.swap_memory_bytes + a.ec.kv_cache_ram_bytes;
  rc.max_waiting = a.scfg.max_inflight_requests;
  rc.max_json_depth = a.scfg.limits.max_json_depth;
  rc.webui = a.webui;
  const size_t n_models = specs->size();
  std::vector<std::string> pinned;
  for (const auto& s : *specs)
    if (s.pinned) pinned.push_back(s.name);

  sigset_t sigs = block_stop_signals();
  // One compute pool for every model's engine: models never oversubscribe the cores.
  auto pool = std::make_shared<ThreadPool>(a.threads > 0 ? a.threads : ThreadPool::default_threads());
  const RouterServeArgs* args = &a;
  auto router = server::ModelRouter::create(
      std::move(specs.value()),
      [args, pool](const server::RouterModelSpec& s) { return make_model(*args, pool, s); }, rc);
  if (!router.ok()) return fail(cmd, router.status().message());
  server::ModelRouter* r = router->get();
  for (const std::string& name : pinned)
    if (Status st = r->load_now(name); !st.ok()) return fail(cmd, "pinned model '" + name + "': " + st.message());
  if (a.models_memory > 0 && !pinned.empty()) {
    size_t pinned_bytes = 0;
    for (const auto& st : r->status())
      if (std::find(pinned.begin(), pinned.end(), st.name) != pinned.end()) pinned_bytes += st.bytes;
    if (pinned_bytes > a.models_memory)
      return fail(cmd, "the pinned models hold " + std::to_string(pinned_bytes) + " bytes, more than --models-memory " +
                           std::to_string(a.models_memory));
  }

  auto http_server = http::HttpServer::create(
      a.http, [r](http::HttpRequest q, std::shared_ptr<http::ResponseChannel> ch) { r->handle(std::move(q), std::move(ch)); },
      &server::http_layer_error_body);
  if (!http_server.ok()) return fail(cmd, http_server.status().message(), 1);
  http::HttpServer* hs = http_server->get();
  SignalDrain signal_drain = drain_on_signal(sigs, cmd, a.drain_timeout_s,
                                             {[r] { return r->in_flight(); }, [r] { r->begin_drain(); }, {},
                                              [hs] { hs->stop(); }});
  std::string names;
  for (const auto& st : r->status()) names += (names.empty() ? "" : ", ") + st.name + " (" + server::ModelRouter::state_name(st.state) + ")";
  std::fprintf(stderr, "serval serve: router mode: %zu models: %s\n", n_models, names.c_str());
  std::fprintf(stderr, "serval serve: listening on http://%s:%u  (models load on their first request; %s%s)\n",
               a.http.host.c_str(), (unsigned)hs->port(),
               a.models_max ? ("at most " + std::to_string(a.models_max) + " loaded").c_str() : "no bound on loaded models",
               a.idle_unload_s > 0 ? (", idle ones unloaded after " + std::to_string((int)a.idle_unload_s) + " s").c_str() : "");
  if (a.webui && server::webui_built())
    std::fprintf(stderr, "serval serve: web UI (chat, dashboard) at http://%s:%u/\n", a.http.host.c_str(), (unsigned)hs->port());
  std::fflush(stderr);
  hs->run();
  const size_t left = r->in_flight();
  signal_drain.finish();
  http_server->reset();
  router->reset();
  return stopped_status(cmd, left);
}

}  // namespace serval::cli
