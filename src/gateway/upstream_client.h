// HTTP/1.1 client for the gateway's upstreams (Boost.Beast): a keep-alive
// connection pool per upstream and one blocking call that streams the response
// body to a callback as it arrives (no buffering of SSE).
//
// Threads: call() blocks the calling thread (a gateway worker) and runs the
// connection's own io_context there, so a connection is used by one thread at
// a time and may move between threads through the pool. ConnectionPool and
// CallCancel are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/gateway_config.h"

namespace serval::gateway {

using Clock = std::chrono::steady_clock;
using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct Connection;  // defined in upstream_client.cpp

class ConnectionPool {
 public:
  explicit ConnectionPool(UpstreamUrl url, size_t max_idle = 256);
  ~ConnectionPool();
  const UpstreamUrl& url() const { return url_; }

  // An idle keep-alive connection, or a new unconnected one (call() connects it).
  std::unique_ptr<Connection> acquire();
  // Gives a connection back for reuse (dropped when the pool is full).
  void release(std::unique_ptr<Connection> c);
  // Closes every idle connection (the upstream went away).
  void clear();

 private:
  UpstreamUrl url_;
  size_t max_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

// Lets another thread abort a call in progress (the client went away, drain
// deadline). cancel() before or during call() makes it return `cancelled`.
class CallCancel {
 public:
  void cancel();
  bool cancelled() const;

 private:
  friend struct CallScope;
  mutable std::mutex mu_;
  bool cancelled_ = false;
  Connection* active_ = nullptr;
};

struct CallTimeouts {
  Clock::time_point deadline;  // the whole call
  double connect_s = 2;
  double first_byte_s = 120;   // request sent -> response header
  double idle_s = 60;          // between body chunks
};

struct CallResult {
  enum class Kind {
    ok,           // a complete response (any status)
    connect,      // could not connect: nothing was sent
    send,         // the request could not be written
    header,       // no (complete) response header arrived: connection closed or reset
    timeout,      // a deadline passed (connect, first byte, idle or the whole call)
    body,         // the body broke off after the header
    cancelled,    // CallCancel::cancel()
    stopped,      // a callback returned false
  } kind = Kind::connect;
  int status = 0;
  bool header_seen = false;
  std::string error;
};
std::string_view call_kind_name(CallResult::Kind k);

// Called once with the response status and headers (names lower-case); false aborts.
using OnHeader = std::function<bool(int status, const HeaderList& headers)>;
// Called with each piece of the body as it arrives; false aborts.
using OnBody = std::function<bool(std::string_view chunk)>;

struct CallRequest {
  std::string method = "POST";
  std::string target;     // path and query, without the pool's base prefix
  HeaderList headers;     // Host, Content-Length and Connection are set by call()
  std::string body;
};

CallResult call(ConnectionPool& pool, const CallRequest& req, const CallTimeouts& t, const OnHeader& on_header,
                const OnBody& on_body, CallCancel* cancel = nullptr);

// Every address the URL's host name resolves to, each as a URL of its own
// (same port and base). Errors: the resolver's message (the name does not
// exist: an empty pool, e.g. a headless Service scaled to zero).
Expected<std::vector<UpstreamUrl>> resolve_all(const UpstreamUrl& u);

// A small GET (health checks, metrics scrapes): status and body (at most max_body bytes).
struct SimpleResponse {
  CallResult result;
  std::string body;
};
SimpleResponse simple_get(ConnectionPool& pool, const std::string& target, double timeout_s, size_t max_body = 1u << 20,
                          const HeaderList& headers = {});

}  // namespace serval::gateway
