// serval bench http: a load generator for OpenAI-compatible servers.
//
// C client threads (each with its own keep-alive connection) send N streaming
// requests in total to POST {url}/v1/completions (or /v1/chat/completions), parse
// the SSE stream and report requests/s, generated and prompt tokens/s, TTFT,
// inter-token latency and end-to-end latency percentiles and errors by status.
//
// The pieces below are exposed for tests/bench_http; the CLI entry point is
// cmd_bench_http (argv[0] is the command name, e.g. "serval bench http").
// Nothing here is shared between threads except where a comment says so.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/sse_parser.h"
#include "common/stats.h"
#include "common/status.h"

namespace serval::cli {

// Runs `serval bench http`; returns 0 ok, 1 runtime failure (server unreachable,
// every request failed), 2 bad usage. Prints the report on stdout.
int cmd_bench_http(int argc, char** argv);

namespace bench_http {

// A plain-HTTP base URL: http://host[:port][/prefix]. A trailing "/" or "/v1"
// on the prefix is dropped, so http://h:8000/v1 (the OpenAI "base_url") works too.
struct Target {
  std::string host;         // hostname, IPv4, or IPv6 without brackets
  std::string port = "80";  // decimal, 1..65535
  std::string base;         // "" or "/prefix" (no trailing slash)
  std::string host_header;  // "host:port" as sent in Host
};
Expected<Target> parse_url(std::string_view url);

// Server-sent events (common/sse_parser.h).
using serval::SseParser;

// Linear-interpolated percentile (p in [0, 100]) of v; 0 when empty (common/stats.h).
using serval::percentile;

enum class Endpoint { completions, chat };

struct Options {
  std::string url;
  Endpoint endpoint = Endpoint::completions;
  std::string model;    // empty: the first id of GET /v1/models
  std::string api_key;  // empty: no Authorization header
  std::vector<int> concurrency{1};
  int requests = 64;
  int prompt_len = 128;
  int gen_len = 128;
  int shared_prefix = 0;  // leading prompt tokens common to every request
  double timeout_s = 300;  // per request attempt (connect + send + whole stream)
  int max_retries = 3;     // retries of a request answered 429 (after Retry-After)
  double max_retry_wait_s = 60;  // Retry-After is capped at this
  int warmup = 0;          // requests sent (one at a time, not counted) before each run
  bool calibrate = true;   // ask POST /tokenize once for tokens per word
  uint64_t seed = 1;
  bool json = false;
  // Open loop: requests start at Poisson arrival times of this mean rate
  // (requests/s; seeded by seed), whatever is in flight, and each one's TTFT
  // and end-to-end latency count from its arrival (a client that starts late
  // does not hide queueing). Concurrency then caps the clients sending at
  // once. 0: closed loop, each client sends its next request when the last ends.
  double rate = 0;
  // Mixed into each prompt's own words (not the shared prefix): another salt
  // gives other prompts, so a run finds nothing of an earlier run's prompts in
  // the server's prefix cache. Runs of one Plan differ anyway. The CLI
  // (--prompt-salt) draws a fresh one per invocation unless given.
  uint64_t prompt_salt = 0;
};

// What one run (one concurrency level) measured.
struct RunResult {
  int concurrency = 0;
  int64_t requests = 0, completed = 0, failed = 0;
  double wall_s = 0;
  int64_t gen_tokens = 0, prompt_tokens = 0;
  std::vector<double> ttft, itl, e2e, tpot;  // seconds; ttft/e2e/tpot one per completed request
  std::map<int, int64_t> status_errors;      // HTTP status (not 200) -> responses
  int64_t connection_errors = 0;             // connect/reset/EOF before a complete response
  int64_t timeouts = 0;                      // attempts that ran past --timeout
  int64_t stream_errors = 0;                 // 200 but a bad stream (error event, bad JSON, no [DONE])
  int64_t retries_429 = 0;                   // 429s waited out and retried
  int64_t short_generations = 0;             // completed with completion_tokens != gen_len
  double max_start_lag_s = 0;                // open loop: latest start after a request's arrival
  std::string last_error;                    // one example, for the report
};

// Bench inputs resolved against the server (model, tokens per word).
struct Plan {
  Target target;
  std::string model;
  double tokens_per_word = 1.3;
  bool calibrated = false;
  int prompt_words = 0, prefix_words = 0;
  // Runs started with this plan (copies share it): each run's prompts differ
  // from the others', and a fresh plan (one invocation) starts again at 0, so
  // the same --prompt-salt sends the same prompts again.
  std::shared_ptr<std::atomic<int64_t>> runs = std::make_shared<std::atomic<int64_t>>(0);
};

// A prompt salt no earlier invocation used (time and random_device), below
// 2^53 so that it reads back exactly from JSON parsed as doubles.
uint64_t fresh_prompt_salt();

// Resolves the model and calibrates the prompt size against the server.
// Connection failure: an error whose message names the URL.
Expected<Plan> make_plan(const Options& opt);

// GET target.base + path; the body of a 200 answer, else an error naming the status.
Expected<std::string> http_get(const Target& target, const std::string& path, const std::string& api_key,
                               double timeout_s);

// The request body of request `index` (deterministic in seed and index).
std::string request_body(const Options& opt, const Plan& plan, int64_t index);

// The open-loop arrival times (seconds from the run's start) of n requests at
// `rate`: exponential gaps, the first at 0; deterministic in seed, and the
// same as the capacity planner's (plan::make_arrivals).
std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed);

// Runs opt.requests requests at `concurrency` and measures them.
Expected<RunResult> run_load(const Options& opt, const Plan& plan, int concurrency);

// Parses argv and runs; the report goes to `out`. Same statuses as cmd_bench_http.
int run_cli(int argc, char** argv, std::FILE* out);

}  // namespace bench_http
}  // namespace serval::cli
