// HTTP request parsing and validation: raw bytes from a socket go through the
// server's parser (same limits and error mapping as on a connection), then
// requests to the generation routes through the JSON decoder. A refusal must
// be one of the statuses the server sends; every request that follows on the
// same bytes (pipelining) is parsed too.
#include <cstdint>
#include <string_view>

#include "request_check.h"
#include "server/http_server.h"

using namespace serval;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::HttpServerConfig cfg;
  cfg.max_header_bytes = 4096;
  cfg.max_body_bytes = 64 * 1024;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (int i = 0; i < 8 && !rest.empty(); ++i) {
    auto p = http::parse_http_request(rest, cfg);
    if (!p.request) {
      fuzz::require(p.status == 400 || p.status == 408 || p.status == 413 || p.status == 431,
                    "refusal status " + std::to_string(p.status));
      fuzz::require(!p.message.empty(), "a refusal has a message");
      return 0;
    }
    fuzz::require(p.consumed > 0 && p.consumed <= rest.size(), "consumed within the input");
    fuzz::require(p.request->body.size() <= cfg.max_body_bytes, "body within the limit");
    const auto& r = *p.request;
    if (r.method == "POST" && (r.path == "/v1/completions" || r.path == "/v1/chat/completions"))
      fuzz::parse_and_check(r.body, r.path == "/v1/chat/completions");
    rest.remove_prefix(p.consumed);
  }
  return 0;
}
