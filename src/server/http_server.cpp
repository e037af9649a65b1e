#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <algorithm>
#include <cctype>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

namespace serval::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

namespace {

constexpr size_t kMaxQueuedStreamBytes = 8u << 20;  // a client that stops reading is cut off past this

const char* reason_of(int status) {
  return bhttp::obsolete_reason(static_cast<bhttp::status>(status)).data();
}

using BeastRequest = bhttp::request<bhttp::string_body>;

void set_limits(bhttp::request_parser<bhttp::string_body>& p, const HttpServerConfig& cfg) {
  p.header_limit((std::uint32_t)std::min<size_t>(cfg.max_header_bytes, UINT32_MAX));
  p.body_limit((std::uint64_t)cfg.max_body_bytes);
}

// The answer to a parse error of a request that had started (not EOF/timeout).
std::pair<int, std::string> rejection(const beast::error_code& ec, const HttpServerConfig& cfg) {
  if (ec == bhttp::error::header_limit) return {431, "request headers are too large"};
  if (ec == bhttp::error::body_limit)
    return {413, "request body is too large (limit " + std::to_string(cfg.max_body_bytes) + " bytes)"};
  return {400, "malformed HTTP request: " + ec.message()};
}

HttpRequest to_http_request(BeastRequest&& msg) {
  HttpRequest req;
  req.method = std::string(msg.method_string());
  std::string target(msg.target());
  const auto q = target.find('?');
  req.path = target.substr(0, q);
  if (q != std::string::npos) req.query = target.substr(q + 1);
  for (const auto& f : msg) {
    std::string name(f.name_string());
    for (auto& c : name) c = (char)std::tolower((unsigned char)c);
    req.headers.emplace_back(std::move(name), std::string(f.value()));
  }
  req.body = std::move(msg.body());
  return req;
}

}  // namespace

ParsedHttpRequest parse_http_request(std::string_view bytes, const HttpServerConfig& cfg) {
  ParsedHttpRequest out;
  bhttp::request_parser<bhttp::string_body> p;
  set_limits(p, cfg);
  p.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (!p.is_done() && used < bytes.size()) {
    const size_t n = p.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == bhttp::error::need_more) break;
    if (ec) {
      std::tie(out.status, out.message) = rejection(ec, cfg);
      return out;
    }
    if (n == 0) break;
    used += n;
  }
  if (!p.is_done()) {
    out.status = 408;  // what the server answers once --read-timeout expires
    out.message = "request timed out";
    return out;
  }
  out.consumed = used;
  out.keep_alive = p.get().keep_alive();
  out.request = to_http_request(p.release());
  return out;
}

struct HttpServer::Impl {
  HttpServerConfig cfg;
  Handler handler;
  ErrorBody error_body;
  net::io_context ioc;
  // On a strand of its own: the accept handler (which starts the next
  // accept) and stop()'s close run on different I/O threads otherwise, and an
  // acceptor is not safe to use from two threads at once.
  tcp::acceptor acceptor{net::make_strand(ioc)};
  std::atomic<size_t> n_conns{0};
  std::atomic<bool> accepting{true};
  std::vector<std::thread> threads;

  void do_accept();
};

namespace {

class Session;

// The per-request handle given to the handler. Holds the session weakly and a
// request number, so a late call for a finished request does nothing.
class Channel : public ResponseChannel {
 public:
  Channel(std::weak_ptr<Session> s, uint64_t req_no) : s_(std::move(s)), req_no_(req_no) {}
  void send(int status, std::string content_type, std::string body, Headers extra) override;
  void start_stream(int status, std::string content_type, Headers extra) override;
  void write(std::string data) override;
  void end() override;
  void on_disconnect(std::function<void()> fn) override;
  bool disconnected() const override { return gone_.load(); }

  void fire_disconnect() {
    if (gone_.exchange(true)) return;
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn = std::move(on_gone_);
    }
    if (fn) fn();
  }

