// Cost of serval's request observability (Google Benchmark): what one
// generation request adds on the server's hot path, from HTTP arrival to the
// response, with metrics only and with everything on (tracing, SLOs, prices,
// energy). Compare with the engine time of a request (milliseconds even on
// stories260K). With tracing, BM_Request measures the request threads' side
// (span building and the queue hand-off); BM_OtlpJsonOfOneRequest adds the
// exporter thread's serialization of one request's spans.
//
//   build/bench/serval_observability_bench
#include <benchmark/benchmark.h>

#include "server/observability.h"

namespace serval::server {
namespace {

// A response channel that discards everything.
struct NullChannel : http::ResponseChannel {
  void send(int, std::string, std::string, http::Headers) override {}
  void start_stream(int, std::string, http::Headers) override {}
  void write(std::string) override {}
  void end() override {}
  void on_disconnect(std::function<void()>) override {}
  bool disconnected() const override { return false; }
};

std::unique_ptr<Observability> make(bool full) {
  ObservabilityConfig c;
  c.model_name = "bench";
  if (full) {
    c.otlp_endpoint = "http://127.0.0.1:1/v1/traces";  // nothing listens: spans are serialized, then dropped
    c.slo_ttft_s = 0.5;
    c.slo_itl_s = 0.05;
    c.slo_availability = 0.999;
    c.prices = *PriceTable::parse(R"({"*": {"input_per_million": 1, "output_per_million": 2}})");
    c.energy.watts_per_core = 10;
  }
  return std::move(Observability::create(c).value());
}

// One non-streaming request of `tokens` generated tokens: begin, wrap, one
// engine event per token, the usage extension, the response.
void BM_Request(benchmark::State& state) {
  auto obs = make(state.range(1) != 0);
  const int tokens = (int)state.range(0);
  http::HttpRequest req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.remote = "127.0.0.1:1";
  req.headers = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  auto null_ch = std::make_shared<NullChannel>();
  int64_t t = 1;
  for (auto _ : state) {
    auto r = obs->begin(req);
    auto ch = obs->wrap(null_ch, r);
    r->set_tenant("key1");
    r->set_generation(false);
    OutputEvent ev;
    ev.tokens = {42};
    for (int i = 0; i < tokens; ++i) {
      ev.time_ns = (t += 1000);
      if (i + 1 == tokens) {
        ev.finish = FinishReason::length;
        ev.prompt_tokens = 32;
        ev.completion_tokens = tokens;
        ev.timing = {t - 5000, t - 4000, t - 3000, t, {{t - 4000, t - 3000, 32}}, 500, 0.001};
      }
      r->on_event(0, 0, ev);
    }
    benchmark::DoNotOptimize(r->usage_extension());
    ch->send(200, "application/json", "{}");
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Request)->ArgsProduct({{32, 256}, {0, 1}})->ArgNames({"tokens", "full"})->Unit(benchmark::kMicrosecond);

// The exporter thread's share of a traced request: serializing its spans
// (server, queue, one prefill chunk, decode, detokenize) to OTLP JSON.
void BM_OtlpJsonOfOneRequest(benchmark::State& state) {
  std::vector<tracing::Span> spans(5);
  const char* names[] = {"POST /v1/completions", "queue", "prefill", "decode", "detokenize"};
  for (size_t i = 0; i < spans.size(); ++i) {
    tracing::Span& s = spans[i];
    s.name = names[i];
    s.trace_id = tracing::random_trace_id();
    s.span_id = tracing::random_span_id();
    s.parent = tracing::random_span_id();
    s.start_unix_ns = 1700000000000000000;
    s.end_unix_ns = 1700000000100000000;
    s.attributes = {{"serval.sample.index", int64_t{0}}, {"serval.request_id", std::string("req-0123456789abcdef")},
                    {"gen_ai.usage.output_tokens", int64_t{32}}};
  }
  for (auto _ : state) benchmark::DoNotOptimize(tracing::otlp_json(spans, "serval"));
}
BENCHMARK(BM_OtlpJsonOfOneRequest)->Unit(benchmark::kMicrosecond);

// A scrape of /metrics.
void BM_Scrape(benchmark::State& state) {
  auto obs = make(true);
  EngineStats s;
  for (auto _ : state) {
    metrics::ExpositionWriter w;
    obs->write_metrics(w, s, 0);
    benchmark::DoNotOptimize(w.take());
  }
}
BENCHMARK(BM_Scrape)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace serval::server

BENCHMARK_MAIN();
