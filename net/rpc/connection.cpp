// The parts of a peer server connection (net/rpc/detail/connection.h) that are not templates: TCP options, and
// the progress frames the control thread writes for a plain TCP connection whose command runs long.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "net/rpc/detail/connection.h"

namespace troupe::rpc::detail {

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

void compute_watch::tick(std::chrono::milliseconds interval, peer_server_stats& stats) {
  std::lock_guard l(mu_);
  const auto now = clock::now();
  if (fd_ < 0 || !running_ || now - last_ < interval) return;
  const auto frame = progress_frame(now - started_);
  // The io thread is inside the command and writes nothing until end(), which waits for this lock. A frame
  // is written whole or not at all: a socket with no room (a client that does not read) skips this one; one
  // begun must be finished, and a connection where it cannot be within a few seconds is shut down (its
  // byte stream would be torn).
  size_t done = 0;
  const auto give_up = now + std::chrono::seconds(5);
  while (done < frame.size()) {
    const ssize_t n = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (done == 0) return;
      if (clock::now() >= give_up) {
        TROUPE_LOG(warn, "rpc: a client does not read its connection; closing it (a progress frame is half written)");
        ::shutdown(fd_, SHUT_RDWR);
        return;
      }
      pollfd p{fd_, POLLOUT, 0};
      (void)::poll(&p, 1, 100);
      continue;
    }
    return;  // the connection failed: its own reads and writes report it
  }
  last_ = now;
  stats.progress_frames += 1;
}

}  // namespace troupe::rpc::detail
