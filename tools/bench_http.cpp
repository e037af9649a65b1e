// serval bench http: load generator for an OpenAI-compatible server (see bench_http.h).
//
// Threads: the main thread parses flags, resolves the model and calibrates the
// prompt size, then starts min(C, N) client threads per run. Each client owns an
// io_context and one keep-alive connection and runs Beast's async operations to
// completion one at a time (so every read and write is bounded by the request's
// deadline). Clients share only an atomic request counter and, at the end, a
// mutex-protected merge of their measurements.
#include "bench_http.h"
#include "common/splitmix.h"
#include "plan/queue_model.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "cli_util.h"

namespace serval::cli {
namespace bench_http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr int kMaxConcurrency = 1024;
constexpr size_t kMaxErrorBody = 64 << 10;     // bytes of a non-200 body kept
constexpr size_t kMaxSmallBody = 8 << 20;      // GET /v1/models, POST /tokenize
constexpr double kDefaultRetryAfterS = 1.0;    // 429 without a usable Retry-After

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// ---- prompts ----

// Short common English words: most are one token in any BPE/SPM vocabulary.
constexpr const char* kWords[] = {
    "the",  "of",    "and",  "to",   "in",   "is",    "it",   "you",   "that",  "he",    "was",  "for",  "on",
    "are",  "with",  "as",   "his",  "they", "at",    "be",   "this",  "have",  "from",  "or",   "one",  "had",
    "by",   "word",  "but",  "not",  "what", "all",   "were", "we",    "when",  "your",  "can",  "said", "there",
    "use",  "an",    "each", "which", "she", "do",    "how",  "their", "if",    "will",  "up",   "other", "about",
    "out",  "many",  "then", "them", "these", "so",   "some", "her",   "would", "make",  "like", "him",  "into",
    "time", "has",   "look", "two",  "more", "write", "go",   "see",   "number", "no",   "way",  "could", "people",
    "my",   "than",  "first", "water", "been", "call", "who", "oil",   "its",   "now",   "find", "long", "down",
    "day",  "did",   "get",  "come", "made", "may",   "part", "sun",   "tree",  "little", "dog", "cat",  "happy"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

void append_words(std::string& out, uint64_t seed, int64_t n) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    if (!out.empty()) out.push_back(' ');
    out += kWords[splitmix64_next(s) % kNumWords];
  }
}

std::string prompt_text(const Options& opt, const Plan& plan, int64_t index) {
  std::string text;
  text.reserve((size_t)plan.prompt_words * 5);
  append_words(text, opt.seed * 0x2545f4914f6cdd1dull + 0x51, plan.prefix_words);
  uint64_t s = (opt.seed + opt.prompt_salt * 0xd1b54a32d192ed03ull) ^ ((uint64_t)index * 0x9e3779b97f4a7c15ull + 0x1234567);
  append_words(text, splitmix64_next(s), plan.prompt_words - plan.prefix_words);
  return text;
}

// ---- HTTP helpers ----

std::string path_for(const Plan& plan, Endpoint ep) {
  return plan.target.base + (ep == Endpoint::chat ? "/v1/chat/completions" : "/v1/completions");
}

std::string url_of(const Target& t) { return "http://" + t.host_header + t.base; }

// Retry-After: delay-seconds or an HTTP-date; <0 when absent or unparseable.
double parse_retry_after(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  if (v.empty()) return -1;
  if (std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (v.size() > 9) return 1e9;
    return (double)std::stoll(std::string(v));
  }
  std::tm tm{};
  const std::string s(v);
  const char* end = strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end || *end) return -1;
  const double d = std::difftime(timegm(&tm), std::time(nullptr));
  return d < 0 ? 0 : d;
}

std::string excerpt(std::string_view s, size_t n = 200) {
  std::string out;
  for (char c : s.substr(0, n)) out.push_back((unsigned char)c < 0x20 ? ' ' : c);
  if (s.size() > n) out += "...";
  return out;
}

// The outcome of one request attempt.
struct Attempt {
  enum class Kind { ok, status, connection, timeout, stream } kind = Kind::connection;
  int status = 0;
  double retry_after_s = -1;
  double ttft_s = -1, e2e_s = 0;
  std::vector<double> itl_s;
  int64_t content_chunks = 0;
  int64_t completion_tokens = -1, prompt_tokens = -1;  // from usage; -1 when absent
  std::string error;
};

// One connection, used by one thread.
class Client {
 public:
  Client(const Target& target, const std::vector<tcp::endpoint>& eps, const std::string& api_key)
      : target_(target), eps_(eps), auth_(api_key.empty() ? "" : "Bearer " + api_key) {}

  // Opens the connection now (best effort; a later request retries).
  void preconnect(double timeout_s) {
    if (!stream_) connect(Clock::now() + to_duration(timeout_s));
  }

  // One streaming POST; the whole attempt is bounded by timeout_s.
  Attempt stream(const std::string& path, const std::string& body, Endpoint ep, double timeout_s);

  // A small non-streaming request (GET /v1/models, POST /tokenize); status and body.
  Expected<std::pair<int, std::string>> fetch(http::verb verb, const std::string& path, const std::string& body,
                                              double timeout_s);

