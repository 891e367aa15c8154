// Helpers the daemon tests share (test_daemon_failures, test_daemon_peer): a raw HTTP request on a socket of
// its own, and a bounded wait for a condition.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "tests/http/client_socket.h"

namespace troupe::test {

// A raw HTTP/1.1 request on its own socket, so that the test decides when the connection drops.
class raw_request : public test::client_socket {
 public:
  raw_request(int port, const std::string& path, const std::string& body) : client_socket(port) {
    REQUIRE(connected());
    REQUIRE(send_text("POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body));
  }
};

// Polls until pred() holds (true) or 20 s passed.
template <class Pred>
inline bool eventually(Pred pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace troupe::test
