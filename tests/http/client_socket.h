// A raw client socket on 127.0.0.1 for the daemon's tests: the test decides what is sent, when, and when the
// connection drops (half requests, abandoned streams, resets).
#pragma once

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace troupe::test {

// A client socket on 127.0.0.1:port that sends and reads raw bytes; reads wait at most `timeout_s`.
class client_socket {
 public:
  explicit client_socket(int port, int timeout_s = 30) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    timeval tv{timeout_s, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~client_socket() { close_now(); }
  client_socket(const client_socket&) = delete;
  client_socket& operator=(const client_socket&) = delete;

  bool connected() const { return connected_; }
  bool send_text(const std::string& s) {
    size_t done = 0;
    while (done < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + done, s.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `text` arrived (true), or the connection ended or the read timed out (false).
  bool read_until(const std::string& text) {
    char buf[4096];
    while (got_.find(text) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return false;
      got_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // Reads to the end of the connection; true if the peer closed it (rather than the read timing out).
  bool read_to_close() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      got_.append(buf, static_cast<size_t>(n));
    }
  }
  // One whole response with a Content-Length body, removed from what was read; "" if none came.
  std::string read_response() {
    if (!read_until("\r\n\r\n")) return {};
    const size_t head_end = got_.find("\r\n\r\n") + 4;
    size_t length = 0;
    const size_t at = got_.find("Content-Length: ");
    if (at != std::string::npos && at < head_end) length = std::stoul(got_.substr(at + 16));
    while (got_.size() < head_end + length) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return {};
      got_.append(buf, static_cast<size_t>(n));
    }
    std::string r = got_.substr(0, head_end + length);
    got_.erase(0, head_end + length);
    return r;
  }
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (RST) rather than a FIN.
  void reset_now() {
    const linger lg{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close_now();
  }
  const std::string& received() const { return got_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string got_;
};

}  // namespace troupe::test
