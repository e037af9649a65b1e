// Service-level objectives: each SLO classifies events as good or bad
// (TTFT <= threshold, inter-token latency <= threshold, a generation request
// answered without a 5xx) against a target ratio (e.g. 0.99).
//
// Exported two ways:
//  - monotonic good/total counters, from which Prometheus computes attainment
//    and multi-window burn rates (see deploy/prometheus/serval-rules.yml);
//  - in-process sliding windows (5m, 30m, 1h, 6h) as gauges of attainment and
//    error-budget burn rate, for dashboards without recording rules.
//
// record() is lock-free: atomics in a ring of 10-second buckets; a bucket
// whose epoch is stale is reset by the first writer of the new epoch (a
// racing writer may lose one event at the boundary — acceptable for a gauge;
// the counters are exact).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace serval::server {

struct SloWindow {
  const char* name;  // "5m"
  int64_t seconds;
};
inline constexpr std::array<SloWindow, 4> kSloWindows{{{"5m", 300}, {"30m", 1800}, {"1h", 3600}, {"6h", 21600}}};

class SloTracker {
 public:
  // threshold_s: latency bound (0 for availability); objective in (0, 1).
  SloTracker(std::string name, double threshold_s, double objective);
  SloTracker(const SloTracker&) = delete;

  void record(bool good, int64_t now_s);
  void record_n(int64_t good, int64_t total, int64_t now_s);

  const std::string& name() const { return name_; }
  double threshold_s() const { return threshold_s_; }
  double objective() const { return objective_; }
  int64_t good_total() const { return good_.load(std::memory_order_relaxed); }
  int64_t events_total() const { return total_.load(std::memory_order_relaxed); }

  struct WindowView {
    int64_t good = 0, total = 0;
    double attainment() const { return total ? (double)good / (double)total : 1.0; }
  };
  WindowView window(int64_t seconds, int64_t now_s) const;
  // (1 - attainment) / (1 - objective): 1 burns the budget exactly over the SLO period.
  double burn_rate(int64_t seconds, int64_t now_s) const;

 private:
  static constexpr int64_t kBucketS = 10;
  static constexpr size_t kBuckets = 21600 / kBucketS + 1;  // 6 h plus the bucket being filled
  struct Bucket {
    std::atomic<int64_t> epoch{-1};
    std::atomic<int64_t> good{0}, total{0};
  };
  std::string name_;
  double threshold_s_, objective_;
  std::atomic<int64_t> good_{0}, total_{0};
  std::unique_ptr<Bucket[]> ring_;
};

}  // namespace serval::server
