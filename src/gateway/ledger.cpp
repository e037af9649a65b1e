#include "gateway/ledger.h"

#include <sqlite3.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace serval::gateway {

namespace {

struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt(sqlite3* db, const char* sql) { sqlite3_prepare_v2(db, sql, -1, &s, nullptr); }
  ~Stmt() { sqlite3_finalize(s); }
  void text(int i, const std::string& v) { sqlite3_bind_text(s, i, v.data(), (int)v.size(), SQLITE_TRANSIENT); }
  void i64(int i, int64_t v) { sqlite3_bind_int64(s, i, v); }
  void dbl(int i, double v) { sqlite3_bind_double(s, i, v); }
  std::string col_text(int i) const {
    auto p = sqlite3_column_text(s, i);
    return p ? std::string(reinterpret_cast<const char*>(p)) : std::string();
  }
};

const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS keys (
  name TEXT PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
  id TEXT PRIMARY KEY, key TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, spend REAL NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
  key TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
  requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, spend REAL NOT NULL,
  PRIMARY KEY (key, model, day));
)sql";

nlohmann::json key_to_json(const KeyConfig& k) {
  return {{"rpm", k.rpm}, {"tpm", k.tpm}, {"max_parallel", k.max_parallel}, {"models", k.models},
          {"budget", k.budget},
          {"budget_period", k.budget_period == BudgetPeriod::day ? "day" : k.budget_period == BudgetPeriod::month ? "month" : "total"}};
}

}  // namespace

std::string utc_day(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

Status Ledger::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return io_error("gateway ledger: " + m);
  }
  return {};
}

Expected<std::unique_ptr<Ledger>> Ledger::open(const std::string& path) {
  std::unique_ptr<Ledger> l(new Ledger());
  const std::string p = path.empty() ? ":memory:" : path;
  if (sqlite3_open_v2(p.c_str(), &l->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK) {
    std::string m = l->db_ ? sqlite3_errmsg(l->db_) : "out of memory";
    return io_error("cannot open the gateway database '" + p + "': " + m);
  }
  sqlite3_busy_timeout(l->db_, 5000);
  if (p != ":memory:") SERVAL_RETURN_IF_ERROR(l->exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"));
  if (auto st = l->exec(kSchema); !st.ok()) return st.with_context("'" + p + "' is not a serval gateway database");
  {
    Stmt q(l->db_, "SELECT key, model, day, requests, prompt_tokens, completion_tokens, spend FROM usage");
    while (sqlite3_step(q.s) == SQLITE_ROW) {
      UsageRow r{q.col_text(0), q.col_text(1), q.col_text(2), sqlite3_column_int64(q.s, 3),
                 sqlite3_column_int64(q.s, 4), sqlite3_column_int64(q.s, 5), sqlite3_column_double(q.s, 6)};
      l->totals_[{r.key, r.model, r.day}] = r;
    }
  }
  l->writer_ = std::thread([lp = l.get()] { lp->writer_loop(); });
  return l;
}

Ledger::~Ledger() {
  close();
  if (db_) sqlite3_close(db_);
}

void Ledger::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void Ledger::writer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return stop_; });
    if (pending_.empty()) {
      if (stop_) return;
      continue;
    }
    std::vector<UsageRecord> batch;
    batch.swap(pending_);
    lk.unlock();
    exec("BEGIN");
    {
      // Both statements take the record as ?1..?7 (id, key, model, day, prompt, completion, spend).
      Stmt ins(db_, "INSERT OR IGNORE INTO requests VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
      Stmt up(db_,
              "INSERT INTO usage VALUES (?2, ?3, ?4, 1, ?5, ?6, ?7) ON CONFLICT (key, model, day) DO UPDATE SET "
              "requests = requests + 1, prompt_tokens = prompt_tokens + ?5, completion_tokens = completion_tokens + ?6, "
              "spend = spend + ?7");
      auto bind = [](Stmt& st, const UsageRecord& r) {
        sqlite3_reset(st.s);
        st.text(1, r.request_id);
        st.text(2, r.key);
        st.text(3, r.model);
        st.text(4, r.day);
        st.i64(5, r.prompt_tokens);
        st.i64(6, r.completion_tokens);
        st.dbl(7, r.spend);
      };
      for (const auto& r : batch) {
        bind(ins, r);
        if (sqlite3_step(ins.s) != SQLITE_DONE || sqlite3_changes(db_) == 0) continue;  // seen before: not again
        bind(up, r);
        sqlite3_step(up.s);
      }
    }
    if (!exec("COMMIT").ok()) exec("ROLLBACK");
    lk.lock();
  }
}

