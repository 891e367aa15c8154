#include "net/rpc/peer_server.h"

#include <unistd.h>

#include <asio.hpp>
#include <asio/ssl.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "net/rpc/cache.h"
#include "net/rpc/detail/connection.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::rpc {
namespace {

using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;
using namespace detail;

// Closes a connection that has not completed its hello in time.
awaitable<void> watchdog(std::shared_ptr<conn_state> st, std::chrono::steady_clock::time_point deadline) {
  st->timer.expires_at(deadline);
  std::error_code ec;
  co_await st->timer.async_wait(asio::redirect_error(use_awaitable, ec));
  if (!st->alive || st->hello_done) co_return;
  TROUPE_LOG(warn, "rpc: a connection did not complete its hello in time; closing it");
  st->close();
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
  std::unordered_map<conn_state*, std::pair<std::shared_ptr<conn_state>, asio::any_io_executor>> conns;  // under mu
  bool stopping = false;  // under mu: connections handed off from now on are closed
  // The progress watches of the plain TCP data connections (the control thread's ticker walks them while
  // there are any; `ticking` is the control thread's own).
  std::mutex watch_mu;
  std::vector<std::shared_ptr<compute_watch>> watches;
  bool ticking = false;
  // TLS data connections' commands (their streams stay on the control thread).
  std::optional<asio::thread_pool> compute_pool;
  // The control thread's io_context (the acceptor, greetings and hellos, control connections, TLS streams,
  // the ticker), then one io_context per io thread, data connections spread over them (each connection's
  // work stays on one thread: no hand-off between threads per request). Declared after everything a
  // connection uses, so that destroying them (which destroys any connection still pending) happens while
  // those exist.
  std::unique_ptr<asio::io_context> control;
  std::vector<std::unique_ptr<asio::io_context>> iocs;
  std::unique_ptr<std::atomic<int>[]> conns_on_thread;  // per io thread: connections it runs
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  size_t next_ioc = 0;  // the control thread's
  std::unique_ptr<tcp::acceptor> acceptor;
  uint16_t port = 0;
  std::vector<std::thread> threads;
  bool started = false;
  bool stopped = false;

  awaitable<void> accept_loop();
  awaitable<void> connection(tcp::socket sock);
  awaitable<void> data_connection(tcp::socket sock, std::unique_ptr<frame_handler> s, read_ahead in,
                                  std::shared_ptr<conn_state> st, std::shared_ptr<compute_watch> watch,
                                  std::atomic<int>* on_thread);
  // Moves a plain TCP connection whose hello is done to an io thread; false when it could not (closed).
  bool hand_off(tcp::socket& sock, std::unique_ptr<frame_handler>& s, read_ahead& in, const std::shared_ptr<conn_state>& st);
  awaitable<void> ticker();
  void forget(const std::shared_ptr<conn_state>& st);
  void log_end(const std::string& peer, const std::exception_ptr& e);
};

awaitable<void> peer_server::impl::accept_loop() {
  for (;;) {
    tcp::socket sock(*control);
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
    asio::co_spawn(*control, connection(std::move(sock)), asio::detached);
  }
}

void peer_server::impl::forget(const std::shared_ptr<conn_state>& st) {
  st->socket = nullptr;
  st->alive = false;
  st->timer.cancel();
  {
    std::lock_guard lock(mu);
    conns.erase(st.get());
    live -= 1;
  }
  cv.notify_all();
}

void peer_server::impl::log_end(const std::string& peer, const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::system_error& x) {
    if (x.code() != asio::error::eof && x.code() != asio::error::connection_reset &&
        x.code() != asio::error::operation_aborted && x.code() != asio::error::bad_descriptor) {
      TROUPE_LOG(warn, "rpc " << peer << ": connection ended: " << x.what());
    }
  } catch (const std::exception& x) {
    TROUPE_LOG(error, "rpc " << peer << ": connection ended: " << x.what());
  }
}

// On the control thread: greeting, hello, then a control connection's frames here, a TLS data connection's
// frames here with their commands on the compute pool, or a plain TCP data connection handed to an io thread.
awaitable<void> peer_server::impl::connection(tcp::socket sock) {
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
  bool handed_off = false;
  try {
    direct_runner direct;
    read_ahead in;
    if (ssl) {
      asio::ssl::stream<tcp::socket> stream(std::move(sock), *ssl);
      st->socket = &stream.next_layer();
      co_await stream.async_handshake(asio::ssl::stream_base::server, use_awaitable);
      frame_handler s(cfg, peer);
      co_await send_greeting(stream, s, stats);
      co_await serve_frames(stream, s, *st, stats, in, direct, true);
      if (s.ready() && s.control()) {
        co_await serve_frames(stream, s, *st, stats, in, direct, false);
      } else if (s.ready()) {
        offload_runner off{compute_pool->get_executor(), opts.progress_interval, &stats};
        co_await serve_frames(stream, s, *st, stats, in, off, false);
      }
    } else {
      st->socket = &sock;
      auto s = std::make_unique<frame_handler>(cfg, peer);
      co_await send_greeting(sock, *s, stats);
      co_await serve_frames(sock, *s, *st, stats, in, direct, true);
      if (s->ready() && s->control()) {
        co_await serve_frames(sock, *s, *st, stats, in, direct, false);
      } else if (s->ready()) {
        handed_off = hand_off(sock, s, in, st);
      }
    }
  } catch (...) {
    log_end(peer, std::current_exception());
  }
  if (!handed_off) forget(st);
}

