#include "server/batch_api.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/multipart.h"
#include "server/openai_request.h"

namespace serval::server {

using json = nlohmann::ordered_json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(const std::shared_ptr<http::ResponseChannel>& ch, const ApiError& e, http::Headers extra = {}) {
  ch->send(e.status, "application/json", e.body(), std::move(extra));
}
void send_json(const std::shared_ptr<http::ResponseChannel>& ch, const json& j) {
  ch->send(200, "application/json", dump(j));
}
ApiError not_found_error(const std::string& what, const std::string& id, const std::string& param = {}) {
  return ApiError{404, "no " + what + " '" + id.substr(0, 128) + "'", "invalid_request_error", param, "not_found"};
}
void method_not_allowed(const std::shared_ptr<http::ResponseChannel>& ch, const char* allow) {
  send_error(ch, method_not_allowed_error(allow), {{"Allow", allow}});
}

json file_json(const FileRecord& f) {
  return json{{"id", f.id},          {"object", "file"},     {"bytes", f.bytes},        {"created_at", f.created_at},
              {"expires_at", nullptr}, {"filename", f.filename}, {"purpose", f.purpose}, {"status", "processed"},
              {"status_details", nullptr}};
}

// Query parameters (no percent-decoding beyond what ids and numbers need).
std::string query_param(const std::string& query, const std::string& key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    const std::string item = query.substr(pos, amp - pos);
    const size_t eq = item.find('=');
    if (item.substr(0, eq) == key) return eq == std::string::npos ? std::string() : item.substr(eq + 1);
    pos = amp + 1;
  }
  return {};
}

// limit / after of a list request; the error to send otherwise.
std::optional<ApiError> page_of(const std::string& query, ListPage* page) {
  const std::string limit = query_param(query, "limit");
  if (!limit.empty()) {
    char* end = nullptr;
    const long v = std::strtol(limit.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > 10000) return bad_request("limit: expected an integer in [1, 10000]", "limit");
    page->limit = (size_t)v;
  }
  page->after = query_param(query, "after").substr(0, 128);
  return std::nullopt;
}

bool valid_filename(const std::string& s) {
  if (s.empty() || s.size() > 255) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}

// "24h" style windows, 1 to 168 hours; seconds, or -1.
int64_t window_seconds(const std::string& w) {
  if (w.size() < 2 || w.size() > 4 || w.back() != 'h') return -1;
  int64_t h = 0;
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    if (w[i] < '0' || w[i] > '9') return -1;
    h = h * 10 + (w[i] - '0');
  }
  return h >= 1 && h <= 168 ? h * 3600 : -1;
}

}  // namespace

bool BatchApi::routes(const std::string& path) {
  auto under = [&](const char* p) {
    const std::string s(p);
    return path == s || path.rfind(s + "/", 0) == 0;
  };
  return under("/v1/files") || under("/v1/batches");
}

