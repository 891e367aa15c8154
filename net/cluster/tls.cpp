#include "net/cluster/tls.h"

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "net/cluster/coordinator.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::cluster {

using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;

namespace {

std::string ssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

// An encrypted key would make OpenSSL ask on the terminal: refused instead.
int no_passphrase(char*, int, int, void*) { return 0; }

using ctx_ptr = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;

ctx_ptr new_ctx() {
  ctx_ptr c(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (!c) throw error("cluster TLS: cannot create an OpenSSL context: " + ssl_errors());
  SSL_CTX_set_default_passwd_cb(c.get(), no_passphrase);
  return c;
}

constexpr auto handshake_limit = std::chrono::seconds(10);

}  // namespace

void check_tls_files(const tls_files& t, const std::array<std::string, 3>& names) {
  const std::array<const std::string*, 3> files{&t.cert, &t.key, &t.ca};
  for (size_t i = 0; i < 3; ++i) {
    if (files[i]->empty()) {
      throw error("cluster TLS: " + names[i] + " is missing (TLS on the cluster port needs " + names[0] + ", " + names[1] +
                  " and " + names[2] + ")");
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*files[i], ec)) {
      throw error("cluster TLS: " + names[i] + " '" + *files[i] + "' is not a readable file");
    }
  }
  ERR_clear_error();
  const ctx_ptr ctx = new_ctx();
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert.c_str()) != 1) {
    throw error("cluster TLS: " + names[0] + " '" + t.cert + "' is not a PEM certificate chain: " + ssl_errors());
  }
  {  // the key alone first (a context without the certificate): a file that is no key, or an encrypted one
    const ctx_ptr alone = new_ctx();
    if (SSL_CTX_use_PrivateKey_file(alone.get(), t.key.c_str(), SSL_FILETYPE_PEM) != 1) {
      throw error("cluster TLS: " + names[1] + " '" + t.key + "' is not an unencrypted PEM private key: " + ssl_errors());
    }
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), t.key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx.get()) != 1) {
    ERR_clear_error();
    throw error("cluster TLS: " + names[1] + " '" + t.key + "' is not the key of " + names[0] + " '" + t.cert + "'");
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), t.ca.c_str(), nullptr) != 1) {
    throw error("cluster TLS: " + names[2] + " '" + t.ca + "' holds no PEM CA certificate: " + ssl_errors());
  }
}

struct tls_tunnel::impl {
  impl(bool serving, const tls_files& t)
      : serving(serving), ssl(serving ? asio::ssl::context::tls_server : asio::ssl::context::tls_client) {
    // (The callers checked t with their options' names: check_tls_files. What Asio still refuses is an error.)
    try {
      ssl.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
                      asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
      ssl.use_certificate_chain_file(t.cert);
      ssl.use_private_key_file(t.key, asio::ssl::context::pem);
      ssl.load_verify_file(t.ca);
      ssl.set_verify_mode(serving ? asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert : asio::ssl::verify_peer);
    } catch (const std::system_error& e) {
      throw error(std::string("cluster TLS: ") + e.what());
    }
  }

  void failed(const std::string& what, bool handshake) {
    if (handshake) ++refused;
    {
      std::lock_guard l(mu);
      last_error = what;
    }
    // A refused client is the coordinator's to report; a node's own failures it retries every second, and
    // says once (its "does not answer" line carries last_error).
    if (serving) {
      TROUPE_LOG(warn, "cluster TLS: " << what);
    } else {
      TROUPE_LOG(debug, "cluster TLS: " << what);
    }
  }

  const bool serving;
  std::string host;          // client: the coordinator's host
  uint16_t remote_port = 0;  // client: its port
  uint16_t inner_port = 0;   // server: the coordinator's plain port on 127.0.0.1
  // Destroyed in reverse: the acceptor, then the io_context (with the connections still in its handlers),
  // then the TLS context they use.
  asio::ssl::context ssl;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  std::thread thread;
  std::atomic<uint64_t> refused{0};
  mutable std::mutex mu;
  std::string last_error;
};

