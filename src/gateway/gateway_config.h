// `serval gateway` configuration: the TOML file (deploy/gateway/gateway.toml is
// the documented example) parsed into plain structs.
//
// Every value is range-checked here; an error names the file, the line and the
// key ("gateway.toml:14: models[1].upstreams[0]: expected a URL http://host:port,
// got 'localhost'"). Unknown keys are errors too (a typo must not silently
// become a default).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace serval::gateway {

// http://host[:port][/prefix] (plain HTTP only; TLS is a proxy's job).
struct UpstreamUrl {
  std::string url;          // as written, without a trailing '/'
  std::string host;         // hostname, IPv4, or IPv6 without brackets
  std::string port = "80";  // decimal 1..65535
  std::string base;         // "" or "/prefix" (no trailing slash; a trailing /v1 is dropped)
  std::string host_header;  // "host:port"
};
Expected<UpstreamUrl> parse_upstream_url(std::string_view url);

enum class Policy { cache_aware, round_robin, least_loaded };
std::string_view policy_name(Policy p);

enum class BudgetPeriod { day, month, total };

// One model name the gateway serves, backed by a pool of upstream replicas.
struct ModelRoute {
  std::string name;                  // what clients send as "model"
  std::vector<std::string> aliases;  // more names for the same route
  std::vector<UpstreamUrl> upstreams;
  // "dns": each upstream's host name is resolved every health interval and
  // every address it has is a replica (a Kubernetes headless Service); the
  // pool follows the addresses as replicas come and go (also from zero).
  bool discover_dns = false;
  std::string upstream_model;        // "model" sent upstream; empty: name
  std::vector<std::string> fallback; // other routes' names, tried in order when this one fails
  double connect_timeout_s = 2;
  double first_byte_timeout_s = 120; // until the response header (prefill may be long)
  double idle_timeout_s = 60;        // between two chunks of a response body
  double price_input_per_mtok = 0;   // currency per 1e6 prompt tokens
  double price_output_per_mtok = 0;  // currency per 1e6 completion tokens
  std::string api_key;               // sent upstream as Bearer (for upstreams that need one)
  std::string api_key_file;          // or: the first line of this file (a mounted Secret), read at start
  bool serval = true;                // upstreams are serval replicas (metrics names, /ready)
  std::string health_path = "/ready";   // "" disables active health checks
  std::string metrics_path = "/metrics"; // "" disables load scraping
};

// A virtual API key declared in the file (more are created at run time by the
// admin routes and live in the database). Only the SHA-256 of a key is kept.
struct KeyConfig {
  std::string name;
  std::string sha256;                 // 64 lower-case hex digits
  double rpm = 0;                     // requests per minute; 0: unlimited
  double tpm = 0;                     // tokens (prompt + completion) per minute; 0: unlimited
  int max_parallel = 0;               // requests in flight; 0: unlimited
  std::vector<std::string> models;    // allowed model names; empty: all
  double budget = 0;                  // currency per period; 0: unlimited
  BudgetPeriod budget_period = BudgetPeriod::month;
};

struct GatewayConfig {
  // [server]
  std::string host = "127.0.0.1";
  uint16_t port = 8090;
  int threads = 2;                    // HTTP I/O threads
  int max_inflight = 1024;            // proxied requests at once; more: 503
  double request_timeout_s = 600;     // whole request, across retries and fallbacks
  double drain_timeout_s = 30;        // SIGTERM: finish in-flight requests for up to this
  size_t max_body_bytes = 8u << 20;
  // [routing]
  Policy policy = Policy::cache_aware;
  double cache_threshold = 0.5;       // prefix match ratio above which the matching replica wins
  int balance_abs_threshold = 8;      // load difference (requests) ...
  double balance_rel_threshold = 1.5; // ... and ratio above which least-loaded wins regardless
  int chunk_chars = 64;               // prompt characters per prefix-tree node
  size_t max_tree_chunks = 1u << 18;  // per replica (LRU beyond)
  double queue_timeout_s = 0;         // no replica available: hold the request this long for one (scale from zero)
  // [health]
  double health_interval_s = 1;
  double health_timeout_s = 1;
  // [breaker]
  int breaker_failures = 3;           // consecutive failures that open it
  double breaker_open_s = 5;          // first open period (doubles while probes fail)
  double breaker_max_open_s = 60;
  // [retry]
  int retry_attempts = 3;             // attempts per model (on different replicas where possible)
  double retry_backoff_ms = 25;       // full jitter in [0, backoff * 2^n]
  double retry_max_backoff_ms = 1000;
  // [auth]
  std::string admin_key_sha256;       // empty: no admin routes
  bool require_key = false;           // true: every /v1 request needs a virtual key
  std::string db_path;                // SQLite ledger and keys; empty: in memory (lost on exit)
  std::vector<KeyConfig> keys;
  // [[models]]
  std::vector<ModelRoute> models;

  std::string source;                 // the file it came from (messages)
};

// Parses and validates a configuration. `name` is used in messages.
Expected<GatewayConfig> parse_gateway_config(std::string_view toml_text, const std::string& name);
Expected<GatewayConfig> load_gateway_config(const std::string& path);

// Lower-case hex SHA-256 of a key (OpenSSL).
std::string sha256_hex(std::string_view data);

}  // namespace serval::gateway
