// Distributed tracing: W3C Trace Context (`traceparent`) and export of spans
// as OTLP/HTTP JSON (POST {endpoint} with an ExportTraceServiceRequest).
//
// OtlpExporter owns one background thread. enqueue() never blocks on the
// network: it appends to a bounded queue (dropping and counting spans when
// full); the thread sends batches of up to max_batch spans every
// flush_interval (or sooner when a batch is full), each POST bounded by
// timeout. A slow or absent collector costs dropped spans, never request
// latency.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "common/status.h"

namespace serval::tracing {

struct TraceContext {
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};  // the caller's span: our parent
  uint8_t flags = 0;                 // bit 0: sampled
  bool sampled() const { return flags & 1; }
};

// "00-<32 hex>-<16 hex>-<2 hex>" (version 00; future versions parsed by the
// same prefix rule). nullopt for anything malformed or all-zero ids.
std::optional<TraceContext> parse_traceparent(std::string_view header);
std::string format_traceparent(const std::array<uint8_t, 16>& trace_id, const std::array<uint8_t, 8>& span_id,
                               uint8_t flags);
std::array<uint8_t, 16> random_trace_id();
std::array<uint8_t, 8> random_span_id();
std::string hex(const uint8_t* p, size_t n);
template <size_t N>
std::string hex(const std::array<uint8_t, N>& a) { return hex(a.data(), N); }

enum class SpanKind { internal = 1, server = 2 };

struct Span {
  using Value = std::variant<std::string, int64_t, double, bool>;
  std::string name;
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};
  std::optional<std::array<uint8_t, 8>> parent;
  SpanKind kind = SpanKind::internal;
  int64_t start_unix_ns = 0, end_unix_ns = 0;
  std::vector<std::pair<std::string, Value>> attributes;
  bool error = false;
  std::string status_message;
};

// The OTLP JSON body for these spans (resource service.name = service).
std::string otlp_json(const std::vector<Span>& spans, const std::string& service);

struct ExporterConfig {
  std::string endpoint;            // http://host[:port][/path]; path defaults to /v1/traces
  std::string service_name = "serval";
  size_t max_queue = 8192;         // spans waiting; past it new spans are dropped
  size_t max_batch = 512;          // spans per POST
  int flush_interval_ms = 1000;
  int timeout_ms = 2000;           // connect + send + response of one POST
};

class OtlpExporter {
 public:
  // Errors: an endpoint that is not http://host[:port][/path].
  static Expected<std::unique_ptr<OtlpExporter>> create(ExporterConfig cfg);
  ~OtlpExporter();  // one last flush (bounded by timeout), then stops

  // Any thread; never blocks on I/O.
  void enqueue(std::vector<Span> spans);

  int64_t spans_exported() const { return exported_.load(); }
  int64_t spans_dropped() const { return dropped_.load(); }
  int64_t export_failures() const { return failures_.load(); }
  size_t queue_size() const;

 private:
  explicit OtlpExporter(ExporterConfig cfg) : cfg_(std::move(cfg)) {}
  void run();
  bool post(const std::string& body);

  ExporterConfig cfg_;
  std::string host_, port_, path_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Span> queue_;
  bool stop_ = false;
  std::atomic<int64_t> exported_{0}, dropped_{0}, failures_{0};
  std::thread thread_;
};

}  // namespace serval::tracing
