// The loopback proxy for links that are slow or fail (tests/support/tcp_proxy.h): bytes arrive unchanged,
// no sooner than the added latency and the bandwidth limit allow, and a cut ends the connection at both ends.
// Only lower bounds on time are asserted (a busy machine can only make things slower).
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <thread>

#include "tests/support/tcp_proxy.h"

using namespace std::chrono_literals;
using troupe::test::tcp_proxy;

namespace {

// An echo server on 127.0.0.1 for one connection at a time, until destroyed.
class echo_server {
 public:
  echo_server() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 8) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::vector<uint8_t> buf(65536);
        for (ssize_t n; (n = ::recv(c, buf.data(), buf.size(), 0)) > 0;) {
          if (::send(c, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
        }
        ::close(c);
      }
    });
  }
  ~echo_server() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Reads exactly n bytes, or fewer when the connection ends.
size_t read_n(int fd, uint8_t* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, p + done, n - done, 0);
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("the proxy forwards bytes unchanged both ways, with latency and a bandwidth limit, and cuts", "[net][proxy]") {
  echo_server echo;
  tcp_proxy proxy({.target_port = echo.port()});
  int fd = connect_to(proxy.port());

  // 1 MiB through and back, unchanged (sent from another thread: the echo fills the buffers both ways).
  std::vector<uint8_t> data(1 << 20), back(data.size());
  std::mt19937 rng(7);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  // (The sender records what send() returned; Catch's assertions are for the test's own thread.)
  ssize_t sent = -1;
  std::thread sender([&] { sent = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL); });
  CHECK(read_n(fd, back.data(), back.size()) == back.size());
  sender.join();
  CHECK(sent == static_cast<ssize_t>(data.size()));
  CHECK(back == data);
  // The proxy counts a write once send() returned, which may be after the client read it: wait (bounded).
  for (int i = 0; i < 500 && proxy.bytes_forwarded() < 2 * data.size(); ++i) std::this_thread::sleep_for(10ms);
  CHECK(proxy.bytes_forwarded() == 2 * data.size());

  // 25 ms each way: a round trip of one byte takes at least 50 ms.
  proxy.set_latency(25ms);
  uint8_t one = 42, got = 0;
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::send(fd, &one, 1, MSG_NOSIGNAL) == 1);
  REQUIRE(read_n(fd, &got, 1) == 1);
  CHECK(got == 42);
  CHECK(seconds_since(t0) >= 0.050);
  proxy.set_latency(0us);

  // 1 MB/s each way: 400 KB there and back takes at least about 0.4 s per direction, overlapped.
  proxy.set_bandwidth(1000000);
  std::vector<uint8_t> part(400000), part_back(part.size());
  for (uint8_t& b : part) b = static_cast<uint8_t>(rng());
  t0 = std::chrono::steady_clock::now();
  std::thread sender2([&] { sent = ::send(fd, part.data(), part.size(), MSG_NOSIGNAL); });
  CHECK(read_n(fd, part_back.data(), part_back.size()) == part_back.size());
  sender2.join();
  CHECK(sent == static_cast<ssize_t>(part.size()));
  CHECK(part_back == part);
  CHECK(seconds_since(t0) >= 0.35);
  proxy.set_bandwidth(0);

  // A cut ends the connection: the client's read returns (0 bytes) instead of waiting.
  proxy.cut();
  uint8_t x = 0;
  CHECK(read_n(fd, &x, 1) == 0);
  ::close(fd);

  // New connections work after a cut; refused ones end at once.
  fd = connect_to(proxy.port());
  REQUIRE(::send(fd, &one, 1, MSG_NOSIGNAL) == 1);
  CHECK(read_n(fd, &got, 1) == 1);
  ::close(fd);
  proxy.refuse(true);
  fd = connect_to(proxy.port());
  CHECK(read_n(fd, &x, 1) == 0);
  ::close(fd);
  CHECK(proxy.connections() == 3);
}
