// Observability of the OpenAI server: Prometheus metrics (latency and token
// histograms, counters, gauges), SLO good/total events, per-tenant token,
// cost and energy counters, W3C trace context and OTLP spans, and JSON access
// logs.
//
// Per request: Observability::begin() on the I/O thread creates a
// RequestObservation; wrap() puts an ObservedChannel around the response
// channel, which finishes the observation (status counters, SLO availability,
// tenant counters, access log, HTTP span and export) when the response is
// sent or its stream ends. A generation job feeds it the engine's events
// (on_event, under the job's mutex).
//
// Threads: every recording path is atomics (instrument children are looked up
// once per request, under a short mutex, never per token) plus a per-request
// mutex that only that request's threads touch. Export is handed to the
// OtlpExporter's queue.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "serval/engine.h"
#include "server/cost.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/slo.h"
#include "server/tracing.h"

namespace serval::server {

struct ObservabilityConfig {
  std::string model_name;
  std::string otlp_endpoint;        // empty: no span export
  std::string service_name = "serval";
  bool log_json = false;            // one JSON access-log line per request on log_out
  FILE* log_out = stderr;
  double slo_ttft_s = 0, slo_ttft_objective = 0.99;  // threshold 0: no TTFT SLO
  double slo_itl_s = 0, slo_itl_objective = 0.99;
  double slo_availability = 0;      // objective ratio in (0, 1); 0: no availability SLO
  std::optional<PriceTable> prices;
  EnergyConfig energy;
};

class Observability;

class RequestObservation {
 public:
  RequestObservation(Observability& o, const http::HttpRequest& req);
  const std::string& request_id() const { return request_id_; }
  std::string trace_id() const { return tracing::hex(trace_id_); }
  std::string span_id() const { return tracing::hex(span_id_); }
  bool sampled() const { return sampled_; }

  void set_tenant(std::string tenant);
  // A completion/chat request: counts toward latency histograms and SLOs.
  void set_generation(bool stream);
  // An engine event of stream `stream_idx`, choice `choice_idx` (serialized by the caller).
  void on_event(size_t stream_idx, size_t choice_idx, const OutputEvent& ev);
  // {"cost_usd", "energy_joules", "carbon_grams"} (each only when configured)
  // for the tokens and engine time seen so far.
  nlohmann::ordered_json usage_extension() const;

  // For introspection (/v1/engine/state): a consistent copy of the progress so far.
  struct Progress {
    std::string request_id, tenant;
    double age_s = 0;
    bool first_token = false, stream = false;
    int64_t prompt_tokens = 0, completion_tokens = 0;  // prompt tokens are known once a sample finished
  };
  Progress progress() const;

  // Records everything once (the first call wins). status 0: no response was sent.
  void finish(int status, bool client_gone);

 private:
  friend class Observability;
  struct ChoiceState {
    int64_t last_token_ns = 0;
    int64_t tokens = 0;
  };
  double energy_joules() const;
  void add_engine_spans(const OutputEvent& ev, bool first_sample);

  Observability& o_;
  mutable std::mutex mu_;
  std::string method_, path_, remote_, request_id_, tenant_ = "anonymous";
  std::array<uint8_t, 16> trace_id_{};
  std::array<uint8_t, 8> span_id_{};
  std::optional<std::array<uint8_t, 8>> parent_;
  bool sampled_ = false;
  int64_t start_ns_ = 0, start_unix_ns_ = 0;
  bool generation_ = false, stream_ = false, finished_ = false, ttft_seen_ = false;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  double compute_s_ = 0;
  std::vector<ChoiceState> choices_;
  std::vector<tracing::Span> spans_;
};

// The response channel of one request, finishing its observation.
class ObservedChannel : public http::ResponseChannel {
 public:
  ObservedChannel(std::shared_ptr<http::ResponseChannel> inner, std::shared_ptr<RequestObservation> obs)
      : inner_(std::move(inner)), obs_(std::move(obs)) {}
  void send(int status, std::string content_type, std::string body, http::Headers extra = {}) override;
  void start_stream(int status, std::string content_type, http::Headers extra = {}) override;
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end() override;
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }
  bool disconnected() const override { return inner_->disconnected(); }

 private:
  std::shared_ptr<http::ResponseChannel> inner_;
  std::shared_ptr<RequestObservation> obs_;
  std::atomic<int> stream_status_{0};
};

class Observability {
 public:
  static Expected<std::unique_ptr<Observability>> create(ObservabilityConfig cfg);

  std::shared_ptr<RequestObservation> begin(const http::HttpRequest& req);
  std::shared_ptr<http::ResponseChannel> wrap(std::shared_ptr<http::ResponseChannel> ch,
                                              std::shared_ptr<RequestObservation> obs);

  // Appends every metric to w. in_flight: generation requests accepted and not finished.
  void write_metrics(metrics::ExpositionWriter& w, const EngineStats& s, size_t in_flight) const;
  // vLLM's names for the signals routers read (Gateway API Inference
  // Extension's model-server protocol; `serve --metrics-compat vllm`): queue,
  // running, KV use, cache config, LoRA info. Same stats as serval's names.
  void write_vllm_aliases(metrics::ExpositionWriter& w, const EngineStats& s, int32_t block_size) const;
  // Engine busy seconds, for the RAPL power estimate (updated from stats at scrape and per request).
  void set_engine_busy_s(double s) { engine_busy_s_.store(s); }

  const ObservabilityConfig& config() const { return cfg_; }
  // The model's latency histograms by short name (ttft, itl, e2e, queue), for
  // the JSON the dashboard polls (/v1/engine/state); they live as long as this.
  std::vector<std::pair<const char*, const metrics::Histogram*>> latency_histograms() const {
    return {{"ttft", ttft_}, {"itl", itl_}, {"e2e", e2e_}, {"queue", queue_}};
  }
  int64_t unix_ns(int64_t steady_ns) const { return steady_ns + steady_to_unix_ns_; }
  bool tracing() const { return exporter_ != nullptr; }

 private:
  friend class RequestObservation;
  explicit Observability(ObservabilityConfig cfg);
  metrics::Counter& tenant_counter(metrics::Family<metrics::Counter>& f, const std::string& tenant) {
    return f.with({{"model", cfg_.model_name}, {"tenant", tenant}});
  }
  void access_log(const RequestObservation& r, int status, bool client_gone, double duration_s) const;

  ObservabilityConfig cfg_;
  metrics::Labels model_;
  int64_t steady_to_unix_ns_ = 0;
  std::unique_ptr<tracing::OtlpExporter> exporter_;
  std::unique_ptr<EnergyModel> energy_;
  std::atomic<double> engine_busy_s_{0};

  // Model-labelled histograms (children cached).
  metrics::Family<metrics::Histogram> ttft_f_, itl_f_, e2e_f_, queue_f_, prefill_f_, decode_f_, prompt_len_f_, gen_len_f_;
  metrics::Histogram *ttft_, *itl_, *e2e_, *queue_, *prefill_, *decode_, *prompt_len_, *gen_len_;
  metrics::Family<metrics::Counter> finish_f_, status_f_;
  metrics::Family<metrics::Counter> tenant_requests_f_, tenant_prompt_f_, tenant_gen_f_, tenant_cost_f_,
      tenant_energy_f_, tenant_carbon_f_;
  std::vector<std::unique_ptr<SloTracker>> slos_;
  SloTracker *slo_ttft_ = nullptr, *slo_itl_ = nullptr, *slo_avail_ = nullptr;
};

}  // namespace serval::server
