#include "server/tracing.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
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

namespace {

// Appends s as a JSON string: quotes, backslashes and control characters
// escaped; invalid UTF-8 replaced by U+FFFD (attribute values come from
// request paths and headers).
void json_string(std::string& out, std::string_view s) {
  static const char* d = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = (unsigned char)s[i];
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += (char)c;
      } else if (c < 0x20) {
        out += "\\u00";
        out += d[c >> 4];
        out += d[c & 15];
      } else {
        out += (char)c;
      }
      ++i;
      continue;
    }
    // Length of a well-formed sequence starting here (RFC 3629), else 0.
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (n && i + n <= s.size()) {
      const unsigned char c1 = (unsigned char)s[i + 1];
      const unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
      const unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
      bool ok = c1 >= lo && c1 <= hi;
      for (size_t k = 2; ok && k < n; ++k) ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
      if (ok) {
        out.append(s.data() + i, n);
        i += n;
        continue;
      }
    }
    out += "\xef\xbf\xbd";  // U+FFFD
    ++i;
  }
  out += '"';
}

void json_hex(std::string& out, const uint8_t* p, size_t n) {
  out += '"';
  out += hex(p, n);
  out += '"';
}

void json_attribute(std::string& out, std::string_view key, const Span::Value& v) {
  out += "{\"key\":";
  json_string(out, key);
  out += ",\"value\":{";
  if (auto* s = std::get_if<std::string>(&v)) {
    out += "\"stringValue\":";
    json_string(out, *s);
  } else if (auto* i = std::get_if<int64_t>(&v)) {
    out += "\"intValue\":\"" + std::to_string(*i) + "\"";  // int64 as a string (proto3 JSON)
  } else if (auto* f = std::get_if<double>(&v)) {
    char buf[64];
    const double x = std::isfinite(*f) ? *f : 0.0;
    out += "\"doubleValue\":";
    out.append(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
  } else {
    out += std::get<bool>(v) ? "\"boolValue\":true" : "\"boolValue\":false";
  }
  out += "}}";
}

}  // namespace

// Written directly (not through a JSON DOM): the exporter serializes every
// traced request's spans, and this is about ten times cheaper.
std::string otlp_json(const std::vector<Span>& spans, const std::string& service) {
  std::string out;
  out.reserve(256 + spans.size() * 512);
  out += "{\"resourceSpans\":[{\"resource\":{\"attributes\":[";
  json_attribute(out, "service.name", service);
  out += "]},\"scopeSpans\":[{\"scope\":{\"name\":\"serval\"},\"spans\":[";
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (i) out += ',';
    out += "{\"traceId\":";
    json_hex(out, s.trace_id.data(), s.trace_id.size());
    out += ",\"spanId\":";
    json_hex(out, s.span_id.data(), s.span_id.size());
    if (s.parent) {
      out += ",\"parentSpanId\":";
      json_hex(out, s.parent->data(), s.parent->size());
    }
    out += ",\"name\":";
    json_string(out, s.name);
    out += ",\"kind\":" + std::to_string((int)s.kind);
    out += ",\"startTimeUnixNano\":\"" + std::to_string(s.start_unix_ns) + "\"";
    out += ",\"endTimeUnixNano\":\"" + std::to_string(s.end_unix_ns) + "\"";
    out += ",\"attributes\":[";
    for (size_t k = 0; k < s.attributes.size(); ++k) {
      if (k) out += ',';
      json_attribute(out, s.attributes[k].first, s.attributes[k].second);
    }
    out += "],\"status\":";
    if (s.error) {
      out += "{\"code\":2,\"message\":";
      json_string(out, s.status_message);
      out += '}';
    } else {
      out += "{\"code\":1}";
    }
    out += '}';
  }
  out += "]}]}]}";
  return out;
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