 private:
  // Runs one async operation on this thread's io_context to completion.
  template <typename Start>
  beast::error_code wait(Start&& start) {
    beast::error_code result = net::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run();
    return result;
  }

  beast::error_code connect(Clock::time_point deadline) {
    stream_.emplace(ioc_);
    buf_.clear();
    stream_->expires_at(deadline);
    auto ec = wait([&](auto h) { stream_->async_connect(eps_, std::move(h)); });
    if (ec) {
      close();
      return ec;
    }
    beast::error_code ignored;
    stream_->socket().set_option(tcp::no_delay(true), ignored);
    return ec;
  }

  void close() {
    if (stream_) {
      beast::error_code ignored;
      stream_->socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_->socket().close(ignored);
      stream_.reset();
    }
    buf_.clear();
  }

  template <typename Body>
  http::request<Body> make_request(http::verb verb, const std::string& path) const {
    http::request<Body> req{verb, path, 11};
    req.set(http::field::host, target_.host_header);
    req.set(http::field::user_agent, "serval-bench");
    if (!auth_.empty()) req.set(http::field::authorization, auth_);
    req.keep_alive(true);
    return req;
  }

  static Attempt failure(Attempt::Kind kind, std::string msg) {
    Attempt a;
    a.kind = kind;
    a.error = std::move(msg);
    return a;
  }
  static Attempt io_failure(const beast::error_code& ec, const std::string& what) {
    if (ec == beast::error::timeout) return failure(Attempt::Kind::timeout, what + ": timed out");
    return failure(Attempt::Kind::connection, what + ": " + ec.message());
  }

  const Target& target_;
  const std::vector<tcp::endpoint>& eps_;
  std::string auth_;
  net::io_context ioc_{1};
  std::optional<beast::tcp_stream> stream_;
  beast::flat_buffer buf_;
};

Attempt Client::stream(const std::string& path, const std::string& body, Endpoint ep, double timeout_s) {
  const auto deadline = Clock::now() + to_duration(timeout_s);
  for (int tries = 0;; ++tries) {
    // An idle keep-alive (or preconnected) connection may have been closed by
    // the server; that shows as an error before any response byte: reconnect once.
    const bool may_retry = stream_ && tries == 0;
    if (!stream_) {
      if (auto ec = connect(deadline)) return io_failure(ec, "connect to " + url_of(target_));
    }
    auto req = make_request<http::string_body>(http::verb::post, path);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.body() = body;
    req.prepare_payload();
    stream_->expires_at(deadline);
    const auto t_send = Clock::now();
    if (auto ec = wait([&](auto h) { http::async_write(*stream_, req, std::move(h)); })) {
      close();
      if (may_retry && ec != beast::error::timeout) continue;
      return io_failure(ec, "send");
    }
    http::response_parser<http::buffer_body> p;
    p.header_limit(64 << 10);
    // Unlimited (the SSE buffer is bounded instead). Not boost::none: Beast 1.74
    // compares a Content-Length against an empty optional and rejects every body.
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (auto ec = wait([&](auto h) { http::async_read_header(*stream_, buf_, p, std::move(h)); })) {
      const bool nothing = !p.got_some();
      close();
      if (may_retry && nothing && ec != beast::error::timeout) continue;
      return io_failure(ec, "read response header");
    }

    Attempt a;
    a.status = (int)p.get().result_int();
    const bool ok_status = a.status == 200;
    if (a.status == 429) {
      const auto v = p.get()[http::field::retry_after];
      a.retry_after_s = parse_retry_after(std::string_view(v.data(), v.size()));
    }
    const std::string content_type(p.get()[http::field::content_type]);

    SseParser sse;
    std::string err_body;
    bool done = false, bad = false, keep = true;
    Clock::time_point now = t_send, last_chunk = t_send, t_done = t_send;
    auto on_event = [&](std::string_view data) {
      if (done || bad) return;
      if (data == "[DONE]") {
        done = true;
        t_done = now;
        return;
      }
      json j = json::parse(data, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        bad = true;
        a.error = "malformed JSON in SSE event: " + excerpt(data);
        return;
      }
      if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
        bad = true;
        a.error = "error event in stream: " + excerpt(e->dump());
        return;
      }
      if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
        const json& ch = (*c)[0];
        const json* text = nullptr;
        if (ep == Endpoint::completions) {
          if (auto t = ch.find("text"); t != ch.end()) text = &*t;
        } else if (auto d = ch.find("delta"); d != ch.end() && d->is_object()) {
          if (auto t = d->find("content"); t != d->end()) text = &*t;
        }
        if (text && text->is_string() && !text->get_ref<const std::string&>().empty()) {
          if (a.content_chunks == 0) a.ttft_s = seconds(now - t_send);
          else a.itl_s.push_back(seconds(now - last_chunk));
          last_chunk = now;
          ++a.content_chunks;
        }
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        if (auto ct = u->find("completion_tokens"); ct != u->end() && ct->is_number_integer())
          a.completion_tokens = ct->get<int64_t>();
        if (auto pt = u->find("prompt_tokens"); pt != u->end() && pt->is_number_integer())
          a.prompt_tokens = pt->get<int64_t>();
      }
    };

    beast::error_code ec;
    char chunk[16 << 10];
    while (!p.is_done()) {
      // After [DONE] only the end of the body is missing: do not wait long for it.
      if (done) stream_->expires_at(std::min(deadline, t_done + std::chrono::seconds(1)));
      p.get().body().data = chunk;
      p.get().body().size = sizeof chunk;
      ec = wait([&](auto h) { http::async_read_some(*stream_, buf_, p, std::move(h)); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) break;
      const size_t n = sizeof chunk - p.get().body().size;
      if (n == 0) continue;
      now = Clock::now();
      if (ok_status) {
        if (!sse.feed(std::string_view(chunk, n), on_event)) {
          bad = true;
          a.error = "SSE event larger than 16 MiB";
        }
        if (bad) break;
      } else {
        err_body.append(chunk, std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, err_body.size())));
        if (err_body.size() >= kMaxErrorBody) break;  // do not drain a huge error body
      }
    }
    if (!p.is_done() || !p.keep_alive() || bad) keep = false;
    if (!keep) close();

    if (!ok_status) {
      if (ec == beast::error::timeout) return failure(Attempt::Kind::timeout, "reading an error body: timed out");
      a.kind = Attempt::Kind::status;
      a.error = "HTTP " + std::to_string(a.status) + (err_body.empty() ? "" : ": " + excerpt(err_body));
      return a;
    }
    if (bad) {
      a.kind = Attempt::Kind::stream;
      return a;
    }
    if (!done) {
      if (ec == beast::error::timeout) return failure(Attempt::Kind::timeout, "stream: timed out");
      if (ec) return failure(Attempt::Kind::connection, "stream: " + ec.message());
      a.kind = Attempt::Kind::stream;
      a.error = "stream ended without 'data: [DONE]' (Content-Type: " + excerpt(content_type, 60) + ")";
      return a;
    }
    a.kind = Attempt::Kind::ok;
    a.e2e_s = seconds(t_done - t_send);
    return a;
  }
}

