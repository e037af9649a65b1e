// The gateway's SQLite store: virtual keys created at run time (only their
// SHA-256 is stored) and the usage ledger (per key, model and UTC day:
// requests, prompt and completion tokens, spend).
//
// Exactly once: each proxied request is recorded under its gateway request id
// (INSERT OR IGNORE into `requests`); the per-day totals grow only when that
// insert happened, in the same transaction. Retries and fallbacks inside the
// gateway never produce a second record: only the attempt whose answer went
// to the client is recorded.
//
// Writes go through a writer thread that commits every ~50 ms (one
// transaction), so the request path never waits on the disk; the in-memory
// totals that budgets read are updated at once. close() (and the destructor)
// commits what is pending. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "gateway/gateway_config.h"

struct sqlite3;

namespace serval::gateway {

struct UsageRecord {
  std::string request_id;
  std::string key;     // key name ("" without a key)
  std::string model;   // the model that answered (after fallback)
  std::string day;     // UTC "YYYY-MM-DD"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double spend = 0;
};

struct UsageRow {
  std::string key, model, day;
  int64_t requests = 0, prompt_tokens = 0, completion_tokens = 0;
  double spend = 0;
};

class Ledger {
 public:
  // path "" or ":memory:": an in-memory database (nothing survives a restart).
  static Expected<std::unique_ptr<Ledger>> open(const std::string& path);
  ~Ledger();

  // Keys created at run time.
  Status put_key(const KeyConfig& k);
  Status delete_key(const std::string& name);
  std::vector<KeyConfig> keys() const;

  void record(const UsageRecord& r);
  // Spend of `key` in the period that contains `day` (UTC "YYYY-MM-DD").
  double spend(const std::string& key, BudgetPeriod period, const std::string& day) const;
  // Rows with key == `key` (all keys when empty) and from <= day <= to (inclusive; "" = open).
  std::vector<UsageRow> usage(const std::string& key, const std::string& from, const std::string& to) const;
  // Commits everything pending and stops the writer.
  void close();

 private:
  Ledger() = default;
  void writer_loop();
  Status exec(const std::string& sql);

  sqlite3* db_ = nullptr;
  mutable std::mutex mu_;  // the in-memory totals, the queue and db_ (for keys)
  std::condition_variable cv_;
  std::vector<UsageRecord> pending_;
  bool stop_ = false;
  std::thread writer_;
  std::map<std::tuple<std::string, std::string, std::string>, UsageRow> totals_;  // (key, model, day)
};

// UTC day of a system clock time ("YYYY-MM-DD").
std::string utc_day(std::chrono::system_clock::time_point t);

}  // namespace serval::gateway
