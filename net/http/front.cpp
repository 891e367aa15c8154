// The front's server (net/http/front.h): the listener, each connection's reads under deadlines, the hand-over
// of a request that has arrived to a worker pool, and the writing of its response (whole or in chunks). A
// request's bytes become a front::request in front_request.cpp.
#include "net/http/front.h"

#include <sys/resource.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "net/http/detail/front_request.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::http::front {

namespace asio = boost::asio;
namespace bh = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using clock_type = std::chrono::steady_clock;

using detail::body_too_large;
using detail::iequals;
using detail::message;
using detail::read_refusal;
using detail::str;
using detail::to_request;

namespace {

// A header value as written: no CR or LF (a handler's value cannot start a header of its own).
std::string field_value(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c != '\r' && c != '\n') out += c;
  }
  return out;
}

std::string reason(int status) {
  const boost::string_view r = bh::obsolete_reason(bh::int_to_status(static_cast<unsigned>(status)));
  return r == "<unknown-status>" ? std::string("Status") : str(r);
}

}  // namespace

class connection;

struct listener::impl {
  impl(options o, handlers hs) : opts(std::move(o)), h(std::move(hs)), counters(o_counters()) {}
  connection_counters& o_counters() { return opts.counters ? *opts.counters : own_counters; }

  options opts;
  handlers h;
  connection_counters own_counters;
  connection_counters& counters;
  uint32_t max_connections = 0;  // opts.max_connections within what the descriptor limit allows
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_retry{ioc};
  asio::executor_work_guard<asio::io_context::executor_type> guard{ioc.get_executor()};
  std::unique_ptr<asio::thread_pool> heavy_pool, light_pool;
  std::atomic<bool> stopping{false};
  std::atomic<bool> ran{false};
  std::mutex m;
  std::unordered_set<connection*> conns;  // open connections (not the rejected ones)
  bool released = false;

  void accept();
  void close_idle();
  void release_if_done();  // with m held
};

