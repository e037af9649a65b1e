#include "server/slo.h"

namespace serval::server {

SloTracker::SloTracker(std::string name, double threshold_s, double objective)
    : name_(std::move(name)), threshold_s_(threshold_s), objective_(objective), ring_(new Bucket[kBuckets]) {}

void SloTracker::record(bool good, int64_t now_s) { record_n(good ? 1 : 0, 1, now_s); }

void SloTracker::record_n(int64_t good, int64_t total, int64_t now_s) {
  if (total <= 0) return;
  good_.fetch_add(good, std::memory_order_relaxed);
  total_.fetch_add(total, std::memory_order_relaxed);
  const int64_t epoch = now_s / kBucketS;
  Bucket& b = ring_[(size_t)(epoch % (int64_t)kBuckets)];
  int64_t seen = b.epoch.load(std::memory_order_acquire);
  if (seen != epoch && b.epoch.compare_exchange_strong(seen, epoch, std::memory_order_acq_rel)) {
    b.good.store(0, std::memory_order_relaxed);
    b.total.store(0, std::memory_order_relaxed);
  }
  b.good.fetch_add(good, std::memory_order_relaxed);
  b.total.fetch_add(total, std::memory_order_relaxed);
}

SloTracker::WindowView SloTracker::window(int64_t seconds, int64_t now_s) const {
  WindowView v;
  const int64_t now_epoch = now_s / kBucketS;
  const int64_t n = std::min<int64_t>((seconds + kBucketS - 1) / kBucketS, (int64_t)kBuckets - 1);
  for (int64_t e = now_epoch - n + 1; e <= now_epoch; ++e) {
    if (e < 0) continue;
    const Bucket& b = ring_[(size_t)(e % (int64_t)kBuckets)];
    if (b.epoch.load(std::memory_order_acquire) != e) continue;
    v.good += b.good.load(std::memory_order_relaxed);
    v.total += b.total.load(std::memory_order_relaxed);
  }
  return v;
}

double SloTracker::burn_rate(int64_t seconds, int64_t now_s) const {
  const WindowView v = window(seconds, now_s);
  const double budget = 1.0 - objective_;
  return budget > 0 ? (1.0 - v.attainment()) / budget : 0.0;
}

}  // namespace serval::server
