// `serval gateway`: one OpenAI-compatible endpoint in front of pools of
// replicas (serval serve, or any OpenAI-compatible server).
//
// For each request: authenticate the virtual key (SHA-256 lookup), resolve the
// model (aliases), check the key's model list, RPM/TPM/parallel limits and
// budget, then route (cache-aware, round-robin or least-loaded; see router.h)
// and proxy. Failures before any byte reached the client (connection errors,
// timeouts, 5xx, 429) are retried on another replica with jittered backoff,
// then the model's fallback chain is tried (also when the context is too long
// for a model). A stream already started that breaks ends with an SSE error
// event. The answer's usage is priced and recorded once in the ledger.
//
// Threads: handle() runs on an HTTP I/O thread and only hands the request to a
// worker (a thread per request in flight, up to [server] max_inflight, idle
// ones reused); workers block on upstream I/O. One background thread runs
// health checks and load scrapes. Everything public is thread-safe.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "gateway/gateway_config.h"
#include "server/http_server.h"

namespace serval::gateway {

class Gateway {
 public:
  static Expected<std::unique_ptr<Gateway>> create(GatewayConfig cfg);
  ~Gateway();

  void handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch);
  // The OpenAI-style JSON error body (also for the HTTP layer's own rejections).
  static std::string error_body(int status, const std::string& message, const std::string& code = "");

  // Starts the health/scrape thread (runs one round of checks before returning,
  // so a replica that is down is known before the first request).
  void start();
  // New requests get 503; those in flight continue.
  void begin_drain();
  size_t in_flight() const;
  // Aborts the upstream calls still running (after the drain timeout).
  void cancel_all();
  // Stops the background thread, waits for the workers, commits the ledger.
  void stop();

  const GatewayConfig& config() const;
  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace serval::gateway
