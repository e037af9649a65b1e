#include "server/api_translation.h"

#include <algorithm>
#include <random>

namespace serval::server {

using json = nlohmann::ordered_json;

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_hex_id(const std::string& prefix, int hex_digits) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)rng(), (unsigned long long)rng());
  return prefix + std::string(buf, (size_t)std::clamp(hex_digits, 8, 32));
}

std::string sse_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + json_text(data) + "\n\n";
}

// The translators read serval's own chat output; should one still throw on
// something unexpected, the client gets a server error, never a crash.
void TranslatingChannel::send(int status, std::string content_type, std::string body, http::Headers extra) {
  std::string out;
  try {
    out = t_->translate_body(status, body);
  } catch (const std::exception& e) {
    status = 500;
    out = t_->translate_body(500, ApiError{500, std::string("response translation failed: ") + e.what(),
                                           "server_error", "", ""}.body());
  }
  inner_->send(status, std::move(content_type), std::move(out), std::move(extra));
}

void TranslatingChannel::write(std::string data) {
  // Each write is one or more whole `data: ...\n\n` events.
  std::string out;
  size_t at = 0;
  while (at < data.size()) {
    size_t end = data.find("\n\n", at);
    if (end == std::string::npos) end = data.size();
    std::string_view ev(data.data() + at, end - at);
    at = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    ev.remove_prefix(6);
    if (ev == "[DONE]") {
      out += t_->translate_done();
      continue;
    }
    json chunk = json::parse(ev, nullptr, false);
    if (chunk.is_discarded()) continue;
    try {
      out += t_->translate_chunk(chunk);
    } catch (const std::exception& e) {
      out += t_->translate_chunk(json::parse(
          ApiError{500, std::string("stream translation failed: ") + e.what(), "server_error", "", ""}.body()));
    }
  }
  if (!out.empty()) inner_->write(std::move(out));
}

ApiError parse_openai_error(int status, const std::string& body) {
  ApiError e{status, "internal error", "server_error", "", ""};
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("error") || !j["error"].is_object()) {
    if (!body.empty() && body.size() < 4096) e.message = body;
    return e;
  }
  const json& x = j["error"];
  auto str = [&](const char* k) { return x.contains(k) && x[k].is_string() ? x[k].get<std::string>() : std::string(); };
  e.message = str("message");
  e.type = str("type");
  e.param = str("param");
  e.code = str("code");
  return e;
}

}  // namespace serval::server
