#include "gateway/router.h"

#include <algorithm>
#include <limits>

namespace serval::gateway {

namespace {
Clock::duration secs(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

Replica::Replica(UpstreamUrl url, size_t max_tree_chunks, BreakerConfig breaker)
    : pool_(std::move(url)), prefix_(max_tree_chunks), bc_(breaker), open_period_s_(breaker.open_s) {}

BreakerState Replica::breaker_state(Clock::time_point now) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ == BreakerState::open && now >= open_until_) return BreakerState::half_open;
  return state_;
}

bool Replica::can_admit(Clock::time_point now) const {
  if (!healthy_.load()) return false;
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ == BreakerState::closed) return true;
  if (state_ == BreakerState::open && now < open_until_) return false;
  return !trial_inflight_;
}

bool Replica::admit(Clock::time_point now) {
  if (!healthy_.load()) return false;
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ == BreakerState::closed) return true;
  if (state_ == BreakerState::open) {
    if (now < open_until_) return false;
    state_ = BreakerState::half_open;
  }
  if (trial_inflight_) return false;
  trial_inflight_ = true;
  return true;
}

void Replica::on_success() {
  std::lock_guard<std::mutex> lk(mu_);
  consecutive_failures_ = 0;
  if (state_ != BreakerState::closed) {
    state_ = BreakerState::closed;
    open_period_s_ = bc_.open_s;
  }
  trial_inflight_ = false;
}

bool Replica::on_failure(Clock::time_point now) {
  std::lock_guard<std::mutex> lk(mu_);
  ++consecutive_failures_;
  trial_inflight_ = false;
  if (state_ == BreakerState::half_open || (state_ == BreakerState::open && now >= open_until_)) {
    open_period_s_ = std::min(bc_.max_open_s, open_period_s_ * 2);
    state_ = BreakerState::open;
    open_until_ = now + secs(open_period_s_);
    return true;
  }
  if (state_ == BreakerState::closed && consecutive_failures_ >= bc_.failures) {
    state_ = BreakerState::open;
    open_period_s_ = bc_.open_s;
    open_until_ = now + secs(open_period_s_);
    return true;
  }
  return false;
}

void Replica::on_health(bool ok, Clock::time_point now) {
  const bool was = healthy_.exchange(ok);
  if (!ok) {
    if (was) pool_.clear();  // its idle connections are dead too
    return;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ != BreakerState::closed && now >= open_until_ && !trial_inflight_) {
    state_ = BreakerState::closed;
    consecutive_failures_ = 0;
    open_period_s_ = bc_.open_s;
  }
}

double Replica::load() const { return std::max((double)inflight.load(), scraped_load_.load()); }

void Replica::set_scraped(double running, double waiting, double kv_usage) {
  scraped_load_.store(running + waiting);
  kv_usage_.store(kv_usage);
}

RouteChoice choose_replica(const std::vector<Replica*>& replicas, const std::vector<const Replica*>& exclude,
                           const std::vector<uint64_t>& prompt_hashes, const RoutingConfig& cfg,
                           std::atomic<uint64_t>& rr, Clock::time_point now) {
  RouteChoice out;
  std::vector<int> cand;
  for (int i = 0; i < (int)replicas.size(); ++i)
    if (replicas[i]->can_admit(now) && std::find(exclude.begin(), exclude.end(), replicas[i]) == exclude.end()) cand.push_back(i);
  if (cand.empty()) {
    for (int i = 0; i < (int)replicas.size(); ++i)
      if (replicas[i]->can_admit(now)) cand.push_back(i);
    if (cand.empty()) return out;
  }
  auto least_loaded = [&] {
    int best = cand[0];
    double bl = replicas[best]->load();
    // Ties go round-robin, so an idle pool still spreads its requests.
    const size_t start = (size_t)(rr.fetch_add(1) % cand.size());
    for (size_t k = 0; k < cand.size(); ++k) {
      const int i = cand[(start + k) % cand.size()];
      const double l = replicas[i]->load();
      if (k == 0 || l < bl) {
        best = i;
        bl = l;
      }
    }
    return best;
  };
  switch (cfg.policy) {
    case Policy::round_robin:
      out.index = cand[(size_t)(rr.fetch_add(1) % cand.size())];
      out.reason = "round_robin";
      break;
    case Policy::least_loaded:
      out.index = least_loaded();
      out.reason = "least_loaded";
      break;
    case Policy::cache_aware: {
      double lo = std::numeric_limits<double>::max(), hi = 0;
      for (int i : cand) {
        lo = std::min(lo, replicas[i]->load());
        hi = std::max(hi, replicas[i]->load());
      }
      // Load-balance guard: a badly imbalanced pool is evened out first.
      if (hi - lo > cfg.balance_abs_threshold && hi > lo * cfg.balance_rel_threshold) {
        out.index = least_loaded();
        out.reason = "balance";
        break;
      }
      size_t best_match = 0;
      int best = -1;
      for (int i : cand) {
        const size_t m = prompt_hashes.empty() ? 0 : replicas[i]->prefix().match(prompt_hashes);
        if (m > best_match || (m == best_match && best >= 0 && m > 0 && replicas[i]->load() < replicas[best]->load())) {
          best_match = m;
          best = i;
        }
      }
      if (best >= 0 && !prompt_hashes.empty() &&
          (double)best_match / (double)prompt_hashes.size() >= cfg.cache_threshold) {
        out.index = best;
        out.reason = "prefix";
      } else {
        out.index = least_loaded();
        out.reason = "least_loaded";
      }
      break;
    }
  }
  if (out.index >= 0 && !prompt_hashes.empty()) out.matched_chunks = replicas[out.index]->prefix().match(prompt_hashes);
  return out;
}

}  // namespace serval::gateway
