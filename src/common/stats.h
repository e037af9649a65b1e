// Summary statistics of samples (latencies, timings): the one definition the
// planner, the benchmarks and the load generator report with. Pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace serval {

// Arithmetic mean; 0 when empty.
inline double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / (double)v.size();
}

// Sample standard deviation (n - 1); 0 below two samples.
inline double stddev_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / (double)(v.size() - 1));
}

// Linear-interpolated percentile (p in [0, 100], clamped) of ascending samples; 0 when empty.
inline double percentile_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double idx = std::clamp(p, 0.0, 100.0) / 100.0 * (double)(sorted.size() - 1);
  const size_t lo = (size_t)idx, hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (idx - (double)lo);
}

// The same of samples in any order.
inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, p);
}

}  // namespace serval
