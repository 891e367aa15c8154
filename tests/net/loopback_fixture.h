// Helpers the loopback tests share (test_rpc_loopback, test_rpc_queue, test_rpc_handshake,
// test_rpc_connections): seeded random bytes and floats, and client options for a peer on 127.0.0.1.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/rpc/rpc_client.h"

namespace troupe::rpc::loopback_fixture {

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline client_options local(uint16_t port, std::string key = {}) {
  using namespace std::chrono_literals;
  return client_options{.host = "127.0.0.1", .port = port, .key = std::move(key), .io_timeout = 20s};
}

}  // namespace troupe::rpc::loopback_fixture
