// A blocking TCP connection to a peer server on 127.0.0.1 that speaks frames by hand: for tests that send
// what the client library never would (truncated frames, huge sizes, foreign handles...).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tests/net/rpc_frames.h"

namespace troupe::rpc::testing {

class raw_conn {
 public:
  explicit raw_conn(uint16_t port, int timeout_ms = 5000) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~raw_conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  raw_conn(const raw_conn&) = delete;
  raw_conn& operator=(const raw_conn&) = delete;

  bool connected() const { return ok_; }

  bool send_bytes(std::span<const uint8_t> b) {
    size_t done = 0;
    while (done < b.size()) {
      const ssize_t n = ::send(fd_, b.data() + done, b.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  bool send_header(uint8_t code, uint64_t size) {
    uint8_t h[frame_header_size];
    encode_header(h, code, size);
    return send_bytes(h);
  }
  bool send_frame(const frame& f) { return send_header(f.code, f.payload.size()) && send_bytes(f.payload); }

  // Reads exactly n bytes; false on close, error or timeout.
  bool read_bytes(uint8_t* p, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t k = ::recv(fd_, p + done, n - done, 0);
      if (k <= 0) return false;
      done += static_cast<size_t>(k);
    }
    return true;
  }
  // One reply frame (code = status); empty when the connection closed or timed out.
  std::optional<frame> read_frame(uint64_t max = uint64_t{1} << 28) {
    uint8_t h[frame_header_size];
    if (!read_bytes(h, sizeof h)) return std::nullopt;
    const frame_header fh = decode_header(h);
    if (fh.size > max) return std::nullopt;
    frame f;
    f.code = fh.code;
    f.payload.resize(fh.size);
    if (!read_bytes(f.payload.data(), f.payload.size())) return std::nullopt;
    return f;
  }
  // Whether the server closed the connection (recv returns 0 or an error other than a timeout).
  bool closed_by_peer() {
    uint8_t b;
    for (;;) {
      const ssize_t k = ::recv(fd_, &b, 1, 0);
      if (k == 0) return true;
      if (k < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
    }
  }
  // Reads the greeting and says hello; returns the hello reply's status.
  std::optional<status> hello(const std::string& key = {}, version v = protocol_version) {
    auto g = read_frame();
    if (!g || g->payload.size() < 14 + nonce_size) return std::nullopt;
    std::memcpy(server_nonce.data(), g->payload.data() + 14, nonce_size);
    if (!send_frame(testing::hello(server_nonce, key, v))) return std::nullopt;
    auto r = read_frame();
    if (!r) return std::nullopt;
    return static_cast<status>(r->code);
  }
  // A request and its reply.
  std::optional<frame> call(const frame& f) {
    if (!send_frame(f)) return std::nullopt;
    return read_frame();
  }
  // Closes with a reset (SO_LINGER 0), as a killed process's socket would.
  void reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd_);
    fd_ = -1;
  }

  nonce server_nonce{};

 private:
  int fd_ = -1;
  bool ok_ = false;
};

}  // namespace troupe::rpc::testing