Expected<std::pair<int, std::string>> Client::fetch(http::verb verb, const std::string& path, const std::string& body,
                                                    double timeout_s) {
  const auto deadline = Clock::now() + to_duration(timeout_s);
  auto io_err = [&](const beast::error_code& ec, const std::string& what) {
    close();
    return io_error("cannot " + what + " " + url_of(target_) + ": " +
                    (ec == beast::error::timeout ? std::string("timed out") : ec.message()));
  };
  for (int tries = 0;; ++tries) {
    const bool may_retry = stream_ && tries == 0;  // a stale keep-alive connection: reconnect once
    if (!stream_) {
      if (auto ec = connect(deadline)) return io_err(ec, "connect to");
    }
    auto req = make_request<http::string_body>(verb, path);
    if (verb == http::verb::post) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    stream_->expires_at(deadline);
    if (auto ec = wait([&](auto h) { http::async_write(*stream_, req, std::move(h)); })) {
      if (may_retry && ec != beast::error::timeout) {
        close();
        continue;
      }
      return io_err(ec, "send to");
    }
    http::response_parser<http::string_body> p;
    p.header_limit(64 << 10);
    p.body_limit(kMaxSmallBody);
    if (auto ec = wait([&](auto h) { http::async_read(*stream_, buf_, p, std::move(h)); })) {
      if (may_retry && !p.got_some() && ec != beast::error::timeout) {
        close();
        continue;
      }
      return io_err(ec, "read " + path + " from");
    }
    std::pair<int, std::string> out{(int)p.get().result_int(), std::move(p.get().body())};
    if (!p.keep_alive()) close();
    return out;
  }
}

Expected<std::vector<tcp::endpoint>> resolve(const Target& t) {
  net::io_context ioc;
  tcp::resolver r(ioc);
  beast::error_code ec;
  auto res = r.resolve(t.host, t.port, ec);
  if (ec || res.empty())
    return io_error("cannot resolve host '" + t.host + "': " + (ec ? ec.message() : std::string("no address")));
  std::vector<tcp::endpoint> eps;
  for (const auto& e : res) eps.push_back(e.endpoint());
  return eps;
}

// Lets C clients hold a connection each (the soft limit is often 1024).
Status ensure_fd_limit(int concurrency) {
  const rlim_t need = (rlim_t)concurrency + 64;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need) return {};
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
    return invalid_argument("--concurrency " + std::to_string(concurrency) + " needs " + std::to_string(need) +
                            " file descriptors; the limit is " + std::to_string(rl.rlim_max) + " (ulimit -n)");
  rl.rlim_cur = need;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return io_error("cannot raise the open-file limit (ulimit -n)");
  return {};
}

void merge(RunResult& into, RunResult&& from) {
  into.completed += from.completed;
  into.failed += from.failed;
  into.gen_tokens += from.gen_tokens;
  into.prompt_tokens += from.prompt_tokens;
  auto cat = [](std::vector<double>& a, std::vector<double>& b) { a.insert(a.end(), b.begin(), b.end()); };
  cat(into.ttft, from.ttft);
  cat(into.itl, from.itl);
  cat(into.e2e, from.e2e);
  cat(into.tpot, from.tpot);
  for (auto& [k, v] : from.status_errors) into.status_errors[k] += v;
  into.connection_errors += from.connection_errors;
  into.timeouts += from.timeouts;
  into.stream_errors += from.stream_errors;
  into.retries_429 += from.retries_429;
  into.short_generations += from.short_generations;
  into.max_start_lag_s = std::max(into.max_start_lag_s, from.max_start_lag_s);
  if (!from.last_error.empty()) into.last_error = std::move(from.last_error);
}

