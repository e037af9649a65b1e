// Unit tests of the observability building blocks: Prometheus instruments and
// exposition text, W3C traceparent parsing, OTLP JSON, SLO windows, price table.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/cost.h"
#include "server/metrics.h"
#include "server/slo.h"
#include "server/tracing.h"

namespace serval {
namespace {

using metrics::Counter;
using metrics::ExpositionWriter;
using metrics::Family;
using metrics::Histogram;

TEST(Metrics, HistogramBucketsAreLessOrEqualAndCumulative) {
  Histogram h({1, 0.1, 10});  // unsorted on purpose
  for (double v : {0.1, 0.05, 0.5, 1.0, 10.0, 11.0}) h.observe(v);
  ExpositionWriter w;
  w.header("x_seconds", "Test.", metrics::Type::histogram);
  w.histogram("x_seconds", "model=\"m\"", h);
  EXPECT_EQ(w.take(),
            "# HELP x_seconds Test.\n"
            "# TYPE x_seconds histogram\n"
            "x_seconds_bucket{model=\"m\",le=\"0.1\"} 2\n"
            "x_seconds_bucket{model=\"m\",le=\"1\"} 4\n"
            "x_seconds_bucket{model=\"m\",le=\"10\"} 5\n"
            "x_seconds_bucket{model=\"m\",le=\"+Inf\"} 6\n"
            "x_seconds_sum{model=\"m\"} 22.65\n"
            "x_seconds_count{model=\"m\"} 6\n");
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  Histogram h(metrics::token_buckets());
  Counter c;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        h.observe(3);
        c.inc(2);
      }
    });
  for (auto& t : ts) t.join();
  const auto s = h.snapshot();
  EXPECT_EQ(s.cumulative.back(), 80000u);
  EXPECT_EQ(s.sum, 240000.0);
  EXPECT_EQ(c.value(), 160000.0);
}

TEST(Metrics, FamilyRendersChildrenInLabelOrderWithEscaping) {
  Family<Counter> f("req_total", "Requests.");
  f.with({{"model", "a"}, {"code", "500"}}).inc();
  f.with({{"model", "a"}, {"code", "200"}}).inc(3);
  f.with({{"model", "a\"b\\c\nd"}, {"code", "200"}}).inc();
  ExpositionWriter w;
  w.family(f);
  EXPECT_EQ(w.take(),
            "# HELP req_total Requests.\n"
            "# TYPE req_total counter\n"
            "req_total{model=\"a\",code=\"200\"} 3\n"
            "req_total{model=\"a\",code=\"500\"} 1\n"
            "req_total{model=\"a\\\"b\\\\c\\nd\",code=\"200\"} 1\n");
  EXPECT_EQ(&f.with({{"model", "a"}, {"code", "200"}}), &f.with({{"model", "a"}, {"code", "200"}}));
}

TEST(Metrics, NumbersInPrometheusSpelling) {
  EXPECT_EQ(metrics::format_value(0.1), "0.1");
  EXPECT_EQ(metrics::format_value(1e-6), "1e-06");
  EXPECT_EQ(metrics::format_value(3), "3");
  EXPECT_EQ(metrics::format_value(INFINITY), "+Inf");
  EXPECT_EQ(metrics::format_value(-INFINITY), "-Inf");
  EXPECT_EQ(metrics::format_value(NAN), "NaN");
}

