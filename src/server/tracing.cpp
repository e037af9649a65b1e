#include "server/tracing.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

namespace serval::tracing {

namespace {

int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is invalid in traceparent
}

template <size_t N>
bool parse_hex(std::string_view s, std::array<uint8_t, N>* out) {
  if (s.size() != 2 * N) return false;
  bool nonzero = false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = hex_val(s[2 * i]), lo = hex_val(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = (uint8_t)(hi * 16 + lo);
    nonzero |= (*out)[i] != 0;
  }
  return nonzero;
}

std::mt19937_64& rng() {
  static thread_local std::mt19937_64 r{((uint64_t)std::random_device{}() << 32) ^ std::random_device{}()};
  return r;
}

}  // namespace

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[p[i] >> 4];
    s[2 * i + 1] = d[p[i] & 15];
  }
  return s;
}

std::optional<TraceContext> parse_traceparent(std::string_view h) {
  // version "-" trace-id "-" parent-id "-" flags; later versions may append "-..." fields.
  while (!h.empty() && (h.front() == ' ' || h.front() == '\t')) h.remove_prefix(1);
  while (!h.empty() && (h.back() == ' ' || h.back() == '\t')) h.remove_suffix(1);
  if (h.size() < 55) return std::nullopt;
  std::array<uint8_t, 1> version{}, flags{};
  if (hex_val(h[0]) < 0 || hex_val(h[1]) < 0 || h.substr(0, 2) == "ff") return std::nullopt;
  version[0] = (uint8_t)(hex_val(h[0]) * 16 + hex_val(h[1]));
  if (h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  if (version[0] == 0 && h.size() != 55) return std::nullopt;
  if (h.size() > 55 && h[55] != '-') return std::nullopt;
  TraceContext tc;
  if (!parse_hex(h.substr(3, 32), &tc.trace_id) || !parse_hex(h.substr(36, 16), &tc.span_id)) return std::nullopt;
  const int f1 = hex_val(h[53]), f2 = hex_val(h[54]);
  if (f1 < 0 || f2 < 0) return std::nullopt;
  flags[0] = (uint8_t)(f1 * 16 + f2);
  tc.flags = flags[0];
  return tc;
}

std::string format_traceparent(const std::array<uint8_t, 16>& trace_id, const std::array<uint8_t, 8>& span_id,
                               uint8_t flags) {
  return "00-" + hex(trace_id) + "-" + hex(span_id) + "-" + hex(&flags, 1);
}

std::array<uint8_t, 16> random_trace_id() {
  std::array<uint8_t, 16> id{};
  while (std::all_of(id.begin(), id.end(), [](uint8_t b) { return b == 0; })) {
    const uint64_t a = rng()(), b = rng()();
    std::memcpy(id.data(), &a, 8);
    std::memcpy(id.data() + 8, &b, 8);
  }
  return id;
}

std::array<uint8_t, 8> random_span_id() {
  std::array<uint8_t, 8> id{};
  while (std::all_of(id.begin(), id.end(), [](uint8_t b) { return b == 0; })) {
    const uint64_t a = rng()();
    std::memcpy(id.data(), &a, 8);
  }
  return id;
}

std::string otlp_json(const std::vector<Span>& spans, const std::string& service) {
  using json = nlohmann::json;
  auto attr = [](const std::string& k, const Span::Value& v) {
    json val;
    if (auto* s = std::get_if<std::string>(&v)) val["stringValue"] = *s;
    else if (auto* i = std::get_if<int64_t>(&v)) val["intValue"] = std::to_string(*i);  // int64 as a string (proto3 JSON)
    else if (auto* d = std::get_if<double>(&v)) val["doubleValue"] = *d;
    else val["boolValue"] = std::get<bool>(v);
    return json{{"key", k}, {"value", val}};
  };
  json arr = json::array();
  for (const Span& s : spans) {
    json j = {{"traceId", hex(s.trace_id)},
              {"spanId", hex(s.span_id)},
              {"name", s.name},
              {"kind", (int)s.kind},
              {"startTimeUnixNano", std::to_string(s.start_unix_ns)},
              {"endTimeUnixNano", std::to_string(s.end_unix_ns)}};
    if (s.parent) j["parentSpanId"] = hex(*s.parent);
    json attrs = json::array();
    for (const auto& [k, v] : s.attributes) attrs.push_back(attr(k, v));
    j["attributes"] = attrs;
    j["status"] = s.error ? json{{"code", 2}, {"message", s.status_message}} : json{{"code", 1}};
    arr.push_back(std::move(j));
  }
  json body = {{"resourceSpans",
                json::array({{{"resource", {{"attributes", json::array({attr("service.name", service)})}}},
                              {"scopeSpans", json::array({{{"scope", {{"name", "serval"}}}, {"spans", arr}}})}}})}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

Expected<std::unique_ptr<OtlpExporter>> OtlpExporter::create(ExporterConfig cfg) {
  const std::string& url = cfg.endpoint;
  const std::string scheme = "http://";
  const auto bad = [&] {
    return invalid_argument("--otlp-endpoint: expected http://host[:port][/path], got '" + url + "'");
  };
  if (url.size() > 2048 || url.rfind(scheme, 0) != 0) return bad();
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash), path = slash == std::string::npos ? "" : rest.substr(slash);
  if (path.empty() || path == "/") path = "/v1/traces";
  std::string host = hostport, port = "80";
  if (!hostport.empty() && hostport[0] == '[') {  // [v6]:port
    const size_t close = hostport.find(']');
    if (close == std::string::npos) return bad();
    host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size()) {
      if (hostport[close + 1] != ':') return bad();
      port = hostport.substr(close + 2);
    }
  } else if (const size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) || std::stoi(port) > 65535 ||
      std::stoi(port) < 1)
    return bad();
  if (cfg.max_queue < 1 || cfg.max_batch < 1 || cfg.flush_interval_ms < 1 || cfg.timeout_ms < 1)
    return invalid_argument("OTLP exporter: queue, batch, interval and timeout must be positive");
  std::unique_ptr<OtlpExporter> e(new OtlpExporter(std::move(cfg)));
  e->host_ = host;
  e->port_ = port;
  e->path_ = path;
  OtlpExporter* raw = e.get();
  e->thread_ = std::thread([raw] { raw->run(); });
  return e;
}

