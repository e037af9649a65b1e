// Prometheus instruments and the text exposition format (version 0.0.4).
//
// Counter, Gauge and Histogram are lock-free (atomics only): any thread may
// update them at any time, so the engine-event and HTTP threads never contend
// on a lock to record a measurement. A Family holds one instrument per label
// set; looking a child up takes a mutex, so hot paths look their children up
// once and keep the reference (children are never removed, references stay
// valid for the family's lifetime).
//
// ExpositionWriter renders "# HELP" / "# TYPE" once per metric name and the
// samples below it; label values are escaped, numbers use the shortest
// round-trip form and +Inf/-Inf/NaN as Prometheus spells them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace serval::metrics {

// A rendered label set without braces: model="a",code="200". Built once.
using Labels = std::vector<std::pair<std::string, std::string>>;
std::string render_labels(const Labels& labels);
std::string escape_label_value(std::string_view v);
std::string format_value(double v);

class Counter {
 public:
  void inc(double by = 1.0) { v_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double by) { v_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

// Cumulative histogram over fixed upper bounds (sorted, finite; +Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // [bounds.size() + 1]; the last is the count (+Inf)
    double sum = 0;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; [bounds.size() + 1]
  std::atomic<double> sum_{0.0};
};

// Bucket layouts.
std::vector<double> exponential_buckets(double start, double factor, int count);
std::vector<double> latency_buckets();  // 1 ms .. ~160 s
std::vector<double> token_buckets();    // 1 .. 65536 tokens

enum class Type { counter, gauge, histogram };

// One metric name with children per label set. T is Counter, Gauge or Histogram.
template <class T>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<double> bounds = {})
      : name_(std::move(name)), help_(std::move(help)), bounds_(std::move(bounds)) {}
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }

  // The child for these labels, created on first use (takes a mutex).
  T& with(const Labels& labels) {
    std::string key = render_labels(labels);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = children_.find(key);
    if (it == children_.end()) it = children_.emplace(std::move(key), make()).first;
    return *it->second;
  }
  // (rendered labels, child) in label order; the children stay valid.
  std::vector<std::pair<std::string, const T*>> children() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<std::string, const T*>> out;
    for (const auto& [k, c] : children_) out.emplace_back(k, c.get());
    return out;
  }

 private:
  std::unique_ptr<T> make() const {
    if constexpr (std::is_same_v<T, Histogram>) return std::make_unique<T>(bounds_);
    else return std::make_unique<T>();
  }
  std::string name_, help_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<T>> children_;
};

class ExpositionWriter {
 public:
  // "# HELP name help" and "# TYPE name type". Counters must end in _total.
  void header(std::string_view name, std::string_view help, Type type);
  // One sample line; labels already rendered (may be empty).
  void sample(std::string_view name, std::string_view labels, double value);
  // name_bucket{labels,le=...}, name_sum, name_count.
  void histogram(std::string_view name, std::string_view labels, const Histogram& h);

  // Header plus every child of a family.
  void family(const Family<Counter>& f);
  void family(const Family<Gauge>& f);
  void family(const Family<Histogram>& f);

  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace serval::metrics
