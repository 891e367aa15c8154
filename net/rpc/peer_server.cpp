#include "net/rpc/peer_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <type_traits>
#include <thread>
#include <unordered_map>

#include "backends/rpc/wire/busy_poll.h"
#include "net/rpc/cache.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::rpc {
namespace {

using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;

// set_tensor frames larger than this are received straight into their buffer.
constexpr uint64_t stream_threshold = 1u << 20;

void tune(tcp::socket& s) {
  std::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
  s.set_option(asio::socket_base::keep_alive(true), ec);
  s.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
  s.set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
  // A peer that vanishes without closing (a machine lost) is found in about two minutes.
  const int fd = s.native_handle();
  const int idle = 60, interval = 10, probes = 6;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

// What one connection shares with its watchdog and with server::stop(), all on the connection's strand.
struct conn_state {
  explicit conn_state(const asio::any_io_executor& ex) : timer(ex) {}
  asio::steady_timer timer;
  tcp::socket* socket = nullptr;  // the lowest layer, valid while alive
  bool alive = true;
  bool hello_done = false;

  void close() {
    if (alive && socket != nullptr) {
      std::error_code ec;
      socket->shutdown(tcp::socket::shutdown_both, ec);
      socket->close(ec);
    }
  }
};

// Closes a connection that has not completed its hello in time.
awaitable<void> watchdog(std::shared_ptr<conn_state> st, std::chrono::steady_clock::time_point deadline) {
  st->timer.expires_at(deadline);
  std::error_code ec;
  co_await st->timer.async_wait(asio::redirect_error(use_awaitable, ec));
  if (!st->alive || st->hello_done) co_return;
  TROUPE_LOG(warn, "rpc: a connection did not complete its hello in time; closing it");
  st->close();
}

template <class Stream>
awaitable<void> send_reply(Stream& stream, const reply& r, peer_server_stats& stats) {
  uint8_t hdr[frame_header_size];
  encode_header(hdr, static_cast<uint8_t>(r.st), r.size());
  const std::array<asio::const_buffer, 3> bufs{asio::buffer(hdr), asio::buffer(r.body),
                                               asio::buffer(r.tail.data(), r.tail.size())};
  co_await asio::async_write(stream, bufs, use_awaitable);
  stats.bytes_sent += frame_header_size + r.size();
}

// When a connection's reads poll the socket before sleeping on it (see busy_poll.h): for up to `window`,
// and only while the connection is alone on its io thread (polling would hold up the others).
struct poll_policy {
  std::chrono::microseconds window{0};
  const std::atomic<int>* conns_on_thread = nullptr;
  std::atomic<uint64_t>* polled = nullptr;  // counts reads that polling answered
  bool active() const { return window.count() > 0 && conns_on_thread != nullptr && conns_on_thread->load(std::memory_order_relaxed) == 1; }
};

// Bytes received ahead of the frame being read: one read usually brings a whole small frame (header and
// payload), so a request costs one receive and one send.
class read_ahead {
 public:
  explicit read_ahead(poll_policy p) : poll_(p) {}

  // Reads exactly n bytes into dst: what is buffered first, then from the stream (large reads go straight to
  // dst).
  template <class Stream>
  awaitable<void> read(Stream& stream, uint8_t* dst, size_t n) {
    const size_t take = std::min(n, end_ - begin_);
    std::memcpy(dst, buf_.data() + begin_, take);
    begin_ += take;
    dst += take;
    n -= take;
    if (n == 0) co_return;
    if (n >= buf_.size() / 2) {
      co_await asio::async_read(stream, asio::buffer(dst, n), use_awaitable);
      co_return;
    }
    begin_ = end_ = 0;
    std::optional<std::chrono::steady_clock::time_point> poll_until;
    while (end_ < n) {
      if constexpr (std::is_same_v<Stream, tcp::socket>) {
        // The socket is non-blocking (connection()); an error is left for async_read_some to report.
        if (poll_.active()) {
          if (!poll_until) poll_until = std::chrono::steady_clock::now() + poll_.window;
          std::error_code ec;
          size_t k = 0;
          busy_poll(*poll_until, [&] {
            k = stream.read_some(asio::buffer(buf_.data() + end_, buf_.size() - end_), ec);
            return ec != asio::error::would_block && ec != asio::error::try_again;
          });
          if (!ec && k > 0) {
            end_ += k;
            if (poll_.polled != nullptr) poll_.polled->fetch_add(1, std::memory_order_relaxed);
            continue;
          }
        }
      }
      end_ += co_await stream.async_read_some(asio::buffer(buf_.data() + end_, buf_.size() - end_), use_awaitable);
    }
    std::memcpy(dst, buf_.data(), n);
    begin_ = n;
  }

 private:
  poll_policy poll_;
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(64u << 10);
  size_t begin_ = 0;
  size_t end_ = 0;
};

// The frame loop of one connection.
template <class Stream>
awaitable<void> serve_frames(Stream& stream, frame_handler& s, conn_state& st, peer_server_stats& stats, poll_policy poll) {
  {
    reply g;
    g.body = s.greeting();
    co_await send_reply(stream, g, stats);
  }
  uint8_t hdr[frame_header_size];
  std::vector<uint8_t> payload;
  std::vector<uint8_t> staging;
  read_ahead in(poll);
  for (;;) {
    co_await in.read(stream, hdr, sizeof hdr);
    const frame_header h = decode_header(hdr);
    stats.bytes_received += frame_header_size + h.size;
    if (auto bad = s.check_header(h.code, h.size)) {
      co_await send_reply(stream, *bad, stats);
      co_return;
    }
    if (h.code == static_cast<uint8_t>(command::set_tensor) && h.size > stream_threshold) {
      // Streamed: the bytes go straight into the buffer once the prefix has been checked. (Smaller uploads
      // go through session::handle, where a bad prefix is reported with the next reply.)
      stats.frames += 1;
      uint8_t prefix[set_tensor_prefix];
      co_await in.read(stream, prefix, sizeof prefix);
      frame_handler::set_target t;
      try {
        t = s.begin_set_tensor(prefix, h.size - set_tensor_prefix);
      } catch (const std::exception& e) {
        TROUPE_LOG(error, "rpc " << s.peer() << ": " << e.what() << "; closing the connection (the "
                                 << h.size << " bytes that follow cannot be skipped safely)");
        co_return;
      }
      if (t.host != nullptr) {
        co_await in.read(stream, t.host, t.size);
        s.end_set_tensor(t, {});
      } else {
        staging.resize(t.size);
        co_await in.read(stream, staging.data(), staging.size());
        s.end_set_tensor(t, staging);
      }
      s.debug_set_tensor(prefix, t.size, true);
      continue;
    }
    payload.resize(h.size);  // bounded by check_header
    co_await in.read(stream, payload.data(), payload.size());
    const reply r = s.handle(h.code, payload);
    if (s.ready() && !st.hello_done) {
      st.hello_done = true;
      st.timer.cancel();
    }
    if (r.send) co_await send_reply(stream, r, stats);
    if (r.close) co_return;
  }
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  asio::io_context ioc;
  tcp::resolver res(ioc);
  std::error_code ec;
  const auto results = res.resolve(host, "0", ec);
  if (ec || results.empty()) throw error("rpc: cannot resolve '" + host + "': " + ec.message());
  for (const auto& e : results) {
    if (!e.endpoint().address().is_loopback()) return false;
  }
  return true;
}

struct peer_server::impl {
  peer_server_options opts;
  peer_server_stats stats;
  std::optional<tensor_cache> cache;
  frame_handler_config cfg;
  std::optional<asio::ssl::context> ssl;
  std::atomic<uint32_t> live{0};
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<conn_state*, std::pair<std::shared_ptr<conn_state>, asio::any_io_executor>> conns;
  // One io_context per io thread, connections spread over them (each connection's work stays on one
  // thread: no hand-off between threads per request). Declared after everything a connection uses, so that
  // destroying them (which destroys any connection still pending) happens while those exist.
  std::vector<std::unique_ptr<asio::io_context>> iocs;
  std::unique_ptr<std::atomic<int>[]> conns_on_thread;  // per io thread: connections it runs
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  size_t next_ioc = 0;
  std::unique_ptr<tcp::acceptor> acceptor;
  uint16_t port = 0;
  std::vector<std::thread> threads;
  bool started = false;
  bool stopped = false;

  awaitable<void> accept_loop();
  awaitable<void> connection(tcp::socket sock, std::atomic<int>* on_thread);
  template <class Stream>
  awaitable<void> run_frames(Stream& stream, std::shared_ptr<conn_state> st, std::string peer, poll_policy poll);
};

awaitable<void> peer_server::impl::accept_loop() {
  for (;;) {
    const size_t thread = next_ioc++ % iocs.size();
    auto strand = asio::make_strand(*iocs[thread]);
    tcp::socket sock(strand);
    std::error_code ec;
    co_await acceptor->async_accept(sock, asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (!acceptor->is_open() || ec == asio::error::operation_aborted) co_return;
      TROUPE_LOG(warn, "rpc: accept failed: " << ec.message());
      continue;
    }
    if (live.load() >= opts.max_connections) {
      TROUPE_LOG(warn, "rpc: " << opts.max_connections << " connections open; refusing another");
      sock.close(ec);
      continue;
    }
    live += 1;
    asio::co_spawn(strand, connection(std::move(sock), &conns_on_thread[thread]), asio::detached);
  }
}

template <class Stream>
awaitable<void> peer_server::impl::run_frames(Stream& stream, std::shared_ptr<conn_state> st, std::string peer, poll_policy poll) {
  frame_handler s(cfg, std::move(peer));
  co_await serve_frames(stream, s, *st, stats, poll);
}

awaitable<void> peer_server::impl::connection(tcp::socket sock, std::atomic<int>* on_thread) {
  on_thread->fetch_add(1, std::memory_order_relaxed);
  std::string peer = "?";
  {
    std::error_code ec;
    const auto ep = sock.remote_endpoint(ec);
    if (!ec) peer = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  tune(sock);
  const asio::any_io_executor ex = sock.get_executor();
  auto st = std::make_shared<conn_state>(ex);
  {
    std::lock_guard lock(mu);
    conns.emplace(st.get(), std::make_pair(st, ex));
  }
  asio::co_spawn(ex, watchdog(st, std::chrono::steady_clock::now() + opts.hello_timeout), asio::detached);
  try {
    if (ssl) {
      asio::ssl::stream<tcp::socket> stream(std::move(sock), *ssl);
      st->socket = &stream.next_layer();
      co_await stream.async_handshake(asio::ssl::stream_base::server, use_awaitable);
      co_await run_frames(stream, st, peer, poll_policy{});
      st->socket = nullptr;
    } else {
      st->socket = &sock;
      std::error_code ec;
      sock.non_blocking(true, ec);  // for the busy polling of read_ahead (async operations are unaffected)
      const poll_policy poll{ec ? std::chrono::microseconds(0) : opts.busy_poll, on_thread, &stats.polled_reads};
      co_await run_frames(sock, st, peer, poll);
      st->socket = nullptr;
    }
  } catch (const std::system_error& e) {
    if (e.code() != asio::error::eof && e.code() != asio::error::connection_reset &&
        e.code() != asio::error::operation_aborted && e.code() != asio::error::bad_descriptor) {
      TROUPE_LOG(warn, "rpc " << peer << ": connection ended: " << e.what());
    }
  } catch (const std::exception& e) {
    TROUPE_LOG(error, "rpc " << peer << ": connection ended: " << e.what());
  }
  st->socket = nullptr;
  st->alive = false;
  on_thread->fetch_sub(1, std::memory_order_relaxed);
  st->timer.cancel();
  {
    std::lock_guard lock(mu);
    conns.erase(st.get());
    live -= 1;
  }
  cv.notify_all();
}

peer_server::peer_server(peer_server_options opts) : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  m.opts = std::move(opts);
  if (m.opts.devices.empty()) throw error("rpc server: no devices to serve");
  if (m.opts.key.empty() && !m.opts.insecure && !is_loopback_host(m.opts.host)) {
    throw error("rpc server: refusing to serve on " + m.opts.host +
                ", which is not a loopback address, without a shared key: give an auth key file (anyone who can "
                "reach the port could use this machine otherwise), or --insecure to accept that");
  }
  if (!m.opts.cache_dir.empty()) m.cache.emplace(m.opts.cache_dir);
  if (!m.opts.tls_cert.empty() || !m.opts.tls_key.empty()) {
    if (m.opts.tls_cert.empty() || m.opts.tls_key.empty()) throw error("rpc server: TLS needs both a certificate and a key");
    try {
      m.ssl.emplace(asio::ssl::context::tls_server);
      m.ssl->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                         asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
      m.ssl->use_certificate_chain_file(m.opts.tls_cert.string());
      m.ssl->use_private_key_file(m.opts.tls_key.string(), asio::ssl::context::pem);
    } catch (const std::system_error& e) {
      throw error("rpc server: TLS certificate or key: " + std::string(e.what()));
    }
  }
  m.cfg.devices = m.opts.devices;
  m.cfg.make_backend = m.opts.make_backend;
  m.cfg.key = m.opts.key;
  m.cfg.cache = m.cache ? &*m.cache : nullptr;
  m.cfg.max_buffer_size = m.opts.max_buffer_size;
  m.cfg.max_connection_bytes = m.opts.max_connection_bytes;
  m.cfg.max_buffers = m.opts.max_buffers;
  m.cfg.debug = m.opts.debug;
  m.cfg.server_version = m.opts.server_version;
  m.cfg.stats = &m.stats;

  const int n_io = std::max(1, m.opts.io_threads);
  for (int i = 0; i < n_io; ++i) m.iocs.push_back(std::make_unique<asio::io_context>(1));
  m.conns_on_thread = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(n_io));
  m.acceptor = std::make_unique<tcp::acceptor>(*m.iocs[0]);
  std::error_code ec;
  tcp::resolver res(*m.iocs[0]);
  const auto results = res.resolve(m.opts.host, std::to_string(m.opts.port), ec);
  if (ec || results.empty()) throw error("rpc server: cannot resolve '" + m.opts.host + "': " + ec.message());
  const tcp::endpoint ep = results.begin()->endpoint();
  m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  if (!ec) m.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw error("rpc server: cannot listen on " + m.opts.host + ":" + std::to_string(m.opts.port) + ": " + ec.message());
  }
  m.port = m.acceptor->local_endpoint(ec).port();
}