// Open loop: request i starts at t0 + arrivals[i] (nullptr: closed loop).
struct Schedule {
  const std::vector<double>* arrivals = nullptr;
  Clock::time_point t0;
};

// Sends requests [first, first + count) of the global index space on one
// client, retrying 429s; accumulates into r.

void drive(Client& cl, const Options& opt, const Plan& plan, std::atomic<int64_t>& next, int64_t count,
           int64_t index_base, RunResult& r, const Schedule& sched = {}) {
  const std::string path = path_for(plan, opt.endpoint);
  for (;;) {
    const int64_t i = next++;
    if (i >= count) return;
    const std::string body = request_body(opt, plan, index_base + i);
    double lag = 0;  // open loop: how late after its arrival the request starts
    if (sched.arrivals) {
      const auto due = sched.t0 + to_duration((*sched.arrivals)[(size_t)i]);
      std::this_thread::sleep_until(due);
      lag = std::max(0.0, seconds(Clock::now() - due));
      r.max_start_lag_s = std::max(r.max_start_lag_s, lag);
    }
    for (int tries = 0;; ++tries) {
      Attempt a = cl.stream(path, body, opt.endpoint, opt.timeout_s);
      switch (a.kind) {
        case Attempt::Kind::ok: break;
        case Attempt::Kind::status: ++r.status_errors[a.status]; break;
        case Attempt::Kind::connection: ++r.connection_errors; break;
        case Attempt::Kind::timeout: ++r.timeouts; break;
        case Attempt::Kind::stream: ++r.stream_errors; break;
      }
      if (a.kind == Attempt::Kind::status && a.status == 429 && tries < opt.max_retries) {
        ++r.retries_429;
        const double w = a.retry_after_s >= 0 ? a.retry_after_s : kDefaultRetryAfterS;
        std::this_thread::sleep_for(to_duration(std::min(w, opt.max_retry_wait_s)));
        continue;
      }
      if (a.kind != Attempt::Kind::ok) {
        ++r.failed;
        r.last_error = std::move(a.error);
        break;
      }
      ++r.completed;
      const int64_t gen = a.completion_tokens >= 0 ? a.completion_tokens : a.content_chunks;
      r.gen_tokens += gen;
      r.prompt_tokens += a.prompt_tokens >= 0 ? a.prompt_tokens : opt.prompt_len;
      if (gen != opt.gen_len) ++r.short_generations;
      if (a.ttft_s >= 0) {
        r.ttft.push_back(a.ttft_s + lag);
        if (gen > 1) r.tpot.push_back((a.e2e_s - a.ttft_s) / (double)(gen - 1));
      }
      r.e2e.push_back(a.e2e_s + lag);
      r.itl.insert(r.itl.end(), a.itl_s.begin(), a.itl_s.end());
      break;
    }
  }
}

json pct_or_null(const std::vector<double>& v, double p) {
  return v.empty() ? json(nullptr) : json(percentile(v, p));
}

json to_json(const Options& opt, const Plan& plan, const RunResult& r) {
  json errors = json::object();
  for (const auto& [k, v] : r.status_errors) errors[std::to_string(k)] = v;
  const double w = r.wall_s > 0 ? r.wall_s : 1e-9;
  return {{"url", url_of(plan.target)},
          {"endpoint", opt.endpoint == Endpoint::chat ? "chat" : "completions"},
          {"model", plan.model},
          {"prompt_salt", opt.prompt_salt},
          {"concurrency", r.concurrency},
          {"requests", r.requests},
          {"prompt_len", opt.prompt_len},
          {"gen_len", opt.gen_len},
          {"shared_prefix", opt.shared_prefix},
          {"rate", opt.rate},
          {"max_start_lag_s", r.max_start_lag_s},
          {"timeout_s", opt.timeout_s},
          {"seed", opt.seed},
          {"tokens_per_word", plan.tokens_per_word},
          {"calibrated", plan.calibrated},
          {"prompt_words", plan.prompt_words},
          {"completed", r.completed},
          {"failed", r.failed},
          {"wall_s", r.wall_s},
          {"gen_tokens", r.gen_tokens},
          {"prompt_tokens", r.prompt_tokens},
          {"requests_per_s", (double)r.completed / w},
          {"gen_tok_s", (double)r.gen_tokens / w},
          {"prompt_tok_s", (double)r.prompt_tokens / w},
          {"ttft_mean_s", r.ttft.empty() ? json(nullptr) : json(mean_of(r.ttft))},
          {"ttft_p50_s", pct_or_null(r.ttft, 50)},
          {"ttft_p90_s", pct_or_null(r.ttft, 90)},
          {"ttft_p99_s", pct_or_null(r.ttft, 99)},
          {"itl_mean_s", r.itl.empty() ? json(nullptr) : json(mean_of(r.itl))},
          {"itl_p50_s", pct_or_null(r.itl, 50)},
          {"itl_p90_s", pct_or_null(r.itl, 90)},
          {"itl_p99_s", pct_or_null(r.itl, 99)},
          {"tpot_mean_s", r.tpot.empty() ? json(nullptr) : json(mean_of(r.tpot))},
          {"e2e_mean_s", r.e2e.empty() ? json(nullptr) : json(mean_of(r.e2e))},
          {"e2e_p50_s", pct_or_null(r.e2e, 50)},
          {"e2e_p90_s", pct_or_null(r.e2e, 90)},
          {"e2e_p99_s", pct_or_null(r.e2e, 99)},
          {"errors", errors},
          {"connection_errors", r.connection_errors},
          {"timeouts", r.timeouts},
          {"stream_errors", r.stream_errors},
          {"retries_429", r.retries_429},
          {"short_generations", r.short_generations}};
}

