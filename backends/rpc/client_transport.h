// The byte stream of one client connection to a peer: TCP (non-blocking, poll() for readiness, busy polling
// before sleeping) or TLS (Asio's ssl stream), every operation within a deadline. It knows nothing of
// frames or of the protocol: backends/rpc/rpc_client.cpp builds requests on it.
//
//   client_transport t;
//   t.connect(opts);                                   // throws transport_error("connecting timed out ...")
//   t.write_all(bufs, opts.io_timeout);
//   t.read_exact(p, n, opts.io_timeout, window);       // true when busy polling answered (no sleep)
//   t.interrupt();                                     // from another thread: the blocked read fails now
//
// One thread uses it at a time, except interrupt(), which any thread may call at any time.
#pragma once

#include <asio.hpp>
#include <asio/ssl.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "backends/rpc/latency_estimator.h"
#include "backends/rpc/rpc_client.h"

namespace troupe::rpc {

// The connection failed or timed out; what() says how ("receiving: connection lost (the peer closed it)").
// The transport is closed when it is thrown.
class transport_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class client_transport {
 public:
  client_transport() = default;
  ~client_transport() { close(); }
  client_transport(const client_transport&) = delete;
  client_transport& operator=(const client_transport&) = delete;

  // Resolves, connects (TCP options for small replies in one read), then the TLS handshake when o.tls,
  // each within o.connect_timeout.
  void connect(const client_options& o);
  // Idempotent. Never throws.
  void close();

  // Writes every buffer within timeout.
  void write_all(std::span<const asio::const_buffer> bufs, std::chrono::milliseconds timeout);
  // Reads exactly n bytes within timeout; plain TCP sleeps until w.from, polls until w.until, then sleeps.
  // Returns whether a read that would have slept was answered by polling.
  bool read_exact(void* p, size_t n, std::chrono::milliseconds timeout, poll_window w);

  // Shuts the socket down under a request blocked on it, from any thread: its poll sees the hang-up, the
  // read fails, and that thread closes the transport. The descriptor stays valid until then.
  void interrupt();
  // Plain TCP: waits up to timeout until the socket has bytes to read (or has failed or closed), or wake_fd
  // (when >= 0) becomes readable; true for the socket. Any thread, while another uses the transport (a
  // descriptor closed meanwhile reads as ready: the caller checks again with the transport to itself).
  bool wait_readable(std::chrono::microseconds timeout, int wake_fd = -1);
  // The socket's send buffer (bytes the kernel takes without the peer reading), known once connected.
  size_t send_buffer() const { return send_buffer_; }

 private:
  template <class Start>
  void run(Start&& start, std::chrono::milliseconds timeout, const char* what);
  bool wait_ready(short events, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                  const char* what, std::optional<std::chrono::steady_clock::time_point> wake_at = std::nullopt);
  [[noreturn]] void lost(const char* what, const std::error_code& ec);
  [[noreturn]] void fail(const std::string& what);
  void set_fd(int fd);

  asio::io_context ioc_;
  std::unique_ptr<asio::ip::tcp::socket> sock_;
  std::unique_ptr<asio::ssl::context> ssl_ctx_;
  std::unique_ptr<asio::ssl::stream<asio::ip::tcp::socket>> tls_;
  std::mutex fd_mu_;  // fd_ between interrupt() and close()
  int fd_ = -1;
  size_t send_buffer_ = 0;
};

}  // namespace troupe::rpc
