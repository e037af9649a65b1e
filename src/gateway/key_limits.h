// Virtual keys at run time: the registry (SHA-256 -> key state) and each key's
// limits: requests per minute and tokens per minute as token buckets, requests
// in parallel, and the budget (checked against the ledger's spend).
//
// TPM is charged after the answer, with the tokens it used (a request is
// admitted while the bucket is positive, as LiteLLM and OpenAI do), so a big
// answer can drive the bucket negative and the next requests wait.
//
// Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gateway/gateway_config.h"
#include "gateway/upstream_client.h"

namespace serval::gateway {

class TokenBucket {
 public:
  TokenBucket() = default;
  TokenBucket(double per_minute, Clock::time_point now) : cap_(per_minute), rate_(per_minute / 60.0), level_(per_minute), last_(now) {}
  bool unlimited() const { return cap_ <= 0; }
  // Takes n when at least `need` is there; else false and the seconds until it will be.
  bool take(double n, double need, Clock::time_point now, double* wait_s);
  void charge(double n, Clock::time_point now);  // may go negative
  double level(Clock::time_point now);

 private:
  void refill(Clock::time_point now);
  double cap_ = 0, rate_ = 0, level_ = 0;
  Clock::time_point last_{};
};

struct KeyState {
  KeyConfig cfg;
  bool from_config = false;
  std::mutex mu;
  TokenBucket rpm, tpm;
  int parallel = 0;
};

struct Admission {
  int status = 0;            // 0: admitted; else 429
  std::string message;
  std::string code;          // OpenAI-style error code
  double retry_after_s = 0;
};

// Checks and takes the key's request limits (not the budget: the caller knows the spend).
Admission admit_key(KeyState& k, Clock::time_point now);
// The request ended: frees its parallel slot and charges its tokens to TPM.
void finish_key(KeyState& k, int64_t tokens, Clock::time_point now);

class KeyRegistry {
 public:
  // Replaces a key of the same name.
  void put(const KeyConfig& cfg, bool from_config);
  bool remove(const std::string& name);
  std::shared_ptr<KeyState> find_by_hash(const std::string& sha256) const;
  std::shared_ptr<KeyState> find_by_name(const std::string& name) const;
  std::vector<std::shared_ptr<KeyState>> all() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<KeyState>> by_hash_;
};

}  // namespace serval::gateway
