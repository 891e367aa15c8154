// Starting a peer server on 127.0.0.1 (an ephemeral port) in the test process, and waiting for conditions.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "net/rpc/peer_server.h"

namespace troupe::rpc::testing {

inline std::unique_ptr<peer_server> start_server(peer_server_options o = {}) {
  o.host = "127.0.0.1";
  if (o.devices.empty()) o.devices = {&cpu::cpu_device()};
  if (!o.make_backend) o.make_backend = [](device_i&) -> backend_ptr { return cpu::make_cpu_backend({.n_threads = 2}); };
  auto s = std::make_unique<peer_server>(std::move(o));
  s->start();
  return s;
}

// Polls pred every 5 ms for at most timeout; returns its last value.
inline bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A fresh directory under the system's temporary directory, removed with the object.
class temp_dir {
 public:
  explicit temp_dir(const std::string& prefix) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace troupe::rpc::testing