TEST(Tracing, ParsesW3cTraceparent) {
  auto tc = tracing::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(tc);
  EXPECT_EQ(tracing::hex(tc->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(tracing::hex(tc->span_id), "00f067aa0ba902b7");
  EXPECT_TRUE(tc->sampled());
  auto unsampled = tracing::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(unsampled);
  EXPECT_FALSE(unsampled->sampled());
  // A later version may append fields.
  EXPECT_TRUE(tracing::parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever"));
  EXPECT_EQ(tracing::format_traceparent(tc->trace_id, tc->span_id, 1),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
}

TEST(Tracing, RejectsMalformedTraceparent) {
  for (const char* bad : {
           "",
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero span id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // version 00 has no more fields
           "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",    // short trace id
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
       })
    EXPECT_FALSE(tracing::parse_traceparent(bad)) << bad;
}

TEST(Tracing, OtlpJsonShape) {
  tracing::Span s;
  s.name = "POST /v1/completions";
  s.kind = tracing::SpanKind::server;
  const auto tc = tracing::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(tc);
  s.trace_id = tc->trace_id;
  s.span_id = tracing::random_span_id();
  s.parent = tc->span_id;
  s.start_unix_ns = 1700000000000000000;
  s.end_unix_ns = 1700000000500000000;
  s.attributes = {{"a", std::string("x")}, {"n", int64_t{42}}, {"f", 0.5}, {"b", true}};
  s.error = true;
  s.status_message = "boom";
  const auto j = nlohmann::json::parse(tracing::otlp_json({s}, "svc"));
  const auto& rs = j["resourceSpans"][0];
  EXPECT_EQ(rs["resource"]["attributes"][0]["key"], "service.name");
  EXPECT_EQ(rs["resource"]["attributes"][0]["value"]["stringValue"], "svc");
  const auto& sp = rs["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(sp["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(sp["parentSpanId"], "00f067aa0ba902b7");
  EXPECT_EQ(sp["kind"], 2);
  EXPECT_EQ(sp["startTimeUnixNano"], "1700000000000000000");
  EXPECT_EQ(sp["endTimeUnixNano"], "1700000000500000000");
  EXPECT_EQ(sp["attributes"][1]["value"]["intValue"], "42");
  EXPECT_EQ(sp["attributes"][2]["value"]["doubleValue"], 0.5);
  EXPECT_EQ(sp["attributes"][3]["value"]["boolValue"], true);
  EXPECT_EQ(sp["status"]["code"], 2);
}

TEST(Tracing, ExporterRejectsBadEndpoints) {
  for (const char* bad : {"https://x:4318", "http://", "http://:4318", "http://h:0", "http://h:65536", "http://h:x",
                          "ftp://h", "http://[::1"}) {
    tracing::ExporterConfig c;
    c.endpoint = bad;
    EXPECT_FALSE(tracing::OtlpExporter::create(c).ok()) << bad;
  }
}

TEST(Tracing, FullQueueDropsAndCounts) {
  tracing::ExporterConfig c;
  c.endpoint = "http://127.0.0.1:1/v1/traces";  // nothing listens: exports fail fast
  c.max_queue = 3;
  c.max_batch = 1000;            // never a full batch
  c.flush_interval_ms = 60000;   // no timed flush during the test
  auto e = tracing::OtlpExporter::create(c);
  ASSERT_TRUE(e.ok());
  (*e)->enqueue(std::vector<tracing::Span>(5));
  EXPECT_EQ((*e)->queue_size(), 3u);
  EXPECT_EQ((*e)->spans_dropped(), 2);
}

TEST(Slo, WindowsAndBurnRate) {
  server::SloTracker t("ttft", 0.5, 0.99);
  const int64_t t0 = 1'000'000;
  t.record_n(90, 100, t0);          // 10% bad, now
  t.record_n(100, 100, t0 - 1000);  // 17 minutes ago, all good
  t.record_n(0, 50, t0 - 30000);    // 8 hours ago: outside every window
  EXPECT_EQ(t.events_total(), 250);
  EXPECT_EQ(t.good_total(), 190);
  auto w5 = t.window(300, t0);
  EXPECT_EQ(w5.total, 100);
  EXPECT_EQ(w5.good, 90);
  EXPECT_NEAR(t.burn_rate(300, t0), 10.0, 1e-9);  // 10% bad against a 1% budget
  auto w1h = t.window(3600, t0);
  EXPECT_EQ(w1h.total, 200);
  EXPECT_NEAR(t.burn_rate(3600, t0), 5.0, 1e-9);
  EXPECT_EQ(t.window(21600, t0).total, 200);
  // A bucket reused after the ring wraps starts from zero.
  t.record_n(1, 1, t0 + 21610);
  EXPECT_EQ(t.window(300, t0 + 21610).total, 1);
  EXPECT_EQ(t.window(300, t0 + 100000).total, 0);
  EXPECT_EQ(t.window(300, t0 + 100000).attainment(), 1.0);
}

TEST(Cost, PriceTable) {
  auto t = server::PriceTable::parse(
      R"({"big": {"input_per_million": 3, "output_per_million": 15}, "*": {"input_per_million": 0.5}})");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_DOUBLE_EQ(t->cost("big", 1000, 2000), (1000 * 3.0 + 2000 * 15.0) / 1e6);
  EXPECT_DOUBLE_EQ(t->cost("other", 1000, 2000), 1000 * 0.5 / 1e6);
  EXPECT_EQ(server::PriceTable::parse(R"({"m": {"input_per_million": 1}})")->cost("x", 5, 5), 0.0);
  for (const char* bad : {"[]", "{", R"({"m": 3})", R"({"m": {"input_per_million": -1}})",
                          R"({"m": {"input_per_million": "1"}})", R"({"m": {"inptu_per_million": 1}})"})
    EXPECT_FALSE(server::PriceTable::parse(bad).ok()) << bad;
}

TEST(Cost, CpuEnergyModel) {
  server::EnergyConfig c;
  c.watts_per_core = 10;
  c.n_threads = 4;
  c.grid_g_per_kwh = 360;
  server::EnergyModel m(c);
  EXPECT_TRUE(m.enabled());
  EXPECT_DOUBLE_EQ(m.joules(0.5, 100), 20.0);  // 0.5 s x 4 cores x 10 W
  EXPECT_DOUBLE_EQ(m.carbon_grams(3.6e6), 360.0);
}

}  // namespace
}  // namespace serval

namespace serval {
namespace {

// RAPL: package power = counter joules over engine busy seconds; a request's
// energy = its compute seconds x that power. A fake counter file stands in
// for /sys/class/powercap.
TEST(Cost, RaplEnergyModel) {
  const std::string path = ::testing::TempDir() + "/serval_fake_energy_uj";
  auto write = [&](const char* uj) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(uj, f);
    std::fclose(f);
  };
  write("1000000\n");  // 1 J at start
  server::EnergyConfig c;
  c.use_rapl = true;
  c.rapl_path = path;
  c.n_threads = 2;
  c.watts_per_core = 3;
  server::EnergyModel m(c);
  ASSERT_TRUE(m.rapl());
  write("21000000\n");  // 20 J over 2 busy seconds: 10 W
  EXPECT_DOUBLE_EQ(m.joules(0.5, 2.0), 5.0);
  c.rapl_path = path + ".missing";
  server::EnergyModel fallback(c);
  EXPECT_FALSE(fallback.rapl());
  EXPECT_DOUBLE_EQ(fallback.joules(0.5, 2.0), 3.0);  // 0.5 s x 2 cores x 3 W
  std::remove(path.c_str());
}

}  // namespace
}  // namespace serval

namespace serval {
namespace {

// Span names and attributes come from request paths and headers: the OTLP
// body stays valid JSON (and valid UTF-8) whatever bytes they hold.
TEST(Tracing, OtlpJsonEscapesAndRepairsStrings) {
  tracing::Span s;
  s.name = std::string("GET /a\"b\\c\n\x01\xff\xc3\xa9\xe2\x82", 17);  // quote, backslash, controls, bad and good UTF-8
  s.trace_id = tracing::random_trace_id();
  s.span_id = tracing::random_span_id();
  s.attributes = {{"k\"", std::string("\xed\xa0\x80")}, {"d", 1e-7}, {"i", int64_t{-5}}};  // a UTF-16 surrogate
  const std::string body = tracing::otlp_json({s}, "svc");
  const auto j = nlohmann::json::parse(body);  // throws on invalid JSON or UTF-8
  const auto& sp = j["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(sp["name"], "GET /a\"b\\c\n\x01\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(sp["attributes"][0]["key"], "k\"");
  EXPECT_EQ(sp["attributes"][0]["value"]["stringValue"], "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(sp["attributes"][1]["value"]["doubleValue"], 1e-7);
  EXPECT_EQ(sp["attributes"][2]["value"]["intValue"], "-5");
  EXPECT_FALSE(sp.contains("parentSpanId"));
  EXPECT_EQ(sp["status"]["code"], 1);
}

}  // namespace
}  // namespace serval
