// HTTP/1.1 server (Boost.Beast over Asio): keep-alive, many connections on a
// few I/O threads (no thread per connection), bounded headers and bodies,
// read timeouts against slow clients, chunked streaming responses (SSE) and
// client-disconnect notification.
//
// This is the replaceable HTTP layer: the API above it (openai_server) sees
// only HttpRequest, ResponseChannel and Handler.
//
// Threads: run() blocks on the calling thread plus n_threads-1 more. The
// handler is called on an I/O thread and must not block; it answers through
// the ResponseChannel, whose methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace serval::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string path;     // target without the query string
  std::string query;    // after '?', may be empty
  Headers headers;      // names lower-cased
  std::string body;
  std::string remote;   // peer address

  // First value of a header (name in lower case); empty when absent.
  std::string header(std::string_view name) const;
};

// One request's response. Exactly one of send() or start_stream()..end() is
// used; calls after the response is complete, or after the client went away,
// are ignored. Thread-safe.
class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  virtual void send(int status, std::string content_type, std::string body, Headers extra = {}) = 0;
  // Chunked response; each write() is flushed as one chunk.
  virtual void start_stream(int status, std::string content_type, Headers extra = {}) = 0;
  virtual void write(std::string data) = 0;
  virtual void end() = 0;
  // Called once if the client disconnects before the response completes (may
  // run on an I/O thread; keep it short). Set it right after the request arrives.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
};

using Handler = std::function<void(HttpRequest, std::shared_ptr<ResponseChannel>)>;

// Answers a request rejected by the HTTP layer itself (413, 431, 400, 408).
using ErrorBody = std::function<std::string(int status, const std::string& message)>;

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;              // 0: pick a free port (see port())
  int n_threads = 2;
  size_t max_header_bytes = 16 * 1024;     // larger headers: 431
  size_t max_body_bytes = 8 * 1024 * 1024; // larger bodies: 413
  int read_timeout_s = 30;           // whole request (headers + body) must arrive within this
  int idle_timeout_s = 60;           // keep-alive connection with no request
  size_t max_connections = 4096;     // further connections are closed at once
};

// One request parsed from raw bytes by the same parser, limits and error
// mapping the server uses on its sockets (tests and fuzzing). status == 0:
// `request` holds the request; otherwise the status and message the server
// answers with (431, 413, 400; 408 for bytes that end before the request does).
struct ParsedHttpRequest {
  int status = 0;
  std::string message;
  std::optional<HttpRequest> request;
  size_t consumed = 0;  // bytes of the request (a pipelined one may follow)
  bool keep_alive = false;
};
ParsedHttpRequest parse_http_request(std::string_view bytes, const HttpServerConfig& cfg);

class HttpServer {
 public:
  // Binds and listens. Errors: io_error (address in use, bad host).
  static Expected<std::unique_ptr<HttpServer>> create(HttpServerConfig cfg, Handler handler, ErrorBody error_body);
  ~HttpServer();

  uint16_t port() const;
  // Serves until stop(). Blocks.
  void run();
  // Stops accepting new connections (already-open ones keep being served).
  void stop_accepting();
  // Stops everything; run() returns. Thread-safe.
  void stop();
  size_t n_connections() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace serval::http