 private:
  std::weak_ptr<Session> s_;
  uint64_t req_no_;
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  std::function<void()> on_gone_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket sock, HttpServer::Impl* srv) : stream_(std::move(sock)), srv_(srv) {
    ++srv_->n_conns;
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Session() { --srv_->n_conns; }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // --- called through Channel, from any thread: hop onto the strand ---
  void post_send(uint64_t req_no, int status, std::string ct, std::string body, Headers extra) {
    net::post(stream_.get_executor(), [self = shared_from_this(), req_no, status, ct = std::move(ct),
                                       body = std::move(body), extra = std::move(extra)]() mutable {
      if (req_no != self->req_no_ || self->responded_) return;
      self->responded_ = true;
      self->write_full(status, std::move(ct), std::move(body), extra, self->keep_alive_);
    });
  }
  void post_start_stream(uint64_t req_no, int status, std::string ct, Headers extra) {
    net::post(stream_.get_executor(), [self = shared_from_this(), req_no, status, ct = std::move(ct),
                                       extra = std::move(extra)]() mutable {
      if (req_no != self->req_no_ || self->responded_) return;
      self->responded_ = true;
      self->streaming_ = true;
      std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_of(status) + "\r\n";
      head += "Content-Type: " + ct + "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
      for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
      head += self->keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      self->queue(std::move(head));
    });
  }
  void post_write(uint64_t req_no, std::string data) {
    if (data.empty()) return;
    net::post(stream_.get_executor(), [self = shared_from_this(), req_no, data = std::move(data)]() mutable {
      if (req_no != self->req_no_ || !self->streaming_ || self->stream_ended_) return;
      char hex[20];
      std::snprintf(hex, sizeof hex, "%zx\r\n", data.size());
      self->queue(std::string(hex) + data + "\r\n");
    });
  }
  void post_end(uint64_t req_no) {
    net::post(stream_.get_executor(), [self = shared_from_this(), req_no] {
      if (req_no != self->req_no_ || !self->streaming_ || self->stream_ended_) return;
      self->stream_ended_ = true;
      self->queue("0\r\n\r\n");
    });
  }

 private:
  void do_read() {
    parser_.emplace();
    set_limits(*parser_, srv_->cfg);
    stream_.expires_after(std::chrono::seconds(first_request_ ? srv_->cfg.read_timeout_s : srv_->cfg.idle_timeout_s));
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  // Headers are in: answer `Expect: 100-continue` (curl sends it for large
  // bodies and waits for it), then read the body within the read timeout.
  void on_header(beast::error_code ec, size_t) {
    if (ec) return on_read(ec, 0);
    // The deadline set in do_read() keeps running: headers and body together.
    const auto& h = parser_->get();
    auto expect = h[bhttp::field::expect];
    if (beast::iequals(expect, "100-continue") && !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code wec, size_t) {
        if (wec) return self->close();
        bhttp::async_read(self->stream_, self->buffer_, *self->parser_,
                          beast::bind_front_handler(&Session::on_read, self));
      });
      return;
    }
    bhttp::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset) return close();
    if (ec == beast::error::timeout) {
      // Slow or idle client: a request that had started gets a 408.
      if (parser_ && parser_->got_some()) return reject(408, "request timed out");
      return close();
    }
    if (ec) {
      if (ec == bhttp::error::header_limit || ec == bhttp::error::body_limit || (parser_ && parser_->got_some())) {
        auto [status, message] = rejection(ec, srv_->cfg);
        return reject(status, message);
      }
      return close();
    }
    first_request_ = false;
    keep_alive_ = parser_->get().keep_alive();
    HttpRequest req = to_http_request(parser_->release());
    req.remote = remote_;
    ++req_no_;
    responded_ = streaming_ = stream_ended_ = false;
    channel_ = std::make_shared<Channel>(weak_from_this(), req_no_);
    // While the handler works (maybe for minutes, streaming), notice a client
    // that goes away.
    stream_.expires_never();
    watch();
    srv_->handler(std::move(req), channel_);
  }

  // Reads while a response is pending: EOF/error = the client is gone; data
  // (a pipelined request) is kept in buffer_ for the next parse.
  void watch() {
    if (watching_ || buffer_.size() > 64 * 1024) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (ec == net::error::operation_aborted && self->waiting_for_watch_) {
        // Cancelled by on_response_done(): the response is out; parse the next request.
        self->waiting_for_watch_ = false;
        return self->do_read();
      }
      if (ec) {
        if (self->channel_) self->channel_->fire_disconnect();
        return self->close();
      }
      self->buffer_.commit(n);
      if (self->waiting_for_watch_) {
        self->waiting_for_watch_ = false;
        return self->do_read();
      }
      if (!self->response_complete()) self->watch();
    });
  }

  bool response_complete() const { return responded_ && out_.empty() && !writing_ && (!streaming_ || stream_ended_); }

  void write_full(int status, std::string ct, std::string body, const Headers& extra, bool keep_alive) {
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_of(status) + "\r\n";
    head += "Content-Type: " + ct + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
    head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    queue(head + body);
  }

  void queue(std::string data) {
    queued_bytes_ += data.size();
    out_.push_back(std::move(data));
    if (queued_bytes_ > kMaxQueuedStreamBytes) {
      // The client is not reading; treat it as gone rather than buffer without bound.
      if (channel_) channel_->fire_disconnect();
      return close();
    }
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    net::async_write(stream_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->queued_bytes_ -= self->out_.front().size();
      self->out_.pop_front();
      if (ec) {
        if (self->channel_) self->channel_->fire_disconnect();
        return self->close();
      }
      if (!self->out_.empty()) return self->do_write();
      if (self->response_complete()) self->on_response_done();
    });
  }

  void on_response_done() {
    channel_.reset();
    if (!keep_alive_ || closing_) return close();
    if (watching_) {
      // The watch read is still pending (the next request may already sit in
      // buffer_): cancel it — no write is pending now — and parse from there.
      waiting_for_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    do_read();
  }

  void reject(int status, const std::string& message) {
    keep_alive_ = false;
    responded_ = true;
    closing_ = true;
    stream_.expires_after(std::chrono::seconds(5));
    write_full(status, "application/json", srv_->error_body(status, message), {}, false);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* srv_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<Channel> channel_;
  std::deque<std::string> out_;
  size_t queued_bytes_ = 0;
  std::string remote_;
  uint64_t req_no_ = 0;
  bool keep_alive_ = true, responded_ = false, streaming_ = false, stream_ended_ = false;
  bool writing_ = false, watching_ = false, waiting_for_watch_ = false, closing_ = false, closed_ = false;
  bool first_request_ = true;
};

void Channel::send(int status, std::string content_type, std::string body, Headers extra) {
  if (auto s = s_.lock()) s->post_send(req_no_, status, std::move(content_type), std::move(body), std::move(extra));
}
void Channel::start_stream(int status, std::string content_type, Headers extra) {
  if (auto s = s_.lock()) s->post_start_stream(req_no_, status, std::move(content_type), std::move(extra));
}
void Channel::write(std::string data) {
  if (gone_) return;
  if (auto s = s_.lock()) s->post_write(req_no_, std::move(data));
}
void Channel::end() {
  if (auto s = s_.lock()) s->post_end(req_no_);
}
void Channel::on_disconnect(std::function<void()> fn) {
  bool call_now = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (gone_) call_now = true;
    else on_gone_ = fn;
  }
  if (call_now && fn) fn();
}

}  // namespace

