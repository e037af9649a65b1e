#include "gateway/upstream_client.h"

#include <algorithm>
#include <limits>
#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace serval::gateway {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

struct Connection {
  net::io_context ioc{1};
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buf;

  // Runs one async operation to completion on this thread.
  template <typename Start>
  beast::error_code wait(Start&& start) {
    beast::error_code result = net::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }
  void close() {
    if (stream) {
      beast::error_code ignored;
      stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream->socket().close(ignored);
      stream.reset();
    }
    buf.clear();
  }
  beast::error_code connect(const UpstreamUrl& u, Clock::time_point deadline) {
    close();
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    auto eps = resolver.resolve(u.host, u.port, tcp::resolver::numeric_service, ec);
    if (ec) return ec;
    stream.emplace(ioc);
    stream->expires_at(deadline);
    ec = wait([&](auto h) { stream->async_connect(eps, std::move(h)); });
    if (ec) {
      close();
      return ec;
    }
    beast::error_code ignored;
    stream->socket().set_option(tcp::no_delay(true), ignored);
    return {};
  }
};

// Marks the connection a call is using so that CallCancel can reach it.
struct CallScope {
  CallCancel* c;
  CallScope(CallCancel* cancel, Connection* conn) : c(cancel) {
    if (c) {
      std::lock_guard<std::mutex> lk(c->mu_);
      c->active_ = conn;
    }
  }
  ~CallScope() { reset(); }
  // Before the connection goes back to the pool: a later cancel() must not reach it.
  void reset() {
    if (c) {
      std::lock_guard<std::mutex> lk(c->mu_);
      c->active_ = nullptr;
      c = nullptr;
    }
  }
};

void CallCancel::cancel() {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_ = true;
  if (active_) {
    Connection* conn = active_;
    // Runs on the calling thread's io_context.run(): the socket is touched by that thread only.
    net::post(conn->ioc, [conn] {
      if (conn->stream) {
        beast::error_code ignored;
        conn->stream->socket().cancel(ignored);
        conn->stream->socket().close(ignored);
      }
    });
  }
}

bool CallCancel::cancelled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cancelled_;
}

ConnectionPool::ConnectionPool(UpstreamUrl url, size_t max_idle) : url_(std::move(url)), max_idle_(max_idle) {}
ConnectionPool::~ConnectionPool() = default;

std::unique_ptr<Connection> ConnectionPool::acquire() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  return std::make_unique<Connection>();
}

void ConnectionPool::release(std::unique_ptr<Connection> c) {
  if (!c || !c->stream) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(c));
}

void ConnectionPool::clear() {
  std::vector<std::unique_ptr<Connection>> old;
  {
    std::lock_guard<std::mutex> lk(mu_);
    old.swap(idle_);
  }
}

std::string_view call_kind_name(CallResult::Kind k) {
  switch (k) {
    case CallResult::Kind::ok: return "ok";
    case CallResult::Kind::connect: return "connect";
    case CallResult::Kind::send: return "send";
    case CallResult::Kind::header: return "header";
    case CallResult::Kind::timeout: return "timeout";
    case CallResult::Kind::body: return "body";
    case CallResult::Kind::cancelled: return "cancelled";
    case CallResult::Kind::stopped: return "stopped";
  }
  return "?";
}

namespace {

Clock::time_point after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

CallResult fail(CallResult::Kind k, std::string msg, int status = 0, bool header_seen = false) {
  CallResult r;
  r.kind = k;
  r.error = std::move(msg);
  r.status = status;
  r.header_seen = header_seen;
  return r;
}

}  // namespace