std::string ms_stats(const std::vector<double>& v, bool with_p90 = true) {
  if (v.empty()) return "n/a";
  char b[160];
  if (with_p90)
    std::snprintf(b, sizeof b, "mean %.2f p50 %.2f p90 %.2f p99 %.2f ms", 1e3 * mean_of(v), 1e3 * percentile(v, 50),
                  1e3 * percentile(v, 90), 1e3 * percentile(v, 99));
  else
    std::snprintf(b, sizeof b, "mean %.3f p50 %.3f p99 %.3f s", mean_of(v), percentile(v, 50), percentile(v, 99));
  return b;
}

void print_text(std::FILE* out, const RunResult& r) {
  const double w = r.wall_s > 0 ? r.wall_s : 1e-9;
  std::fprintf(out,
               "concurrency %d: %lld/%lld requests ok in %.2f s | %.2f req/s | gen %.1f tok/s | prompt %.1f tok/s\n",
               r.concurrency, (long long)r.completed, (long long)r.requests, r.wall_s, (double)r.completed / w,
               (double)r.gen_tokens / w, (double)r.prompt_tokens / w);
  std::fprintf(out, "  TTFT %s\n  ITL  %s\n  E2E  %s\n", ms_stats(r.ttft).c_str(), ms_stats(r.itl).c_str(),
               ms_stats(r.e2e, false).c_str());
  std::string errs;
  for (const auto& [k, v] : r.status_errors) errs += " HTTP " + std::to_string(k) + ": " + std::to_string(v) + ",";
  auto add = [&](const char* name, int64_t v) {
    if (v) errs += std::string(" ") + name + ": " + std::to_string(v) + ",";
  };
  add("connection", r.connection_errors);
  add("timeout", r.timeouts);
  add("stream", r.stream_errors);
  if (errs.empty()) errs = " none";
  else errs.pop_back();
  std::fprintf(out, "  errors:%s", errs.c_str());
  if (r.retries_429) std::fprintf(out, " (429 retried %lld times)", (long long)r.retries_429);
  if (r.short_generations)
    std::fprintf(out, " | %lld requests generated != gen-len tokens", (long long)r.short_generations);
  std::fprintf(out, "\n");
  if (r.failed && !r.last_error.empty()) std::fprintf(out, "  last error: %s\n", r.last_error.c_str());
  if (r.max_start_lag_s > 0.05)
    std::fprintf(out, "  open loop: a request started %.2f s after its arrival (every client was busy; raise -c)\n",
                 r.max_start_lag_s);
  std::fflush(out);
}

Expected<std::vector<int>> parse_concurrency(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  auto bad = [&] {
    return invalid_argument("--concurrency: expected a comma-separated list of integers in [1, " +
                            std::to_string(kMaxConcurrency) + "], got '" + excerpt(s, 80) + "'");
  };
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item.size() > 5 || !std::all_of(item.begin(), item.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return bad();
    const int c = std::stoi(item);
    if (c < 1 || c > kMaxConcurrency) return bad();
    out.push_back(c);
  }
  if (out.empty() || (!s.empty() && s.back() == ',')) return bad();
  if (out.size() > 32) return invalid_argument("--concurrency: at most 32 values");
  return out;
}

}  // namespace

// ---- public pieces ----