OtlpExporter::~OtlpExporter() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t OtlpExporter::queue_size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size();
}

void OtlpExporter::enqueue(std::vector<Span> spans) {
  bool full_batch = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const size_t room = cfg_.max_queue - std::min(cfg_.max_queue, queue_.size());
    const size_t take = std::min(room, spans.size());
    if (take < spans.size()) dropped_ += (int64_t)(spans.size() - take);
    for (size_t i = 0; i < take; ++i) queue_.push_back(std::move(spans[i]));
    full_batch = queue_.size() >= cfg_.max_batch;
  }
  if (full_batch) cv_.notify_one();
}

void OtlpExporter::run() {
  for (;;) {
    std::vector<Span> batch;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(cfg_.flush_interval_ms),
                   [&] { return stop_ || queue_.size() >= cfg_.max_batch; });
      stopping = stop_;
      const size_t n = std::min(queue_.size(), cfg_.max_batch);
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + (ptrdiff_t)n));
      queue_.erase(queue_.begin(), queue_.begin() + (ptrdiff_t)n);
    }
    if (!batch.empty()) {
      if (post(otlp_json(batch, cfg_.service_name))) exported_ += (int64_t)batch.size();
      else {
        ++failures_;
        dropped_ += (int64_t)batch.size();
      }
    }
    if (stopping) {
      std::lock_guard<std::mutex> lk(mu_);
      dropped_ += (int64_t)queue_.size();  // one flush at shutdown, not an unbounded drain
      queue_.clear();
      return;
    }
  }
}

// One POST with a deadline on the whole exchange (connect, write, read).
bool OtlpExporter::post(const std::string& body) {
  namespace net = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  try {
    net::io_context ioc;
    net::ip::tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    http::request<http::string_body> req{http::verb::post, path_, 11};
    req.set(http::field::host, host_ + ":" + port_);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::user_agent, "serval-otlp");
    req.body() = body;
    req.prepare_payload();
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    bool ok = false;
    stream.expires_after(std::chrono::milliseconds(cfg_.timeout_ms));
    resolver.async_resolve(host_, port_, [&](beast::error_code ec, net::ip::tcp::resolver::results_type results) {
      if (ec) return;
      stream.async_connect(results, [&](beast::error_code ec2, const net::ip::tcp::endpoint&) {
        if (ec2) return;
        http::async_write(stream, req, [&](beast::error_code ec3, size_t) {
          if (ec3) return;
          http::async_read(stream, buf, res, [&](beast::error_code ec4, size_t) {
            ok = !ec4 && res.result_int() >= 200 && res.result_int() < 300;
          });
        });
      });
    });
    // The resolver has no deadline of its own: bound the whole run.
    ioc.run_for(std::chrono::milliseconds(cfg_.timeout_ms + 100));
    beast::error_code ignored;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
    return ok;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace serval::tracing
