#include "server/api_translation.h"

namespace serval::server {

using json = nlohmann::ordered_json;

namespace {
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
}  // namespace

std::string sse_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

void TranslatingChannel::send(int status, std::string content_type, std::string body, http::Headers extra) {
  inner_->send(status, std::move(content_type), t_->translate_body(status, body), std::move(extra));
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
    out += t_->translate_chunk(chunk);
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
