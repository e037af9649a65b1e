#include "gateway/key_limits.h"

#include <algorithm>
#include <cmath>

namespace serval::gateway {

void TokenBucket::refill(Clock::time_point now) {
  const double dt = std::chrono::duration<double>(now - last_).count();
  if (dt > 0) {
    level_ = std::min(cap_, level_ + dt * rate_);
    last_ = now;
  }
}

bool TokenBucket::take(double n, double need, Clock::time_point now, double* wait_s) {
  if (unlimited()) return true;
  refill(now);
  if (level_ >= need) {
    level_ -= n;
    return true;
  }
  *wait_s = (need - level_) / rate_;
  return false;
}

void TokenBucket::charge(double n, Clock::time_point now) {
  if (unlimited()) return;
  refill(now);
  level_ -= n;
}

double TokenBucket::level(Clock::time_point now) {
  refill(now);
  return level_;
}

Admission admit_key(KeyState& k, Clock::time_point now) {
  std::lock_guard<std::mutex> lk(k.mu);
  Admission a;
  if (k.cfg.max_parallel > 0 && k.parallel >= k.cfg.max_parallel) {
    a.status = 429;
    a.code = "max_parallel_requests";
    a.message = "key '" + k.cfg.name + "' has " + std::to_string(k.parallel) + " requests in flight (max_parallel " +
                std::to_string(k.cfg.max_parallel) + ")";
    a.retry_after_s = 1;
    return a;
  }
  double wait = 0;
  // TPM first (it takes nothing now), so a refused request does not use up RPM.
  if (!k.tpm.unlimited() && k.tpm.level(now) <= 0) {
    a.status = 429;
    a.code = "rate_limit_tpm";
    a.message = "key '" + k.cfg.name + "' is over its tokens-per-minute limit (tpm " + std::to_string((int64_t)k.cfg.tpm) + ")";
    a.retry_after_s = (1e-9 - k.tpm.level(now)) / (k.cfg.tpm / 60.0);
    return a;
  }
  if (!k.rpm.take(1, 1, now, &wait)) {
    a.status = 429;
    a.code = "rate_limit_rpm";
    a.message = "key '" + k.cfg.name + "' is over its requests-per-minute limit (rpm " + std::to_string((int64_t)k.cfg.rpm) + ")";
    a.retry_after_s = wait;
    return a;
  }
  ++k.parallel;
  return a;
}

void finish_key(KeyState& k, int64_t tokens, Clock::time_point now) {
  std::lock_guard<std::mutex> lk(k.mu);
  k.parallel = std::max(0, k.parallel - 1);
  k.tpm.charge((double)tokens, now);
}

void KeyRegistry::put(const KeyConfig& cfg, bool from_config) {
  auto s = std::make_shared<KeyState>();
  s->cfg = cfg;
  s->from_config = from_config;
  const auto now = Clock::now();
  s->rpm = TokenBucket(cfg.rpm, now);
  s->tpm = TokenBucket(cfg.tpm, now);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = by_hash_.begin(); it != by_hash_.end();) {
    if (it->second->cfg.name == cfg.name) it = by_hash_.erase(it);
    else ++it;
  }
  by_hash_[cfg.sha256] = std::move(s);
}

bool KeyRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = by_hash_.begin(); it != by_hash_.end(); ++it) {
    if (it->second->cfg.name == name) {
      by_hash_.erase(it);
      return true;
    }
  }
  return false;
}

std::shared_ptr<KeyState> KeyRegistry::find_by_hash(const std::string& sha256) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_hash_.find(sha256);
  return it == by_hash_.end() ? nullptr : it->second;
}

std::shared_ptr<KeyState> KeyRegistry::find_by_name(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [h, s] : by_hash_)
    if (s->cfg.name == name) return s;
  return nullptr;
}

std::vector<std::shared_ptr<KeyState>> KeyRegistry::all() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<KeyState>> out;
  for (const auto& [h, s] : by_hash_) out.push_back(s);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->cfg.name < b->cfg.name; });
  return out;
}

}  // namespace serval::gateway