void HttpServer::Impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (!acceptor.is_open()) return;
    if (!ec) {
      if (accepting && n_conns < cfg.max_connections) {
        beast::error_code ignored;
        sock.set_option(tcp::no_delay(true), ignored);  // tokens go out as they are made
        std::make_shared<Session>(std::move(sock), this)->start();
      } else {
        beast::error_code ignored;
        sock.close(ignored);
      }
    }
    do_accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  stop();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
}

Expected<std::unique_ptr<HttpServer>> HttpServer::create(HttpServerConfig cfg, Handler handler, ErrorBody error_body) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->handler = std::move(handler);
  impl->error_body = std::move(error_body);
  beast::error_code ec;
  auto addr = net::ip::make_address(cfg.host, ec);
  if (ec) return invalid_argument("--host: '" + cfg.host + "' is not an IP address");
  tcp::endpoint ep(addr, cfg.port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return io_error("cannot listen on " + cfg.host + ":" + std::to_string(cfg.port) + ": " + ec.message());
  impl->do_accept();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void HttpServer::run() {
  for (int i = 1; i < impl_->cfg.n_threads; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
  impl_->threads.clear();
}

void HttpServer::stop_accepting() { impl_->accepting = false; }

void HttpServer::stop() {
  net::post(impl_->acceptor.get_executor(), [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->ioc.stop();
}

size_t HttpServer::n_connections() const { return impl_->n_conns.load(); }

}  // namespace serval::http
