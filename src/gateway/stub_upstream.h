// A fast OpenAI-compatible stub upstream: answers /v1/completions,
// /v1/chat/completions and /v1/embeddings at once with a fixed short answer
// (streamed or not), /ready, /health and a /metrics page with serval's load
// gauges. For the gateway's tests (failures on demand) and for measuring the
// gateway's own overhead and request rate (`serval gateway stub`), where a
// real model would hide it.
//
// Threads: the HTTP server runs on its own threads (start() returns); the
// behaviour knobs are atomics that tests may change at any time.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "server/http_server.h"

namespace serval::gateway {

struct StubBehaviour {
  std::atomic<int> fail_status{0};        // answer every proxied request with this status (0: normal)
  std::atomic<int> completion_tokens{4};  // tokens in each answer (one SSE chunk each)
  std::atomic<int> stream_stop_after{-1}; // end a stream after this many chunks without [DONE] (-1: never)
  std::atomic<int> context_chars{0};      // prompts longer than this get 400 context_length_exceeded (0: no limit)
  std::atomic<int> delay_ms{0};           // before answering (on a helper thread)
  std::atomic<bool> ready{true};          // /ready answers 200 (else 503)
  std::atomic<long> requests{0};          // proxied requests received
};

class StubUpstream {
 public:
  // port 0: a free port. `name` is the model id it reports (and echoes).
  static Expected<std::unique_ptr<StubUpstream>> start(const std::string& host, uint16_t port, const std::string& name,
                                                        int n_threads = 1);
  ~StubUpstream();
  uint16_t port() const;
  std::string url() const;
  StubBehaviour& behaviour() { return b_; }
  // The traceparent header of the last proxied request ("" when none).
  std::string last_traceparent() const;
  void stop();
  // Blocks until stop() (for `serval gateway stub`).
  void wait();

 private:
  StubUpstream() = default;
  void handle(http::HttpRequest req, std::shared_ptr<http::ResponseChannel> ch);
  void answer(const http::HttpRequest& req, const std::shared_ptr<http::ResponseChannel>& ch);

  std::string name_, host_;
  mutable std::mutex mu_;
  std::string last_traceparent_;
  StubBehaviour b_;
  std::unique_ptr<http::HttpServer> server_;
  std::thread thread_;
};

}  // namespace serval::gateway
