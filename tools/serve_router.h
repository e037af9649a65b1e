// serval serve in router mode (several models; docs/ROUTER.md): the settings
// cmd_serve parsed, and the server it runs.
#pragma once

#include <string>
#include <vector>

#include "serval/engine.h"
#include "server/http_server.h"
#include "server/openai_server.h"

namespace serval::cli {

struct RouterServeArgs {
  std::vector<std::string> named;  // -m NAME=FILE
  std::string dir, preset;         // --models-dir, --models-preset
  size_t models_max = 0, models_memory = 0;
  double idle_unload_s = 0, load_timeout_s = 120, drain_timeout_s = 30;
  int threads = 0;
  bool webui = true;
  EngineConfig ec;             // every model's engine (the preset's ctx, kv_memory, draft override)
  server::ServerConfig scfg;   // every model's server (name, aliases, chat template per model)
  http::HttpServerConfig http;
};

int serve_router(const std::string& cmd, RouterServeArgs args);

}  // namespace serval::cli