namespace {

// One tunnelled connection: its TLS side and its plain side.
struct link {
  link(asio::io_context& ioc, asio::ssl::context& ctx) : tls(ioc, ctx), plain(ioc) {}
  void close() {
    std::error_code ec;
    tls.lowest_layer().close(ec);
    plain.close(ec);
  }
  asio::ssl::stream<tcp::socket> tls;
  tcp::socket plain;
};

void no_delay(tcp::socket& s) {
  std::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
}

// Copies from one side to the other until either ends; then closes both (which ends the other direction).
template <class From, class To>
awaitable<void> pump(std::shared_ptr<link> l, From& from, To& to) {
  std::vector<char> buf(64 << 10);
  try {
    for (;;) {
      const size_t n = co_await from.async_read_some(asio::buffer(buf), use_awaitable);
      co_await asio::async_write(to, asio::buffer(buf.data(), n), use_awaitable);
    }
  } catch (const std::system_error&) {
  }
  l->close();
}

void start_pumps(const std::shared_ptr<link>& l) {
  auto ex = l->plain.get_executor();
  asio::co_spawn(ex, pump(l, l->tls, l->plain), asio::detached);
  asio::co_spawn(ex, pump(l, l->plain, l->tls), asio::detached);
}

// The TLS handshake, closed when it takes longer than handshake_limit. Reports a failure to m.
awaitable<bool> handshake(tls_tunnel::impl* m, std::shared_ptr<link> l, asio::ssl::stream_base::handshake_type type,
                          const std::string& who) {
  auto late = std::make_shared<bool>(false);
  asio::steady_timer timer(l->plain.get_executor(), handshake_limit);
  timer.async_wait([l, late](std::error_code ec) {
    if (ec) return;
    *late = true;
    l->close();
  });
  try {
    co_await l->tls.async_handshake(type, use_awaitable);
  } catch (const std::system_error& e) {
    timer.cancel();
    m->failed(who + ": " + (*late ? std::string("no TLS handshake within 10 s") : std::string(e.what())), true);
    l->close();
    co_return false;
  }
  timer.cancel();
  co_return true;
}

awaitable<void> serve_one(tls_tunnel::impl* m, std::shared_ptr<link> l) {
  std::error_code ec;
  const tcp::endpoint from = l->tls.lowest_layer().remote_endpoint(ec);
  const std::string who = ec ? std::string("a client") : from.address().to_string() + ":" + std::to_string(from.port());
  no_delay(l->tls.next_layer());
  if (!co_await handshake(m, l, asio::ssl::stream_base::server, "refused a connection from " + who)) co_return;
  try {
    co_await l->plain.async_connect(tcp::endpoint(asio::ip::address_v4::loopback(), m->inner_port), use_awaitable);
  } catch (const std::system_error& e) {
    m->failed("cannot reach the coordinator at 127.0.0.1:" + std::to_string(m->inner_port) + ": " + e.what(), false);
    l->close();
    co_return;
  }
  no_delay(l->plain);
  start_pumps(l);
}

awaitable<void> connect_one(tls_tunnel::impl* m, std::shared_ptr<link> l) {
  no_delay(l->plain);
  const std::string where = m->host + ":" + std::to_string(m->remote_port);
  try {
    tcp::resolver r(l->plain.get_executor());
    const auto eps = co_await r.async_resolve(m->host, std::to_string(m->remote_port), use_awaitable);
    co_await asio::async_connect(l->tls.lowest_layer(), eps, use_awaitable);
  } catch (const std::system_error& e) {
    m->failed("cannot connect to the coordinator at " + where + ": " + e.what(), false);
    l->close();
    co_return;
  }
  no_delay(l->tls.next_layer());
  SSL_set_tlsext_host_name(l->tls.native_handle(), m->host.c_str());
  l->tls.set_verify_callback(asio::ssl::host_name_verification(m->host));
  if (!co_await handshake(m, l, asio::ssl::stream_base::client, "the TLS handshake with the coordinator at " + where + " failed")) {
    co_return;
  }
  start_pumps(l);
}

awaitable<void> accept_loop(tls_tunnel::impl* m) {
  for (;;) {
    auto l = std::make_shared<link>(m->ioc, m->ssl);
    try {
      co_await m->acceptor.async_accept(m->serving ? l->tls.lowest_layer() : l->plain, use_awaitable);
    } catch (const std::system_error& e) {
      if (!m->acceptor.is_open()) co_return;
      TROUPE_LOG(warn, "cluster TLS: accept: " << e.what());
      continue;
    }
    asio::co_spawn(m->ioc, m->serving ? serve_one(m, l) : connect_one(m, l), asio::detached);
  }
}

void listen(tls_tunnel::impl& m, const std::string& host, uint16_t port) {
  try {
    tcp::resolver r(m.ioc);
    const auto eps = r.resolve(host, std::to_string(port), tcp::resolver::passive);
    if (eps.empty()) throw error("no address");
    const tcp::endpoint ep = *eps.begin();
    m.acceptor.open(ep.protocol());
    m.acceptor.set_option(tcp::acceptor::reuse_address(true));
    m.acceptor.bind(ep);
    m.acceptor.listen();
  } catch (const std::exception& e) {
    throw error("cluster TLS: cannot listen on " + host + ":" + std::to_string(port) + ": " + e.what());
  }
}

}  // namespace

tls_tunnel::tls_tunnel(std::unique_ptr<impl> m) : m_(std::move(m)) {
  asio::co_spawn(m_->ioc, accept_loop(m_.get()), asio::detached);
  m_->thread = std::thread([m = m_.get()] { m->ioc.run(); });
}

tls_tunnel::~tls_tunnel() {
  asio::post(m_->ioc, [m = m_.get()] {
    std::error_code ec;
    m->acceptor.close(ec);
  });
  m_->ioc.stop();
  if (m_->thread.joinable()) m_->thread.join();
}

std::unique_ptr<tls_tunnel> tls_tunnel::server(const tls_files& t, const std::string& host, uint16_t port, uint16_t inner_port) {
  auto m = std::make_unique<impl>(true, t);
  m->inner_port = inner_port;
  listen(*m, host, port);
  return std::unique_ptr<tls_tunnel>(new tls_tunnel(std::move(m)));
}

std::unique_ptr<tls_tunnel> tls_tunnel::client(const tls_files& t, const std::string& host, uint16_t port) {
  auto m = std::make_unique<impl>(false, t);
  m->host = host;
  m->remote_port = port;
  listen(*m, "127.0.0.1", 0);
  return std::unique_ptr<tls_tunnel>(new tls_tunnel(std::move(m)));
}

uint16_t tls_tunnel::port() const { return m_->acceptor.local_endpoint().port(); }

uint64_t tls_tunnel::refused() const { return m_->refused.load(); }

std::string tls_tunnel::last_error() const {
  std::lock_guard l(m_->mu);
  return m_->last_error;
}

std::unique_ptr<tls_tunnel> publish_coordinator_tls(caf::actor_system& sys, const coordinator_actor& c, const std::string& host,
                                                    uint16_t port, bool has_key, const tls_files& t) {
  check_listen_host(host, has_key);
  const uint16_t inner = publish_coordinator(sys, c, "127.0.0.1", 0, has_key);
  return tls_tunnel::server(t, host, port, inner);
}

}  // namespace troupe::cluster