Expected<Target> parse_url(std::string_view url) {
  const std::string shown = excerpt(url, 100);
  auto bad = [&](const std::string& why) { return invalid_argument("--url '" + shown + "': " + why); };
  if (url.empty()) return invalid_argument("--url: empty (expected http://host[:port])");
  if (url.size() > 2048) return bad("longer than 2048 characters");
  for (char c : url)
    if ((unsigned char)c <= 0x20 || (unsigned char)c >= 0x7f) return bad("contains a space or a non-ASCII/control character");
  auto starts_ci = [&](std::string_view pre) {
    if (url.size() < pre.size()) return false;
    for (size_t i = 0; i < pre.size(); ++i)
      if (std::tolower((unsigned char)url[i]) != pre[i]) return false;
    return true;
  };
  if (starts_ci("https://")) return bad("https is not supported (plain http:// only)");
  if (!starts_ci("http://")) {
    if (url.find("://") != std::string_view::npos) return bad("unsupported scheme (expected http://host[:port])");
    return bad("expected http://host[:port]");
  }
  std::string_view rest = url.substr(7);
  const size_t end = rest.find_first_of("/?#");
  std::string_view auth = rest.substr(0, end);
  std::string_view path = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  if (path.find_first_of("?#") != std::string_view::npos) return bad("a query or fragment is not allowed");
  if (auth.find('@') != std::string_view::npos) return bad("user info (user@host) is not supported; use --api-key");
  if (auth.empty()) return bad("missing host");
  Target t;
  std::string_view after;
  bool v6 = false;
  if (auth.front() == '[') {
    const size_t close = auth.find(']');
    if (close == std::string_view::npos) return bad("unterminated '[' in an IPv6 host");
    std::string_view h = auth.substr(1, close - 1);
    if (h.empty() || h.find(':') == std::string_view::npos ||
        !std::all_of(h.begin(), h.end(), [](char c) { return std::isxdigit((unsigned char)c) || c == ':' || c == '.'; }))
      return bad("bad IPv6 address");
    t.host = h;
    after = auth.substr(close + 1);
    v6 = true;
  } else {
    const size_t colon = auth.find(':');
    std::string_view h = auth.substr(0, colon);
    if (h.empty()) return bad("missing host");
    if (h.size() > 253) return bad("host name longer than 253 characters");
    if (!std::all_of(h.begin(), h.end(), [](char c) { return std::isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_'; }))
      return bad("bad host name");
    t.host = h;
    after = colon == std::string_view::npos ? std::string_view() : auth.substr(colon);
  }
  if (!after.empty()) {
    std::string_view p = after.substr(1);
    if (after.front() != ':' || p.empty() || p.size() > 5 ||
        !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return bad("bad port (expected :1..65535)");
    const int port = std::stoi(std::string(p));
    if (port < 1 || port > 65535) return bad("port out of range (expected 1..65535)");
    t.port = std::to_string(port);
  }
  std::string base(path);
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, "/v1") == 0) base.resize(base.size() - 3);
  while (!base.empty() && base.back() == '/') base.pop_back();
  t.base = base;
  t.host_header = (v6 ? "[" + t.host + "]" : t.host) + ":" + t.port;
  return t;
}

std::string request_body(const Options& opt, const Plan& plan, int64_t index) {
  const std::string text = prompt_text(opt, plan, index);
  json j = {{"model", plan.model},
            {"max_tokens", opt.gen_len},
            {"temperature", 0},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"ignore_eos", true}};
  if (opt.endpoint == Endpoint::chat) j["messages"] = json::array({{{"role", "user"}, {"content", text}}});
  else j["prompt"] = text;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);  // --model may not be UTF-8
}

Expected<std::string> http_get(const Target& target, const std::string& path, const std::string& api_key,
                               double timeout_s) {
  auto eps = resolve(target);
  if (!eps.ok()) return eps.status();
  Client cl(target, *eps, api_key);
  auto r = cl.fetch(http::verb::get, target.base + path, "", timeout_s);
  if (!r.ok()) return r.status();
  if (r->first != 200) return io_error("GET " + path + ": HTTP " + std::to_string(r->first));
  return std::move(r->second);
}

uint64_t fresh_prompt_salt() {
  return (((uint64_t)std::random_device{}() << 32) ^
          (uint64_t)std::chrono::system_clock::now().time_since_epoch().count()) &
         ((1ull << 53) - 1);
}

Expected<Plan> make_plan(const Options& opt) {
  auto target = parse_url(opt.url);
  if (!target.ok()) return target.status();
  auto eps = resolve(*target);
  if (!eps.ok()) return eps.status();
  Plan plan;
  plan.target = *target;
  plan.model = opt.model;
  Client cl(plan.target, *eps, opt.api_key);
  const double t = std::min(opt.timeout_s, 30.0);

  // Reachability check, and the model name when --model is not given.
  auto models = cl.fetch(http::verb::get, plan.target.base + "/v1/models", "", t);
  if (!models.ok()) return models.status();
  if (plan.model.empty()) {
    const auto& [status, body] = *models;
    if (status != 200)
      return not_found("GET " + url_of(plan.target) + "/v1/models returned HTTP " + std::to_string(status) +
                       " (pass --model)");
    json j = json::parse(body, nullptr, false);
    const json* id = nullptr;
    if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
        j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string())
      id = &j["data"][0]["id"];
    if (!id) return not_found("GET /v1/models: no model id in the answer (pass --model)");
    plan.model = id->get<std::string>();
  }

  // Tokens per word, from one POST /tokenize when the server has it.
  if (opt.calibrate) {
    const int64_t sample = std::clamp<int64_t>(std::lround(opt.prompt_len / 1.3), 32, 4096);
    std::string text;
    append_words(text, opt.seed ^ 0xca11b7a7eull, sample);
    auto tok = cl.fetch(http::verb::post, plan.target.base + "/tokenize", json{{"prompt", text}}.dump(), t);
    if (tok.ok() && tok->first == 200) {
      json j = json::parse(tok->second, nullptr, false);
      int64_t count = -1;
      if (j.is_object() && j.contains("count") && j["count"].is_number_integer()) count = j["count"].get<int64_t>();
      else if (j.is_object() && j.contains("tokens") && j["tokens"].is_array()) count = (int64_t)j["tokens"].size();
      const double tpw = (double)count / (double)sample;
      if (count > 0 && tpw >= 0.05 && tpw <= 20) {
        plan.tokens_per_word = tpw;
        plan.calibrated = true;
      }
    }
  }
  plan.prompt_words = (int)std::max<long>(1, std::lround(opt.prompt_len / plan.tokens_per_word));
  plan.prefix_words =
      opt.shared_prefix == 0
          ? 0
          : (int)std::clamp<long>(std::lround(opt.shared_prefix / plan.tokens_per_word), 1, plan.prompt_words);
  return plan;
}

