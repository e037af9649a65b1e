#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace serval::metrics {

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string render_labels(const Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  // Prometheus buckets are "less than or equal": v lands in the first bound >= v.
  const size_t i = (size_t)(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = acc;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
          1,     2.5,    5,     10,   20,    40,   80,    160};
}

std::vector<double> token_buckets() { return exponential_buckets(1, 2, 17); }

static const char* type_name(Type t) {
  switch (t) {
    case Type::counter: return "counter";
    case Type::gauge: return "gauge";
    case Type::histogram: return "histogram";
  }
  return "untyped";
}

void ExpositionWriter::header(std::string_view name, std::string_view help, Type type) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  for (char c : help) out_ += c == '\n' ? ' ' : c;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type_name(type);
  out_ += '\n';
}

void ExpositionWriter::sample(std::string_view name, std::string_view labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    out_ += labels;
    out_ += '}';
  }
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void ExpositionWriter::histogram(std::string_view name, std::string_view labels, const Histogram& h) {
  const Histogram::Snapshot s = h.snapshot();
  const std::string bucket = std::string(name) + "_bucket";
  const std::string prefix = labels.empty() ? std::string() : std::string(labels) + ",";
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    const double le = i < h.bounds().size() ? h.bounds()[i] : INFINITY;
    sample(bucket, prefix + "le=\"" + format_value(le) + "\"", (double)s.cumulative[i]);
  }
  sample(std::string(name) + "_sum", labels, s.sum);
  sample(std::string(name) + "_count", labels, (double)s.cumulative.back());
}

void ExpositionWriter::family(const Family<Counter>& f) {
  header(f.name(), f.help(), Type::counter);
  for (const auto& [labels, c] : f.children()) sample(f.name(), labels, c->value());
}

void ExpositionWriter::family(const Family<Gauge>& f) {
  header(f.name(), f.help(), Type::gauge);
  for (const auto& [labels, g] : f.children()) sample(f.name(), labels, g->value());
}

void ExpositionWriter::family(const Family<Histogram>& f) {
  header(f.name(), f.help(), Type::histogram);
  for (const auto& [labels, h] : f.children()) histogram(f.name(), labels, *h);
}

}  // namespace serval::metrics
