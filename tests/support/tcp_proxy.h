// A TCP proxy on 127.0.0.1 for tests: forwards every connection to a target port, with latency added to each
// direction, a bandwidth limit per direction, and connections cut or refused on demand, so that the RPC path
// (and the cluster) is tested under slow and failing links without touching the machine's network settings.
//
//   test::tcp_proxy proxy({.target_port = peer.port(), .latency = std::chrono::milliseconds(2)});
//   rpc::add_peer("127.0.0.1:" + std::to_string(proxy.port()));   // the client talks to the proxy
//   proxy.cut();         // every open connection closed now (both ends see it); new ones are accepted
//   proxy.refuse(true);  // new connections are closed as soon as they are accepted
//
// Bytes read from one end at time t are written to the other at t + latency, no faster than
// bytes_per_second. A thread per direction of each connection; all of them stop with the proxy.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

class tcp_proxy {
 public:
  struct options {
    uint16_t target_port = 0;
    std::chrono::microseconds latency{0};  // added to each direction
    uint64_t bytes_per_second = 0;         // per direction; 0: unlimited
  };

  explicit tcp_proxy(options o) : target_port_(o.target_port), latency_us_(o.latency.count()), bps_(o.bytes_per_second) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error(std::string("tcp_proxy: socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = loopback(0);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0) {
      const std::string why = std::strerror(errno);
      ::close(listen_fd_);
      throw std::runtime_error("tcp_proxy: bind/listen: " + why);
    }
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~tcp_proxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    cut();
    std::lock_guard lock(mu_);
    for (link& l : links_) {
      for (std::thread& t : l.pumps) t.join();
      ::close(l.a);
      ::close(l.b);
    }
  }

  tcp_proxy(const tcp_proxy&) = delete;
  tcp_proxy& operator=(const tcp_proxy&) = delete;

  uint16_t port() const { return port_; }
  void set_latency(std::chrono::microseconds l) { latency_us_ = l.count(); }
  void set_bandwidth(uint64_t bytes_per_second) { bps_ = bytes_per_second; }
  // Closes every open connection now: both ends see the connection end (reads return 0 or fail).
  void cut() {
    std::lock_guard lock(mu_);
    for (link& l : links_) {
      ::shutdown(l.a, SHUT_RDWR);
      ::shutdown(l.b, SHUT_RDWR);
    }
  }
  void refuse(bool on) { refuse_ = on; }
  uint64_t connections() const { return accepted_; }
  uint64_t bytes_forwarded() const { return forwarded_; }

 private:
  struct link {
    int a = -1, b = -1;  // the accepted connection, the one to the target
    std::vector<std::thread> pumps;
  };
  struct chunk {
    std::chrono::steady_clock::time_point due;
    std::vector<uint8_t> bytes;
    size_t sent = 0;
  };

  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++accepted_;
      if (refuse_) {
        ::close(c);
        continue;
      }
      const int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a = loopback(target_port_);
      if (t < 0 || ::connect(t, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (t >= 0) ::close(t);
        ::close(c);
        continue;
      }
      const int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ::setsockopt(t, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard lock(mu_);
      link& l = links_.emplace_back();
      l.a = c;
      l.b = t;
      l.pumps.emplace_back([this, c, t] { pump(c, t); });
      l.pumps.emplace_back([this, c, t] { pump(t, c); });
    }
  }

  // Forwards src to dst: what is read is queued with the time it is due, and written when due.
  void pump(int src, int dst) {
    using clock = std::chrono::steady_clock;
    std::deque<chunk> queue;
    size_t queued = 0;
    bool eof = false;
    clock::time_point next_send = clock::now();  // the bandwidth limit's earliest next write
    std::vector<uint8_t> buf(64 * 1024);
    for (;;) {
      if (eof && queue.empty()) {
        ::shutdown(dst, SHUT_WR);
        return;
      }
      const auto now = clock::now();
      // Write what is due.
      if (!queue.empty() && queue.front().due <= now && next_send <= now) {
        chunk& ch = queue.front();
        const uint64_t bps = bps_;
        size_t n = ch.bytes.size() - ch.sent;
        if (bps > 0) n = std::min<size_t>(n, std::max<uint64_t>(bps / 100, 1));  // about 10 ms worth at a time
        const ssize_t w = ::send(dst, ch.bytes.data() + ch.sent, n, MSG_NOSIGNAL);
        if (w <= 0) {
          ::shutdown(src, SHUT_RDWR);
          return;
        }
        ch.sent += static_cast<size_t>(w);
        forwarded_ += static_cast<uint64_t>(w);
        if (bps > 0) next_send = std::max(next_send, now) + std::chrono::microseconds(static_cast<int64_t>(w) * 1000000 / static_cast<int64_t>(bps));
        if (ch.sent == ch.bytes.size()) {
          queued -= ch.bytes.size();
          queue.pop_front();
        }
        continue;
      }
      // Wait for bytes to read (unless 16 MiB are queued already) or until the next write is due.
      int timeout_ms = 50;
      if (!queue.empty()) {
        const auto at = std::max(queue.front().due, next_send);
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(at - now).count() + 1, 0, 50));
        if (at <= now) timeout_ms = 0;
      }
      pollfd p{src, static_cast<short>(!eof && queued < (16u << 20) ? POLLIN : 0), 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno != EINTR) return;
      if (r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = ::recv(src, buf.data(), buf.size(), 0);
        if (n <= 0) {
          eof = true;
          if (n < 0) {  // a reset: the other end goes too, queued bytes are dropped
            ::shutdown(dst, SHUT_RDWR);
            return;
          }
          continue;
        }
        chunk ch;
        ch.due = clock::now() + std::chrono::microseconds(latency_us_.load());
        ch.bytes.assign(buf.begin(), buf.begin() + n);
        queued += ch.bytes.size();
        queue.push_back(std::move(ch));
      }
    }
  }

  uint16_t target_port_ = 0;
  uint16_t port_ = 0;
  std::atomic<int64_t> latency_us_{0};
  std::atomic<uint64_t> bps_{0};
  std::atomic<bool> stop_{false}, refuse_{false};
  std::atomic<uint64_t> accepted_{0}, forwarded_{0};
  int listen_fd_ = -1;
  std::thread acceptor_;
  std::mutex mu_;
  std::list<link> links_;
};

}  // namespace troupe::test
