#include "server/webui.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "server/api_error.h"
#include "server/webui_assets.h"

namespace serval::server {

const char* const kWebUiCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

bool webui_built() { return webui::kAssetCount > 0; }

bool is_webui_path(std::string_view path) {
  return path == "/" || path == "/index.html" || path.rfind("/assets/", 0) == 0;
}

namespace {

const webui::Asset* find_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (size_t i = 0; i < webui::kAssetCount; ++i)
    if (path == webui::kAssets[i].path) return &webui::kAssets[i];
  return nullptr;
}

// Whether an Accept-Encoding value admits gzip (a "gzip;q=0" refuses it).
bool accepts_gzip(const std::string& accept) {
  size_t pos = 0;
  while (pos < accept.size()) {
    size_t end = accept.find(',', pos);
    if (end == std::string::npos) end = accept.size();
    std::string item = accept.substr(pos, end - pos);
    pos = end + 1;
    const size_t a = item.find_first_not_of(" \t");
    if (a == std::string::npos) continue;
    item = item.substr(a);
    const size_t semi = item.find(';');
    std::string coding = item.substr(0, semi);
    while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) coding.pop_back();
    for (char& c : coding) c = (char)std::tolower((unsigned char)c);
    if (coding != "gzip" && coding != "*") continue;
    if (semi != std::string::npos) {
      const size_t q = item.find("q=", semi);
      if (q != std::string::npos && std::strtod(item.c_str() + q + 2, nullptr) <= 0.0) return false;
    }
    return true;
  }
  return false;
}

void not_found(http::ResponseChannel& ch, const std::string& message) {
  const ApiError e{404, message, "invalid_request_error", "", "not_found"};
  ch.send(e.status, "application/json", e.body());
}

}  // namespace

void serve_webui(const http::HttpRequest& req, http::ResponseChannel& ch, bool enabled) {
  if (req.method != "GET") {
    return ch.send(405, "application/json", method_not_allowed_error("GET").body(), {{"Allow", "GET"}});
  }
  if (!enabled) return not_found(ch, "the web UI is off on this server (--no-webui); the API is under /v1");
  if (!webui_built())
    return not_found(ch, "this serval was built without the web UI (Node.js/npm were not found at build time, "
                         "or SERVAL_WEBUI=OFF); the API is under /v1");
  const webui::Asset* a = find_asset(req.path);
  if (!a) return not_found(ch, "no such file in the web UI: " + req.path);
  http::Headers h = {
      {"Cache-Control", a->immutable ? "public, max-age=31536000, immutable" : "no-cache"},
      {"X-Content-Type-Options", "nosniff"},
      {"Vary", "Accept-Encoding"},
  };
  if (std::string_view(a->content_type).rfind("text/html", 0) == 0) {
    h.push_back({"Content-Security-Policy", kWebUiCsp});
    h.push_back({"X-Frame-Options", "DENY"});
    h.push_back({"Referrer-Policy", "no-referrer"});
  }
  const bool gz = accepts_gzip(req.header("accept-encoding"));
  if (gz) h.push_back({"Content-Encoding", "gzip"});
  std::string body = gz ? std::string(reinterpret_cast<const char*>(a->gz), a->gz_size)
                        : std::string(reinterpret_cast<const char*>(a->data), a->size);
  ch.send(200, a->content_type, std::move(body), std::move(h));
}

}  // namespace serval::server