// One client connection. Its socket, timer and state are touched on its strand only; a worker that
// writes a response posts each write to the strand and waits for it (write_wait).
class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(listener::impl& srv, tcp::socket s, bool rejected)
      : srv_(srv), opts_(srv.opts), sock_(std::move(s)), timer_(sock_.get_executor()), rejected_(rejected) {
    error_code ec;
    const tcp::endpoint ep = sock_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string();
    if (!rejected_) {
      std::lock_guard l(srv_.m);
      srv_.conns.insert(this);
      srv_.counters.open.fetch_add(1);
    }
  }
  ~connection() {
    if (rejected_) return;
    std::lock_guard l(srv_.m);
    srv_.conns.erase(this);
    srv_.counters.open.fetch_sub(1);
    srv_.release_if_done();
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  void start() {
    if (rejected_) {
      reply_error(503, "the server holds " + std::to_string(srv_.max_connections) + " connections, its limit; try again later");
      return;
    }
    read_request();
  }
  void close_if_idle() {
    if (!busy_) shutdown();
  }
  // From a worker: writes data and waits until it was handed to the kernel; false once the client is gone.
  bool write_wait(std::string data);
  asio::any_io_executor executor() { return sock_.get_executor(); }

 private:
  // What a deadline ends: a read (header or body: the read is cancelled, and on_read_error answers 408
  // when a request had begun), a write (the connection is closed, counted), or the drain after an error.
  enum class deadline { read, write, drain };
  void arm(uint32_t seconds, deadline kind) {
    const uint64_t gen = ++timer_gen_;
    expired_ = false;
    timer_.expires_after(std::chrono::seconds(seconds));
    timer_.async_wait([self = shared_from_this(), gen, kind](const error_code& ec) {
      if (ec || gen != self->timer_gen_) return;
      error_code ignore;
      if (kind == deadline::read) {
        self->expired_ = true;
        self->sock_.cancel(ignore);  // the pending read ends with operation_aborted
        return;
      }
      if (kind == deadline::write) self->srv_.counters.timed_out.fetch_add(1);
      self->sock_.close(ignore);  // the pending write or drain ends with an error
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }
  void shutdown() {
    disarm();
    error_code ignore;
    sock_.shutdown(tcp::socket::shutdown_both, ignore);
    sock_.close(ignore);
  }

  void read_request() {
    if (srv_.stopping.load()) return shutdown();
    busy_ = false;
    parser_.emplace();
    parser_->header_limit(opts_.max_header_bytes);
    parser_->body_limit(opts_.max_body_bytes);
    arm(served_ == 0 ? opts_.header_timeout_s : opts_.keep_alive_timeout_s + opts_.header_timeout_s, deadline::read);
    bh::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](const error_code& ec, size_t) { self->on_header(ec); });
  }

  void on_header(const error_code& ec) {
    disarm();
    if (ec) return on_read_error(ec);
    busy_ = true;  // a request is arriving: a stop lets it be answered
    const auto& hdr = parser_->get();
    const auto length = parser_->content_length();
    if (length && *length > opts_.max_body_bytes) {
      return reply_error(413, body_too_large(*length, opts_));
    }
    if (parser_->is_done()) return dispatch();
    if (iequals(str(hdr[bh::field::expect]), "100-continue")) {
      static const std::string go_on = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(opts_.write_timeout_s, deadline::write);
      asio::async_write(sock_, asio::buffer(go_on), [self = shared_from_this()](const error_code& wec, size_t) {
        self->disarm();
        if (wec) return self->shutdown();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    arm(opts_.read_timeout_s, deadline::read);
    bh::async_read(sock_, buf_, *parser_, [self = shared_from_this()](const error_code& ec, size_t) {
      self->disarm();
      if (ec) return self->on_read_error(ec);
      self->dispatch();
    });
  }

  void on_read_error(const error_code& ec) {
    if (std::exchange(expired_, false)) {
      // A deadline passed. A request that had begun (bytes of it arrived) is answered 408; a connection
      // that sent nothing more closes quietly, as browsers expect of their preconnections and of keep-alive
      // (a 408 there would be read as the answer to the next request they send).
      const bool header_done = parser_ && parser_->is_header_done();
      if (served_ == 0 || header_done || buf_.size() > 0) srv_.counters.timed_out.fetch_add(1);
      if (!header_done && buf_.size() == 0) return shutdown();
      return reply_error(408, header_done ? "the request body did not arrive within " + std::to_string(opts_.read_timeout_s) +
                                                " s (server.read_timeout_s)"
                                          : "the request header did not arrive within " + std::to_string(opts_.header_timeout_s) +
                                                " s (server.header_timeout_s)");
    }
    auto [status, why] = read_refusal(ec, opts_);
    if (status != 0) return reply_error(status, why);
    shutdown();  // the client closed, a deadline passed, or the server stops
  }

  // What arrived of the request so far (for an error's body and the log).
  request partial() const {
    request r;
    if (parser_ && parser_->is_header_done()) {
      const auto& hdr = parser_->get();
      r.method = str(hdr.method_string());
      const std::string target = str(hdr.target());
      r.path = target.substr(0, target.find('?'));
    }
    r.remote_addr = remote_;
    return r;
  }

  // Answers an error and closes; the client's unread bytes are drained first for a moment so that the
  // answer is not lost to a reset.
  void reply_error(int status, const std::string& message) {
    busy_ = true;
    const request r = partial();
    const std::string body = srv_.h.error ? srv_.h.error(r, status, message) : message;
    auto out = std::make_shared<std::string>("HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
                                             "\r\nContent-Type: application/json\r\nContent-Length: " +
                                             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    arm(opts_.write_timeout_s, deadline::write);
    asio::async_write(sock_, asio::buffer(*out), [self = shared_from_this(), out](const error_code& ec, size_t) {
      self->disarm();
      if (ec) return self->shutdown();
      error_code ignore;
      self->sock_.shutdown(tcp::socket::shutdown_send, ignore);
      self->arm(1, deadline::drain);
      self->drain();
    });
  }
  void drain() {
    if (!scratch_) scratch_ = std::make_unique<std::array<char, 4096>>();
    sock_.async_read_some(asio::buffer(*scratch_), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->shutdown();
      self->drain();
    });
  }

  // The request has arrived: a worker answers it.
  void dispatch() {
    message msg = parser_->release();
    const bool keep_alive_asked = msg.keep_alive();
    const bool http10 = msg.version() < 11;
    auto req = std::make_shared<request>(to_request(std::move(msg), remote_));
    ++served_;
    const bool keep_alive = keep_alive_asked && served_ < opts_.keep_alive_max;
    asio::thread_pool& pool = !srv_.h.heavy || srv_.h.heavy(*req) ? *srv_.heavy_pool : *srv_.light_pool;
    asio::post(pool, [self = shared_from_this(), req, keep_alive, http10] { self->exchange(*req, keep_alive, http10); });
  }

  // On a worker: the handler's answer, written out; then the next request (keep-alive) or the end.
  void exchange(const request& req, bool keep_alive, bool http10);

 public:
  // The status line and header of a response.
  std::string head(const response& res, bool keep_alive, bool chunked, std::optional<size_t> length) const {
    std::string h = "HTTP/1.1 " + std::to_string(res.status) + " " + reason(res.status) + "\r\n";
    if (!res.content_type.empty()) h += "Content-Type: " + field_value(res.content_type) + "\r\n";
    if (length) h += "Content-Length: " + std::to_string(*length) + "\r\n";
    if (chunked) h += "Transfer-Encoding: chunked\r\n";
    if (keep_alive) {
      h += "Connection: keep-alive\r\nKeep-Alive: timeout=" + std::to_string(opts_.keep_alive_timeout_s) + "\r\n";
    } else {
      h += "Connection: close\r\n";
    }
    for (const auto& [k, v] : res.headers) h += field_value(k) + ": " + field_value(v) + "\r\n";
    return h + "\r\n";
  }

 private:
  listener::impl& srv_;
  const options& opts_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  boost::beast::flat_buffer buf_;
  std::optional<bh::request_parser<bh::string_body>> parser_;
  std::unique_ptr<std::array<char, 4096>> scratch_;
  std::string remote_;
  uint64_t timer_gen_ = 0;
  uint32_t served_ = 0;
  bool busy_ = false;
  bool expired_ = false;  // a read deadline passed (set by the timer, read by the read's handler)
  const bool rejected_;
  std::atomic<bool> gone_{false};
};

bool connection::write_wait(std::string data) {
  if (gone_.load()) return false;
  auto done = std::make_shared<std::promise<bool>>();
  std::future<bool> ok = done->get_future();
  auto buf = std::make_shared<std::string>(std::move(data));
  asio::post(sock_.get_executor(), [self = shared_from_this(), buf, done] {
    if (!self->sock_.is_open()) return done->set_value(false);
    self->arm(self->opts_.write_timeout_s, deadline::write);
    asio::async_write(self->sock_, asio::buffer(*buf), [self, buf, done](const error_code& ec, size_t) {
      self->disarm();
      done->set_value(!ec);
    });
  });
  if (!ok.get()) gone_.store(true);
  return !gone_.load();
}

namespace {

// A writer's chunks: chunked transfer encoding, or (HTTP/1.0) the bytes as they are until the close. The
// response's head waits for the first chunk (or the end), so that a writer can still refuse.
class chunk_sink final : public body_sink {
 public:
  chunk_sink(connection& c, const response& res, bool keep_alive, bool chunked)
      : c_(c), res_(res), keep_alive_(keep_alive), chunked_(chunked) {}
  bool write(std::string_view data) override {
    if (failed_ || finished_) return false;
    if (data.empty()) return true;
    std::string out = take_head();
    if (chunked_) {
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      out += size;
      out.append(data);
      out += "\r\n";
    } else {
      out.append(data);
    }
    failed_ = !c_.write_wait(std::move(out));
    return !failed_;
  }
  bool done() override {
    if (failed_) return false;
    if (finished_) return true;
    finished_ = true;
    std::string out = take_head();
    if (chunked_) out += "0\r\n\r\n";
    if (!out.empty()) failed_ = !c_.write_wait(std::move(out));
    return !failed_;
  }
  bool started() const override { return head_sent_; }
  bool refuse(int status, std::string_view body, std::string_view content_type) override {
    if (head_sent_ || failed_ || finished_) return false;
    head_sent_ = true;
    finished_ = true;
    response r;
    r.status = status;
    r.content_type = content_type;
    r.headers = res_.headers;
    status_ = status;
    std::string out = c_.head(r, keep_alive_, false, body.size());
    out.append(body);
    failed_ = !c_.write_wait(std::move(out));
    return !failed_;
  }
  bool finished() const { return finished_ && !failed_; }
  int status() const { return status_; }
  bool failed() const { return failed_; }

 private:
  std::string take_head() {
    if (head_sent_) return {};
    head_sent_ = true;
    return c_.head(res_, keep_alive_, chunked_, std::nullopt);
  }

  connection& c_;
  const response& res_;
  const bool keep_alive_;
  const bool chunked_;
  bool head_sent_ = false;
  bool failed_ = false;
  bool finished_ = false;
  int status_ = 0;  // a refusal's status
};

}  // namespace

void connection::exchange(const request& req, bool keep_alive, bool http10) {
  const auto t0 = clock_type::now();
  response res;
  const auto fail = [&](const std::string& what) {
    TROUPE_LOG(error, "http: " << req.method << " " << req.path << ": " << what);
    res = response{};
    res.status = 500;
    res.set_content(srv_.h.error ? srv_.h.error(req, 500, what) : what, "application/json");
  };
  try {
    srv_.h.handle(req, res);
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("internal error");
  }
  keep_alive = keep_alive && !srv_.stopping.load();
  bool complete = false;
  if (!res.writer) {
    const bool head_only = req.method == "HEAD";
    std::string out = head(res, keep_alive, false, res.body.size());
    if (!head_only) out += res.body;
    complete = write_wait(std::move(out));
  } else {
    const bool chunked = !http10;
    chunk_sink sink(*this, res, keep_alive && chunked, chunked);
    bool wrote = false;
    try {
      wrote = res.writer(sink);
    } catch (const std::exception& e) {
      TROUPE_LOG(error, "http: " << req.method << " " << req.path << ": writing the answer: " << e.what());
    }
    if (!sink.started() && !sink.failed()) {
      // The writer ended without a byte and without an answer of its own (it threw, say): a 500.
      const std::string why = "the answer could not be written";
      sink.refuse(500, srv_.h.error ? srv_.h.error(req, 500, why) : why, "application/json");
    }
    if (sink.status() != 0) res.status = sink.status();
    complete = sink.finished() && (wrote || sink.status() != 0);
    keep_alive = keep_alive && chunked;  // HTTP/1.0: the close marks the body's end
  }
  if (srv_.h.log) {
    srv_.h.log(req, complete ? res.status : 499, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  const bool next = complete && keep_alive;
  asio::post(sock_.get_executor(), [self = shared_from_this(), next] {
    if (next) return self->read_request();
    self->shutdown();
  });
}

void listener::impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](const error_code& ec, tcp::socket s) {
    if (stopping.load()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors (or another passing failure): wait a moment rather than spin.
      TROUPE_LOG(warn, "http: accepting a connection: " << ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](const error_code& wec) {
        if (!wec && !stopping.load()) accept();
      });
      return;
    }
    error_code ignore;
    s.set_option(tcp::no_delay(true), ignore);
    counters.accepted.fetch_add(1);
    const bool over = counters.open.load() >= static_cast<int64_t>(max_connections);
    if (over) counters.rejected.fetch_add(1);
    auto c = std::make_shared<connection>(*this, std::move(s), over);
    asio::dispatch(c->executor(), [c] { c->start(); });
    accept();
  });
}

void listener::impl::close_idle() {
  error_code ignore;
  acceptor.close(ignore);
  accept_retry.cancel();
  std::vector<std::shared_ptr<connection>> open;
  {
    std::lock_guard l(m);
    for (connection* c : conns) {
      if (auto s = c->weak_from_this().lock()) open.push_back(std::move(s));
    }
    release_if_done();
  }
  for (auto& c : open) asio::post(c->executor(), [c] { c->close_if_idle(); });
}

void listener::impl::release_if_done() {
  if (stopping.load() && conns.empty() && !released) {
    released = true;
    guard.reset();
  }
}

listener::listener(options opts, handlers h) : impl_(std::make_shared<impl>(std::move(opts), std::move(h))) {
  impl_->heavy_pool = std::make_unique<asio::thread_pool>(std::max<uint32_t>(1, impl_->opts.worker_threads));
  impl_->light_pool = std::make_unique<asio::thread_pool>(std::max<uint32_t>(1, impl_->opts.light_threads));
}

listener::~listener() {
  stop();
  if (!impl_->ran.exchange(true)) impl_->ioc.run();  // the stop's own work (no connection was accepted)
  impl_->heavy_pool->join();
  impl_->light_pool->join();
}

int listener::bind() {
  impl& i = *impl_;
  // Every connection is a descriptor: raise the soft limit toward the hard one if the connection limit
  // needs it, and keep the limit within what it allows (with room for the model files, peers, logs).
  constexpr uint32_t reserve = 256;
  uint64_t fd_limit = 1024;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    const rlim_t want = static_cast<rlim_t>(i.opts.max_connections) + 2 * reserve;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
      rlimit raised = rl;
      raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
      if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
    }
    fd_limit = rl.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 31 : static_cast<uint64_t>(rl.rlim_cur);
  }
  i.max_connections = static_cast<uint32_t>(std::min<uint64_t>(i.opts.max_connections, fd_limit > 2 * reserve ? fd_limit - 2 * reserve : 16));
  if (i.max_connections < i.opts.max_connections) {
    TROUPE_LOG(warn, "http: at most " << i.max_connections << " connections (of max_connections = " << i.opts.max_connections
                                      << "): the process may open " << fd_limit << " descriptors (ulimit -n)");
  }
  try {
    const tcp::endpoint ep(asio::ip::make_address(i.opts.host), static_cast<unsigned short>(i.opts.port));
    i.acceptor.open(ep.protocol());
    i.acceptor.set_option(tcp::acceptor::reuse_address(true));
    i.acceptor.bind(ep);
    i.acceptor.listen(asio::socket_base::max_listen_connections);
    return i.acceptor.local_endpoint().port();
  } catch (const std::exception& e) {
    throw error("cannot listen on " + i.opts.host + ":" + std::to_string(i.opts.port) + ": " + e.what());
  }
}

void listener::run() {
  impl* i = impl_.get();
  if (i->ran.exchange(true)) return;
  asio::post(i->ioc, [i] {
    if (!i->stopping.load() && i->acceptor.is_open()) i->accept();
  });
  const auto loop = [i] {
    for (;;) {
      try {
        i->ioc.run();
        return;
      } catch (const std::exception& e) {
        TROUPE_LOG(error, "http: event loop: " << e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t k = 1; k < std::max<uint32_t>(1, i->opts.io_threads); ++k) threads.emplace_back(loop);
  loop();
  for (std::thread& t : threads) t.join();
  i->heavy_pool->join();
  i->light_pool->join();
}

void listener::stop() {
  impl* i = impl_.get();
  if (i->stopping.exchange(true)) return;
  asio::post(i->ioc, [i] { i->close_idle(); });
}

}  // namespace troupe::http::front
