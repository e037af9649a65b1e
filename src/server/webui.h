// Serves the embedded browser UI (chat and operations dashboard; web/) at
// GET / and /assets/*: gzip when the client takes it, a strict
// Content-Security-Policy (nothing from other origins, no inline script), and
// year-long caching of content-hashed files. The page needs no API key to
// load; every API call it makes carries the key the user enters.
#pragma once

#include <string_view>

#include "server/http_server.h"

namespace serval::server {

// Whether this binary holds the UI (built with Node.js/npm and SERVAL_WEBUI=ON).
bool webui_built();

// The paths the UI answers: "/", "/index.html" and "/assets/...".
bool is_webui_path(std::string_view path);

// The Content-Security-Policy sent with the page.
extern const char* const kWebUiCsp;

// Answers req (a webui path). enabled=false (--no-webui), a binary without
// the UI, or an unknown asset: 404 with an OpenAI-style error body; a method
// other than GET: 405.
void serve_webui(const http::HttpRequest& req, http::ResponseChannel& ch, bool enabled);

}  // namespace serval::server