void Ledger::record(const UsageRecord& r) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& t = totals_[{r.key, r.model, r.day}];
  if (t.key.empty() && t.model.empty()) {
    t.key = r.key;
    t.model = r.model;
    t.day = r.day;
  }
  t.requests += 1;
  t.prompt_tokens += r.prompt_tokens;
  t.completion_tokens += r.completion_tokens;
  t.spend += r.spend;
  pending_.push_back(r);
}

double Ledger::spend(const std::string& key, BudgetPeriod period, const std::string& day) const {
  std::lock_guard<std::mutex> lk(mu_);
  double s = 0;
  for (auto it = totals_.lower_bound({key, "", ""}); it != totals_.end() && std::get<0>(it->first) == key; ++it) {
    const std::string& d = std::get<2>(it->first);
    if (period == BudgetPeriod::day && d != day) continue;
    if (period == BudgetPeriod::month && d.compare(0, 7, day, 0, 7) != 0) continue;
    s += it->second.spend;
  }
  return s;
}

std::vector<UsageRow> Ledger::usage(const std::string& key, const std::string& from, const std::string& to) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<UsageRow> out;
  for (const auto& [k, r] : totals_) {
    if (!key.empty() && r.key != key) continue;
    if (!from.empty() && r.day < from) continue;
    if (!to.empty() && r.day > to) continue;
    out.push_back(r);
  }
  return out;
}

Status Ledger::put_key(const KeyConfig& k) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "INSERT INTO keys VALUES (?1, ?2, ?3)");
  s.text(1, k.name);
  s.text(2, k.sha256);
  s.text(3, key_to_json(k).dump());
  if (sqlite3_step(s.s) != SQLITE_DONE) return invalid_argument(std::string("cannot store key '") + k.name + "': " + sqlite3_errmsg(db_));
  return {};
}

Status Ledger::delete_key(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "DELETE FROM keys WHERE name = ?1");
  s.text(1, name);
  sqlite3_step(s.s);
  if (sqlite3_changes(db_) == 0) return not_found("no key named '" + name + "'");
  return {};
}

std::vector<KeyConfig> Ledger::keys() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<KeyConfig> out;
  Stmt s(db_, "SELECT name, sha256, config FROM keys ORDER BY name");
  while (sqlite3_step(s.s) == SQLITE_ROW) {
    KeyConfig k;
    k.name = s.col_text(0);
    k.sha256 = s.col_text(1);
    auto j = nlohmann::json::parse(s.col_text(2), nullptr, false);
    try {
      if (!j.is_object()) throw std::runtime_error("not a JSON object");
      k.rpm = j.value("rpm", 0.0);
      k.tpm = j.value("tpm", 0.0);
      k.max_parallel = j.value("max_parallel", 0);
      k.models = j.value("models", std::vector<std::string>{});
      k.budget = j.value("budget", 0.0);
      const std::string p = j.value("budget_period", "month");
      k.budget_period = p == "day" ? BudgetPeriod::day : p == "total" ? BudgetPeriod::total : BudgetPeriod::month;
    } catch (const std::exception& e) {
      // A damaged row must not take the gateway down, nor become a key without limits.
      std::fprintf(stderr, "serval gateway: key '%s' in the database is damaged (%s): ignored\n", k.name.c_str(), e.what());
      continue;
    }
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace serval::gateway