void BatchApi::handle(const http::HttpRequest& req, const std::string& owner,
                      const std::shared_ptr<http::ResponseChannel>& ch) {
  const std::string& path = req.path;
  const std::string& m = req.method;
  if (path == "/v1/files") {
    if (m == "POST") return upload(req, owner, ch);
    if (m != "GET") return method_not_allowed(ch, "GET, POST");
    ListPage page;
    page.limit = 100;
    if (auto e = page_of(req.query, &page)) return send_error(ch, *e);
    const std::string order = query_param(req.query, "order");
    if (!order.empty() && order != "asc" && order != "desc")
      return send_error(ch, bad_request("order: expected asc or desc", "order"));
    bool more = false;
    json data = json::array();
    for (const FileRecord& f : store_.list_files(owner, query_param(req.query, "purpose").substr(0, 64), page,
                                                 order == "asc", &more))
      data.push_back(file_json(f));
    json out = {{"object", "list"}, {"data", data}, {"has_more", more}};
    out["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
    out["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
    return send_json(ch, out);
  }
  if (path.rfind("/v1/files/", 0) == 0) {
    std::string id = path.substr(10);
    const bool content = id.size() > 8 && id.ends_with("/content");
    if (content) id.resize(id.size() - 8);
    if (id.empty() || id.find('/') != std::string::npos)
      return send_error(ch, ApiError{404, "no route for " + m + " " + path, "invalid_request_error", "", "not_found"});
    std::optional<FileRecord> f = store_.file(owner, id);
    if (content) {
      if (m != "GET") return method_not_allowed(ch, "GET");
      if (!f) return send_error(ch, not_found_error("file", id));
      std::ifstream in(f->path, std::ios::binary);
      if (!in) return send_error(ch, ApiError{500, "the file's bytes are missing", "server_error", "", "file_missing"});
      std::stringstream ss;
      ss << in.rdbuf();
      return ch->send(200, "application/octet-stream", ss.str());
    }
    if (m == "GET") {
      if (!f) return send_error(ch, not_found_error("file", id));
      return send_json(ch, file_json(*f));
    }
    if (m == "DELETE") {
      if (!f) return send_error(ch, not_found_error("file", id));
      const std::vector<std::string> users = store_.batches_using(id);
      if (!users.empty())
        return send_error(ch, ApiError{409, "the file is the input of batch " + users.front() + ", which has not ended",
                                       "invalid_request_error", "", "file_in_use"});
      Status st = store_.delete_file(owner, id);
      if (!st.ok()) return send_error(ch, not_found_error("file", id));
      return send_json(ch, json{{"id", id}, {"object", "file"}, {"deleted", true}});
    }
    return method_not_allowed(ch, "GET, DELETE");
  }
  if (path == "/v1/batches") {
    if (m == "POST") return create_batch(req, owner, ch);
    if (m != "GET") return method_not_allowed(ch, "GET, POST");
    ListPage page;
    if (auto e = page_of(req.query, &page)) return send_error(ch, *e);
    page.limit = std::min<size_t>(page.limit, 100);
    bool more = false;
    json data = json::array();
    for (const BatchRecord& b : store_.list_batches(owner, page, &more)) data.push_back(json::parse(runner_.batch_json(b)));
    json out = {{"object", "list"}, {"data", data}, {"has_more", more}};
    out["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
    out["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
    return send_json(ch, out);
  }
  // /v1/batches/{id} and /v1/batches/{id}/cancel
  std::string id = path.substr(12);
  const bool cancel = id.size() > 7 && id.ends_with("/cancel");
  if (cancel) id.resize(id.size() - 7);
  if (id.empty() || id.find('/') != std::string::npos)
    return send_error(ch, ApiError{404, "no route for " + m + " " + path, "invalid_request_error", "", "not_found"});
  if (!cancel) {
    if (m != "GET") return method_not_allowed(ch, "GET");
    std::optional<BatchRecord> b = store_.batch(owner, id);
    if (!b) return send_error(ch, not_found_error("batch", id));
    return ch->send(200, "application/json", runner_.batch_json(*b));
  }
  if (m != "POST") return method_not_allowed(ch, "POST");
  std::optional<BatchRecord> b = store_.batch(owner, id);
  if (!b) return send_error(ch, not_found_error("batch", id));
  for (const char* from : {"validating", "in_progress"}) {
    auto moved = store_.transition(id, from, "cancelling", unix_seconds());
    if (moved.ok() && *moved) break;
  }
  b = store_.batch(owner, id);
  if (b->status != "cancelling" && b->status != "cancelled")
    return send_error(ch, ApiError{409, "the batch is " + b->status + " and cannot be cancelled", "invalid_request_error",
                                   "", "batch_not_cancellable"});
  runner_.wake();
  ch->send(200, "application/json", runner_.batch_json(*b));
}

void BatchApi::upload(const http::HttpRequest& req, const std::string& owner,
                      const std::shared_ptr<http::ResponseChannel>& ch) {
  const std::string boundary = multipart_boundary(req.header("content-type"));
  if (boundary.empty())
    return send_error(ch, bad_request("expected a multipart/form-data body with a boundary (fields: file, purpose)"));
  auto parts = parse_multipart(req.body, boundary);
  if (!parts.ok()) return send_error(ch, bad_request(parts.status().message()));
  const MultipartPart* file = nullptr;
  std::string purpose;
  bool has_purpose = false;
  for (const MultipartPart& p : *parts) {
    if (p.name == "file") file = &p;
    if (p.name == "purpose") {
      purpose = std::string(p.data.substr(0, 64));
      has_purpose = true;
    }
  }
  if (!has_purpose) return send_error(ch, bad_request("purpose: required (\"batch\")", "purpose"));
  if (purpose != "batch")
    return send_error(ch, bad_request("purpose: only \"batch\" is supported, got \"" + purpose + "\"", "purpose"));
  if (!file) return send_error(ch, bad_request("file: required (a JSONL file part)", "file"));
  if (file->data.size() > limits_.max_file_bytes)
    return send_error(ch, ApiError{413, "file: larger than " + std::to_string(limits_.max_file_bytes) + " bytes",
                                   "invalid_request_error", "file", "file_too_large"});
  if (file->data.empty()) return send_error(ch, bad_request("file: empty", "file"));
  // The file's bounds are checked now, with a 400 naming the limit; malformed
  // lines within them are the batch's business (its error file).
  {
    size_t lines = 0, pos = 0, line_no = 0;
    const std::string_view d = file->data;
    while (pos < d.size()) {
      size_t end = d.find('\n', pos);
      if (end == std::string_view::npos) end = d.size();
      ++line_no;
      const std::string_view line = d.substr(pos, end - pos);
      if (line.size() > limits_.max_line_bytes)
        return send_error(ch, bad_request("file: line " + std::to_string(line_no) + " is longer than " +
                                              std::to_string(limits_.max_line_bytes) + " bytes",
                                          "file", "line_too_long"));
      if (line.find_first_not_of(" \t\r") != std::string_view::npos && ++lines > limits_.max_lines)
        return send_error(ch, bad_request("file: more than " + std::to_string(limits_.max_lines) + " lines (the limit)",
                                          "file", "too_many_lines"));
      pos = end + 1;
    }
  }
  const std::string filename = file->filename.empty() ? "upload.jsonl" : file->filename;
  if (!valid_filename(filename))
    return send_error(ch, bad_request("file: the filename must be 1 to 255 characters without control characters", "file"));
  auto f = store_.add_file(owner, filename, purpose, file->data);
  if (!f.ok()) return send_error(ch, ApiError{500, f.status().message(), "server_error", "", "storage_error"});
  send_json(ch, file_json(*f));
}

void BatchApi::create_batch(const http::HttpRequest& req, const std::string& owner,
                            const std::shared_ptr<http::ResponseChannel>& ch) {
  if (json_depth(req.body) > 16) return send_error(ch, bad_request("request body nests too deeply"));
  json j;
  try {
    j = json::parse(req.body);
  } catch (const json::exception& e) {
    return send_error(ch, bad_request(std::string("request body is not valid JSON: ") + e.what()));
  }
  if (!j.is_object()) return send_error(ch, bad_request("request body must be a JSON object"));
  auto str = [&](const char* k) -> std::optional<std::string> {
    if (!j.contains(k) || !j[k].is_string()) return std::nullopt;
    return j[k].get<std::string>();
  };
  const auto input = str("input_file_id");
  if (!input || input->empty()) return send_error(ch, bad_request("input_file_id: expected a file id", "input_file_id"));
  const auto endpoint = str("endpoint");
  if (!endpoint || !batch_endpoint_supported(*endpoint))
    return send_error(ch, bad_request("endpoint: expected /v1/chat/completions or /v1/completions", "endpoint"));
  const auto window = str("completion_window");
  const int64_t window_s = window ? window_seconds(*window) : -1;
  if (window_s < 0)
    return send_error(ch, bad_request("completion_window: expected \"24h\" (hours, 1h to 168h)", "completion_window"));
  json meta = nullptr;
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    meta = j["metadata"];
    bool ok = meta.is_object() && meta.size() <= 16;
    for (auto it = meta.begin(); ok && it != meta.end(); ++it)
      ok = it.key().size() <= 64 && it.value().is_string() && it.value().get<std::string>().size() <= 512;
    if (!ok)
      return send_error(ch, bad_request("metadata: expected at most 16 string values, keys up to 64 and values up to "
                                        "512 characters",
                                        "metadata"));
  }
  std::optional<FileRecord> f = store_.file(owner, *input);
  if (!f) return send_error(ch, not_found_error("file", *input, "input_file_id"));
  if (f->purpose != "batch")
    return send_error(ch, bad_request("input_file_id: the file's purpose is " + f->purpose + ", not batch",
                                      "input_file_id"));
  BatchRecord b;
  b.owner = owner;
  b.endpoint = *endpoint;
  b.input_file_id = *input;
  b.completion_window = *window;
  b.metadata_json = dump(meta);
  b.created_at = unix_seconds();
  b.expires_at = b.created_at + window_s;
  auto added = store_.add_batch(b);
  if (!added.ok()) return send_error(ch, ApiError{500, added.status().message(), "server_error", "", "storage_error"});
  runner_.wake();
  ch->send(200, "application/json", runner_.batch_json(*added));
}

}  // namespace serval::server