bool peer_server::impl::hand_off(tcp::socket& sock, std::unique_ptr<frame_handler>& s, read_ahead& in,
                                 const std::shared_ptr<conn_state>& old) {
  const size_t thread = next_ioc++ % iocs.size();
  auto strand = asio::make_strand(*iocs[thread]);
  std::error_code ec;
  const tcp protocol = sock.local_endpoint(ec).protocol();
  if (ec) return false;
  old->socket = nullptr;
  const int fd = sock.release(ec);
  if (ec) return false;
  tcp::socket moved(strand);
  moved.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return false;
  }
  auto st = std::make_shared<conn_state>(strand);
  st->hello_done = true;  // (its socket is set on its thread; until then stop() is seen by data_connection)
  {
    std::lock_guard lock(mu);
    if (stopping) return false;  // (moved closes the descriptor)
    conns.erase(old.get());
    conns.emplace(st.get(), std::make_pair(st, asio::any_io_executor(strand)));
  }
  old->alive = false;
  old->timer.cancel();
  auto watch = std::make_shared<compute_watch>(moved.native_handle());
  {
    std::lock_guard lock(watch_mu);
    watches.push_back(watch);
  }
  if (!ticking) {
    ticking = true;
    asio::co_spawn(*control, ticker(), asio::detached);
  }
  asio::co_spawn(strand, data_connection(std::move(moved), std::move(s), std::move(in), st, watch, &conns_on_thread[thread]),
                 asio::detached);
  return true;
}

// On an io thread: a plain TCP data connection's frames, each command run here (graphs included).
awaitable<void> peer_server::impl::data_connection(tcp::socket sock, std::unique_ptr<frame_handler> s, read_ahead in,
                                                   std::shared_ptr<conn_state> st, std::shared_ptr<compute_watch> watch,
                                                   std::atomic<int>* on_thread) {
  on_thread->fetch_add(1, std::memory_order_relaxed);
  st->socket = &sock;
  const std::string peer = s->peer();
  {
    std::lock_guard lock(mu);
    if (stopping) {
      std::error_code ec;
      sock.close(ec);  // stop() may have come before this connection's socket was set
    }
  }
  try {
    std::error_code ec;
    sock.non_blocking(true, ec);  // for the busy polling of read_ahead (async operations are unaffected)
    in.set_poll({ec ? std::chrono::microseconds(0) : opts.busy_poll, on_thread, &stats.polled_reads});
    watched_runner run{watch.get()};
    co_await serve_frames(sock, *s, *st, stats, in, run, false);
  } catch (...) {
    log_end(peer, std::current_exception());
  }
  watch->detach();
  {
    std::lock_guard lock(watch_mu);
    std::erase(watches, watch);
  }
  s.reset();  // the client's buffers, freed on this thread
  st->socket = nullptr;
  std::error_code ec;
  sock.close(ec);
  on_thread->fetch_sub(1, std::memory_order_relaxed);
  forget(st);
}

// On the control thread while there are plain TCP data connections: their progress frames.
awaitable<void> peer_server::impl::ticker() {
  asio::steady_timer t(co_await asio::this_coro::executor);
  const auto interval = std::max(opts.progress_interval, std::chrono::milliseconds(1));
  const auto period = std::max(interval / 4, std::chrono::milliseconds(1));
  std::vector<std::shared_ptr<compute_watch>> now;
  for (;;) {
    {
      std::lock_guard lock(watch_mu);
      if (watches.empty()) {
        ticking = false;
        co_return;
      }
    }
    t.expires_after(period);
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
    {
      std::lock_guard lock(watch_mu);
      now = watches;
    }
    for (const auto& w : now) w->tick(interval, stats);
    now.clear();
  }
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

  m.cfg.graph_delay = m.opts.graph_delay;

  const int n_io = std::max(1, m.opts.io_threads);
  if (m.ssl) m.compute_pool.emplace(static_cast<size_t>(n_io));
  m.control = std::make_unique<asio::io_context>(1);
  for (int i = 0; i < n_io; ++i) m.iocs.push_back(std::make_unique<asio::io_context>(1));
  m.conns_on_thread = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(n_io));
  m.acceptor = std::make_unique<tcp::acceptor>(*m.control);
  std::error_code ec;
  tcp::resolver res(*m.control);
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
  asio::co_spawn(*m.control, m.accept_loop(), asio::detached);
  std::vector<asio::io_context*> all{m.control.get()};
  for (auto& ioc : m.iocs) all.push_back(ioc.get());
  for (asio::io_context* ioc : all) {
    m.guards.push_back(asio::make_work_guard(*ioc));
    m.threads.emplace_back([ctx = ioc] {
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
  asio::post(*m.control, [&m] {
    std::error_code ec;
    m.acceptor->close(ec);
  });
  {
    std::lock_guard lock(m.mu);
    m.stopping = true;
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
  if (m.compute_pool) m.compute_pool->join();  // a TLS connection's command still running
  m.guards.clear();
  m.control->stop();
  for (auto& ioc : m.iocs) ioc->stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  // The close posted above may not have run before the control context stopped: the listening socket must not
  // outlive stop(), or the port stays taken and the kernel goes on queueing connections nobody will accept.
  std::error_code ec;
  m.acceptor->close(ec);
}

uint16_t peer_server::port() const { return impl_->port; }

std::string peer_server::address() const { return impl_->opts.host + ":" + std::to_string(port()); }

bool peer_server::tls() const { return impl_->ssl.has_value(); }

const peer_server_stats& peer_server::stats() const { return impl_->stats; }

}  // namespace troupe::rpc
