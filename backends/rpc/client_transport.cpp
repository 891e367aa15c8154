#include "backends/rpc/client_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "backends/rpc/wire/busy_poll.h"

namespace troupe::rpc {

namespace {

using asio::ip::tcp;

std::string ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

void client_transport::fail(const std::string& what) {
  close();
  throw transport_error(what);
}

void client_transport::lost(const char* what, const std::error_code& ec) {
  fail(std::string(what) + ": " + (ec == asio::error::eof ? "connection lost (the peer closed it)"
                                                          : "connection lost: " + ec.message()));
}

void client_transport::set_fd(int fd) {
  std::lock_guard l(fd_mu_);
  fd_ = fd;
}

void client_transport::interrupt() {
  std::lock_guard l(fd_mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool client_transport::wait_readable(std::chrono::microseconds timeout, int wake_fd) {
  int fd = -1;
  {
    std::lock_guard l(fd_mu_);
    fd = fd_;
  }
  if (fd < 0) return true;
  pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  const int r = ::ppoll(p, wake_fd >= 0 ? 2 : 1, &ts, nullptr);
  if (r < 0) return errno != EINTR;  // a failed poll: let the caller's read find out why
  return r > 0 && p[0].revents != 0;
}

void client_transport::close() {
  set_fd(-1);  // before closing: interrupt() must never shut down a reused descriptor
  std::error_code ec;
  if (tls_) {
    tls_->next_layer().close(ec);
  } else if (sock_) {
    sock_->close(ec);
  }
  // Let any cancelled handler run, then drop the streams.
  ioc_.restart();
  ioc_.poll();
  tls_.reset();
  sock_.reset();
}

// Runs one asynchronous operation to completion within timeout, or fails.
template <class Start>
void client_transport::run(Start&& start, std::chrono::milliseconds timeout, const char* what) {
  std::error_code result;
  bool done = false;
  start([&](const std::error_code& ec, auto&&...) {
    result = ec;
    done = true;
  });
  ioc_.restart();
  ioc_.run_for(timeout);
  if (!done) {
    std::error_code ec;
    if (tls_) tls_->next_layer().close(ec);
    if (sock_) sock_->close(ec);
    ioc_.restart();
    ioc_.run();
    fail(std::string(what) + " timed out after " + ms(timeout));
  }
  if (result) lost(what, result);
}

void client_transport::connect(const client_options& o) {
  close();
  tcp::resolver res(ioc_);
  std::error_code ec;
  const auto endpoints = res.resolve(o.host, std::to_string(o.port), ec);
  if (ec) fail("cannot resolve " + o.host + ": " + ec.message());
  sock_ = std::make_unique<tcp::socket>(ioc_);
  run([&](auto handler) { asio::async_connect(*sock_, endpoints, handler); }, o.connect_timeout, "connecting");
  sock_->set_option(tcp::no_delay(true), ec);
  sock_->set_option(asio::socket_base::keep_alive(true), ec);
  // A decode step's reply (logits) in one write and one read: the default starting buffer (16 KiB) makes the
  // peer wait for this side to drain it several times per reply.
  sock_->set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
  sock_->set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
  if (!o.tls) sock_->non_blocking(true, ec);
  asio::socket_base::send_buffer_size sndbuf;
  sock_->get_option(sndbuf, ec);
  send_buffer_ = ec ? 0 : static_cast<size_t>(std::max(sndbuf.value(), 0));
  set_fd(sock_->native_handle());
  if (!o.tls) return;
  ssl_ctx_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  ssl_ctx_->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                        asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  try {
    if (o.tls_verify) {
      ssl_ctx_->set_verify_mode(asio::ssl::verify_peer);
      if (o.tls_ca_file.empty()) {
        ssl_ctx_->set_default_verify_paths();
      } else {
        ssl_ctx_->load_verify_file(o.tls_ca_file.string());
      }
    } else {
      ssl_ctx_->set_verify_mode(asio::ssl::verify_none);
    }
  } catch (const std::system_error& e) {
    fail(std::string("TLS setup: ") + e.what());
  }
  tls_ = std::make_unique<asio::ssl::stream<tcp::socket>>(std::move(*sock_), *ssl_ctx_);
  sock_.reset();
  if (o.tls_verify) tls_->set_verify_callback(asio::ssl::host_name_verification(o.host));
  SSL_set_tlsext_host_name(tls_->native_handle(), o.host.c_str());
  run([&](auto handler) { tls_->async_handshake(asio::ssl::stream_base::client, handler); }, o.connect_timeout,
      "TLS handshake");
}

// Plain TCP goes without the io_context: non-blocking socket calls, and poll() for readiness within the
// deadline (a request costs its system calls and nothing more). Waits until the socket is ready for
// `events`; past `deadline` the request has timed out (fails); with `wake_at`, returns false at that time
// when the socket is not ready by then.
bool client_transport::wait_ready(short events, std::chrono::steady_clock::time_point deadline,
                                  std::chrono::milliseconds timeout, const char* what,
                                  std::optional<std::chrono::steady_clock::time_point> wake_at) {
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) fail(std::string(what) + " timed out after " + ms(timeout));
    if (wake_at && now >= *wake_at) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::nanoseconds>((wake_at ? std::min(*wake_at, deadline) : deadline) - now);
    const timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    pollfd p{sock_->native_handle(), events, 0};
    const int r = ::ppoll(&p, 1, &ts, nullptr);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) fail(std::string(what) + ": poll failed: " + std::strerror(errno));
  }
}

void client_transport::write_all(std::span<const asio::const_buffer> bufs, std::chrono::milliseconds timeout) {
  if (tls_) {
    run([&](auto handler) { asio::async_write(*tls_, bufs, handler); }, timeout, "sending");
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<asio::const_buffer, 8> rest{};
  size_t n_rest = 0;
  for (const auto& b : bufs) {
    if (b.size() > 0) rest[n_rest++] = b;
  }
  size_t first = 0;
  while (first < n_rest) {
    std::error_code ec;
    size_t n = sock_->write_some(std::span<const asio::const_buffer>(rest.data() + first, n_rest - first), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      wait_ready(POLLOUT, deadline, timeout, "sending");
      continue;
    }
    if (ec) lost("sending", ec);
    while (n > 0 && first < n_rest) {
      const size_t take = std::min(n, rest[first].size());
      rest[first] += take;
      n -= take;
      if (rest[first].size() == 0) ++first;
    }
  }
}

bool client_transport::read_exact(void* p, size_t n, std::chrono::milliseconds timeout, poll_window w) {
  if (n == 0) return false;
  if (tls_) {
    run([&](auto handler) { asio::async_read(*tls_, asio::buffer(p, n), handler); }, timeout, "receiving");
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool polled = false;
  size_t done = 0;
  while (done < n) {
    std::error_code ec;
    size_t k = 0;
    auto attempt = [&] {
      k = sock_->read_some(asio::buffer(static_cast<uint8_t*>(p) + done, n - done), ec);
      return ec != asio::error::would_block && ec != asio::error::try_again;
    };
    if (!attempt()) {
      // Too early to poll: sleep until the window opens (or the bytes come).
      if (std::chrono::steady_clock::now() < w.from && wait_ready(POLLIN, deadline, timeout, "receiving", w.from)) continue;
      if (!busy_poll(w.until, attempt)) {
        wait_ready(POLLIN, deadline, timeout, "receiving");
        continue;
      }
      polled = true;
    }
    if (ec) lost("receiving", ec);
    done += k;
  }
  return polled;
}

}  // namespace troupe::rpc