std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed) {
  // The capacity planner's generator, so that `serval plan --validate`
  // replays exactly the arrivals it modelled.
  plan::Workload w;
  w.rate = rate;
  w.n_requests = (int32_t)std::clamp<int64_t>(n, 0, INT32_MAX);
  w.seed = seed;
  w.lengths = {{1, 1}};
  std::vector<double> t;
  t.reserve((size_t)w.n_requests);
  for (const plan::Arrival& a : plan::make_arrivals(w)) t.push_back(a.t);
  return t;
}

Expected<RunResult> run_load(const Options& opt, const Plan& plan, int concurrency) {
  if (concurrency < 1 || concurrency > kMaxConcurrency)
    return invalid_argument("concurrency " + std::to_string(concurrency) + " out of [1, 1024]");
  auto eps_or = resolve(plan.target);
  if (!eps_or.ok()) return eps_or.status();
  const std::vector<tcp::endpoint>& eps = *eps_or;
  const int64_t run_no = (*plan.runs)++;
  const int64_t index_base = run_no << 32;

  if (opt.warmup > 0) {
    Client cl(plan.target, eps, opt.api_key);
    std::atomic<int64_t> next{0};
    RunResult ignored;
    drive(cl, opt, plan, next, opt.warmup, index_base | (1ll << 31), ignored);
  }

  const int n_threads = (int)std::min<int64_t>(concurrency, opt.requests);
  if (auto st = ensure_fd_limit(n_threads); !st.ok()) return st;
  RunResult total;
  total.concurrency = concurrency;
  total.requests = opt.requests;
  std::atomic<int64_t> next{0};
  const std::vector<double> arrivals = opt.rate > 0 ? poisson_arrivals(opt.requests, opt.rate, opt.seed) : std::vector<double>{};
  Schedule sched;
  if (opt.rate > 0) sched.arrivals = &arrivals;
  std::mutex mu;
  std::condition_variable cv;
  bool go = false, abort = false;
  int ready = 0;
  auto worker = [&] {
    Client cl(plan.target, eps, opt.api_key);
    cl.preconnect(opt.timeout_s);
    {
      std::unique_lock<std::mutex> lk(mu);
      ++ready;
      cv.notify_all();
      cv.wait(lk, [&] { return go || abort; });
      if (abort) return;
    }
    RunResult mine;
    try {
      drive(cl, opt, plan, next, opt.requests, index_base, mine, sched);
    } catch (const std::exception& e) {  // bad_alloc; everything else reports by value
      mine.last_error = std::string("client thread stopped: ") + e.what();
    }
    std::lock_guard<std::mutex> lk(mu);
    merge(total, std::move(mine));
  };
  std::vector<std::thread> threads;
  threads.reserve((size_t)n_threads);
  std::string spawn_error;
  try {
    for (int i = 0; i < n_threads; ++i) threads.emplace_back(worker);
  } catch (const std::system_error& e) {
    spawn_error = e.what();
  }
  Clock::time_point t0;
  {
    std::unique_lock<std::mutex> lk(mu);
    if (spawn_error.empty()) cv.wait(lk, [&] { return ready == n_threads; });
    (spawn_error.empty() ? go : abort) = true;
    t0 = Clock::now();
    sched.t0 = t0;
  }
  cv.notify_all();
  for (auto& th : threads) th.join();
  if (!spawn_error.empty())
    return io_error("cannot start " + std::to_string(n_threads) + " client threads: " + spawn_error);
  total.wall_s = seconds(Clock::now() - t0);
  return total;
}