peer_server::~peer_server() { stop(); }

void peer_server::start() {
  impl& m = *impl_;
  if (m.started) return;
  m.started = true;
  asio::co_spawn(m.acceptor->get_executor(), m.accept_loop(), asio::detached);
  for (auto& ioc : m.iocs) {
    m.guards.push_back(asio::make_work_guard(*ioc));
    m.threads.emplace_back([ctx = ioc.get()] {
      for (;;) {
        try {
          ctx->run();
          return;
        } catch (const std::exception& e) {
          TROUPE_LOG(error, "rpc server: " << e.what());
        }
      }
    });
  }
}

void peer_server::stop() {
  impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  if (!m.started) return;
  asio::post(m.acceptor->get_executor(), [&m] {
    std::error_code ec;
    m.acceptor->close(ec);
  });
  {
    std::lock_guard lock(m.mu);
    for (auto& [p, entry] : m.conns) {
      auto st = entry.first;
      asio::post(entry.second, [st] { st->close(); });
    }
  }
  {
    // Connections end on their own once closed (a graph being computed finishes first).
    std::unique_lock lock(m.mu);
    m.cv.wait_for(lock, std::chrono::seconds(30), [&m] { return m.live.load() == 0; });
  }
  m.guards.clear();
  for (auto& ioc : m.iocs) ioc->stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
}

uint16_t peer_server::port() const { return impl_->port; }

std::string peer_server::address() const { return impl_->opts.host + ":" + std::to_string(port()); }

bool peer_server::tls() const { return impl_->ssl.has_value(); }

const peer_server_stats& peer_server::stats() const { return impl_->stats; }

}  // namespace troupe::rpc
