// Replicas and the routing decision.
//
// A Replica is one upstream URL of a model's pool: its connection pool, its
// approximate prefix index, its load (the gateway's own in-flight count and,
// scraped from its /metrics about once a second, running/waiting/KV usage),
// its health (active checks on /ready) and its circuit breaker:
//
//   closed --N consecutive failures--> open --open_s passed--> half-open
//   half-open: one trial request (or a passing health check) --ok--> closed
//                                                            --fail--> open (period doubles, up to max_open_s)
//
// Failures are connection errors, timeouts and 5xx answers (passive outlier
// detection: consecutive-5xx ejection, as Envoy does it). choose() picks a
// replica under a policy; it is a pure function of the replicas' state.
//
// Thread-safe: any worker may route, record results, and the health thread
// updates health and load at the same time.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gateway/gateway_config.h"
#include "gateway/prefix_index.h"
#include "gateway/upstream_client.h"

namespace serval::gateway {

enum class BreakerState { closed = 0, open = 1, half_open = 2 };

struct BreakerConfig {
  int failures = 3;
  double open_s = 5;
  double max_open_s = 60;
};

class Replica {
 public:
  Replica(UpstreamUrl url, size_t max_tree_chunks, BreakerConfig breaker);

  const std::string& url() const { return pool_.url().url; }
  ConnectionPool& pool() { return pool_; }
  PrefixIndex& prefix() { return prefix_; }

  // Routable now: healthy and the breaker lets a request through (no side effect).
  bool can_admit(Clock::time_point now) const;
  // Claims the right to send: in half-open, the one trial request. False when not allowed.
  bool admit(Clock::time_point now);
  void on_success();
  // True when this failure opened the breaker (from closed or half-open).
  bool on_failure(Clock::time_point now);
  // An active health check's outcome. A pass while open past its period is a
  // successful probe: the breaker closes.
  void on_health(bool ok, Clock::time_point now);
  BreakerState breaker_state(Clock::time_point now) const;
  bool healthy() const { return healthy_.load(); }

  // Load as routing sees it: max(in flight from this gateway, running + waiting scraped).
  double load() const;
  void set_scraped(double running, double waiting, double kv_usage);
  double kv_usage() const { return kv_usage_.load(); }

  std::atomic<int> inflight{0};

 private:
  ConnectionPool pool_;
  PrefixIndex prefix_;
  BreakerConfig bc_;
  std::atomic<bool> healthy_{true};
  std::atomic<double> scraped_load_{0}, kv_usage_{0};
  mutable std::mutex mu_;
  BreakerState state_ = BreakerState::closed;
  int consecutive_failures_ = 0;
  double open_period_s_ = 0;
  Clock::time_point open_until_{};
  bool trial_inflight_ = false;
};

struct RoutingConfig {
  Policy policy = Policy::cache_aware;
  double cache_threshold = 0.5;
  int balance_abs_threshold = 8;
  double balance_rel_threshold = 1.5;
};

struct RouteChoice {
  int index = -1;            // into the replica list; -1: none routable
  std::string reason;        // "prefix", "least_loaded", "balance", "round_robin", "any"
  size_t matched_chunks = 0; // prefix chunks the chosen replica already holds
};

// Picks among `replicas` those routable now and not in `exclude` (replicas
// already tried by this request); when every routable one was tried, tried ones
// are allowed again. `rr` is the pool's round-robin counter.
RouteChoice choose_replica(const std::vector<Replica*>& replicas, const std::vector<const Replica*>& exclude,
                           const std::vector<uint64_t>& prompt_hashes, const RoutingConfig& cfg,
                           std::atomic<uint64_t>& rr, Clock::time_point now);

}  // namespace serval::gateway