CallResult call(ConnectionPool& pool, const CallRequest& req, const CallTimeouts& t, const OnHeader& on_header,
                const OnBody& on_body, CallCancel* cancel) {
  const UpstreamUrl& u = pool.url();
  std::unique_ptr<Connection> conn = pool.acquire();
  CallScope scope(cancel, conn.get());
  auto cancelled = [&] { return cancel && cancel->cancelled(); };
  auto io_fail = [&](CallResult::Kind k, const beast::error_code& ec, const std::string& what, int status = 0, bool hs = false) {
    if (cancelled()) return fail(CallResult::Kind::cancelled, "cancelled", status, hs);
    if (ec == beast::error::timeout) return fail(CallResult::Kind::timeout, what + ": timed out", status, hs);
    return fail(k, what + ": " + ec.message(), status, hs);
  };

  bhttp::request<bhttp::string_body> msg{bhttp::string_to_verb(req.method), u.base + req.target, 11};
  msg.set(bhttp::field::host, u.host_header);
  for (const auto& [k, v] : req.headers) msg.set(k, v);
  msg.keep_alive(true);
  msg.body() = req.body;
  msg.prepare_payload();

  for (int tries = 0;; ++tries) {
    if (cancelled()) return fail(CallResult::Kind::cancelled, "cancelled");
    // A pooled connection may have been closed by the upstream while idle: that
    // shows as an error before any response byte; such a call is retried once on
    // a fresh connection (nothing reached the upstream's application).
    const bool reused = conn->stream.has_value() && tries == 0;
    if (!conn->stream) {
      const auto dl = std::min(t.deadline, after(t.connect_s));
      if (auto ec = conn->connect(u, dl)) return io_fail(CallResult::Kind::connect, ec, "connect to " + u.url);
    }
    conn->stream->expires_at(std::min(t.deadline, after(t.first_byte_s)));
    if (auto ec = conn->wait([&](auto h) { bhttp::async_write(*conn->stream, msg, std::move(h)); })) {
      conn->close();
      if (reused && ec != beast::error::timeout && !cancelled()) continue;
      return io_fail(CallResult::Kind::send, ec, "send to " + u.url);
    }
    bhttp::response_parser<bhttp::buffer_body> p;
    p.header_limit(64 << 10);
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (auto ec = conn->wait([&](auto h) { bhttp::async_read_header(*conn->stream, conn->buf, p, std::move(h)); })) {
      const bool nothing = !p.got_some();
      conn->close();
      if (reused && nothing && ec != beast::error::timeout && !cancelled()) continue;
      return io_fail(CallResult::Kind::header, ec, "response header from " + u.url);
    }
    const int status = (int)p.get().result_int();
    HeaderList headers;
    for (const auto& f : p.get()) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return (char)std::tolower(c); });
      headers.emplace_back(std::move(name), std::string(f.value()));
    }
    if (!on_header(status, headers)) {
      conn->close();
      return fail(CallResult::Kind::stopped, "stopped after the header", status, true);
    }
    char chunk[16 << 10];
    while (!p.is_done()) {
      conn->stream->expires_at(std::min(t.deadline, after(t.idle_s)));
      p.get().body().data = chunk;
      p.get().body().size = sizeof chunk;
      auto ec = conn->wait([&](auto h) { bhttp::async_read_some(*conn->stream, conn->buf, p, std::move(h)); });
      if (ec == bhttp::error::need_buffer) ec = {};
      const size_t n = sizeof chunk - p.get().body().size;
      if (n > 0 && !on_body(std::string_view(chunk, n))) {
        conn->close();
        return fail(CallResult::Kind::stopped, "stopped by the receiver", status, true);
      }
      if (ec) {
        conn->close();
        return io_fail(CallResult::Kind::body, ec, "response body from " + u.url, status, true);
      }
    }
    CallResult r;
    r.kind = CallResult::Kind::ok;
    r.status = status;
    r.header_seen = true;
    scope.reset();
    if (p.keep_alive() && !cancelled()) pool.release(std::move(conn));
    else conn->close();
    return r;
  }
}

Expected<std::vector<UpstreamUrl>> resolve_all(const UpstreamUrl& u) {
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto eps = resolver.resolve(u.host, u.port, tcp::resolver::numeric_service, ec);
  if (ec) return not_found("resolving '" + u.host + "': " + ec.message());
  std::vector<UpstreamUrl> out;
  for (const auto& e : eps) {
    const std::string ip = e.endpoint().address().to_string();
    auto one = parse_upstream_url("http://" + (ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":" + u.port + u.base);
    if (!one) continue;
    if (std::none_of(out.begin(), out.end(), [&](const UpstreamUrl& x) { return x.url == one->url; })) out.push_back(*one);
  }
  return out;
}

SimpleResponse simple_get(ConnectionPool& pool, const std::string& target, double timeout_s, size_t max_body,
                          const HeaderList& headers) {
  SimpleResponse out;
  CallRequest req;
  req.method = "GET";
  req.target = target;
  req.headers = headers;
  CallTimeouts t;
  t.deadline = after(timeout_s);
  t.connect_s = timeout_s;
  t.first_byte_s = timeout_s;
  t.idle_s = timeout_s;
  out.result = call(
      pool, req, t, [](int, const HeaderList&) { return true; },
      [&](std::string_view c) {
        if (out.body.size() + c.size() > max_body) return false;
        out.body.append(c);
        return true;
      });
  return out;
}

}  // namespace serval::gateway