int run_cli(int argc, char** argv, std::FILE* out) {
  const std::string cmd = argc > 0 && argv[0] ? argv[0] : "serval bench http";
  CLI::App app("Load benchmark of an OpenAI-compatible HTTP server: streams N requests from C concurrent\n"
               "clients and reports requests/s, tokens/s, TTFT, inter-token and end-to-end latency.\n"
               "Exit status: 0 ok, 1 server unreachable or every request failed, 2 bad usage.",
               cmd);
  Options opt;
  std::string endpoint = "completions", conc = "1", format = "text";
  bool no_calibrate = false;
  app.add_option("--url", opt.url, "server base URL, plain HTTP: http://host[:port]")->required();
  app.add_option("--endpoint", endpoint, "completions (/v1/completions) or chat (/v1/chat/completions)")
      ->check(CLI::IsMember({"completions", "chat"}));
  app.add_option("--model", opt.model, "model name (default: the first id of GET /v1/models)");
  app.add_option("--api-key", opt.api_key, "sent as 'Authorization: Bearer KEY'");
  app.add_option("-c,--concurrency", conc, "clients in flight, 1..1024; a comma-separated list (1,4,16) runs each")
      ->capture_default_str();
  app.add_option("-n,--requests", opt.requests, "requests per run")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--prompt-len", opt.prompt_len, "prompt tokens (approximate)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--gen-len", opt.gen_len, "generated tokens per request (max_tokens, ignore_eos)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--shared-prefix", opt.shared_prefix, "leading prompt tokens common to every request")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--timeout", opt.timeout_s, "seconds per request attempt (connect, send, whole stream)")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  app.add_option("--max-retries", opt.max_retries, "retries of a request answered 429")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  app.add_option("--max-retry-wait", opt.max_retry_wait_s, "cap on a 429's Retry-After, seconds")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--warmup", opt.warmup, "requests sent one at a time before each run, not counted")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_flag("--no-calibrate", no_calibrate, "skip POST /tokenize; assume 1.3 tokens per word");
  app.add_option("--seed", opt.seed, "prompt seed (and arrival times with --rate)")->capture_default_str();
  CLI::Option* salt_opt =
      app.add_option("--prompt-salt", opt.prompt_salt,
                     "mixed into each prompt's own words (not the shared prefix); default: a fresh value per "
                     "invocation, so that nothing of an earlier invocation's prompts sits in the server's prefix cache; "
                     "give the printed value to send the same prompts again");
  app.add_option("--rate", opt.rate,
                 "open loop: requests start at Poisson arrivals of this many per second (TTFT counts from the "
                 "arrival); -c then caps the clients in flight. 0: closed loop")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("-o,--output", format, "text or json")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  if (auto rc = parse(app, argc, argv)) return *rc;

  opt.endpoint = endpoint == "chat" ? Endpoint::chat : Endpoint::completions;
  opt.json = format == "json";
  // The same seed twice must not replay the same prompts into a warm prefix cache.
  if (salt_opt->count() == 0) opt.prompt_salt = fresh_prompt_salt();
  opt.calibrate = !no_calibrate;
  if (!std::isfinite(opt.timeout_s) || !(opt.timeout_s >= 0.001))
    return fail(cmd, "--timeout: expected seconds in [0.001, 86400]");
  if (!std::isfinite(opt.max_retry_wait_s) || !(opt.max_retry_wait_s >= 0))
    return fail(cmd, "--max-retry-wait: expected seconds in [0, 3600]");
  if (opt.shared_prefix > opt.prompt_len)
    return fail(cmd, "--shared-prefix (" + std::to_string(opt.shared_prefix) + ") exceeds --prompt-len (" +
                         std::to_string(opt.prompt_len) + ")");
  if (opt.model.size() > 1024) return fail(cmd, "--model: longer than 1024 characters");
  if (opt.api_key.size() > 4096) return fail(cmd, "--api-key: longer than 4096 characters");
  for (char c : opt.api_key)
    if ((unsigned char)c < 0x20 || (unsigned char)c == 0x7f) return fail(cmd, "--api-key: contains a control character");
  auto concs = parse_concurrency(conc);
  if (!concs.ok()) return fail(cmd, concs.status().message());
  opt.concurrency = *concs;
  if (auto t = parse_url(opt.url); !t.ok()) return fail(cmd, t.status().message());
  for (int c : opt.concurrency)
    if (auto st = ensure_fd_limit(std::min(c, opt.requests)); !st.ok()) return fail(cmd, st.message());

  auto plan = make_plan(opt);
  if (!plan.ok())
    return fail(cmd, plan.status().message(), plan.status().code() == StatusCode::invalid_argument ? 2 : 1);

  if (!opt.json) {
    std::fprintf(out,
                 "serval bench http: POST %s%s | model '%s' | prompt ~%d tokens (%d words, %.2f tokens/word%s)%s | "
                 "gen %d tokens | %d requests per run%s | prompt salt %llu\n",
                 url_of(plan->target).c_str(), opt.endpoint == Endpoint::chat ? "/v1/chat/completions" : "/v1/completions",
                 excerpt(plan->model, 80).c_str(), opt.prompt_len, plan->prompt_words, plan->tokens_per_word,
                 plan->calibrated ? " from /tokenize" : ", assumed",
                 opt.shared_prefix ? (" | shared prefix ~" + std::to_string(opt.shared_prefix) + " tokens").c_str() : "",
                 opt.gen_len, opt.requests,
                 opt.rate > 0 ? (" | open loop, Poisson arrivals at " + std::to_string(opt.rate) + " req/s").c_str() : "",
                 (unsigned long long)opt.prompt_salt);
    std::fflush(out);
  }
  json runs = json::array();
  bool any_empty = false;
  for (int c : opt.concurrency) {
    auto r = run_load(opt, *plan, c);
    if (!r.ok()) return fail(cmd, r.status().message(), 1);
    if (r->completed == 0) any_empty = true;
    if (opt.json) runs.push_back(to_json(opt, *plan, *r));
    else print_text(out, *r);
  }
  if (opt.json) {
    json o = runs.size() == 1 ? runs[0] : json{{"runs", runs}};
    std::fprintf(out, "%s\n", o.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    std::fflush(out);
  }
  if (any_empty) return fail(cmd, "every request of a run failed (see the errors above)", 1);
  return 0;
}

}  // namespace bench_http

int cmd_bench_http(int argc, char** argv) { return bench_http::run_cli(argc, argv, stdout); }

}  // namespace serval::cli
