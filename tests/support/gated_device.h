// A device whose allocations pass a gate: while the gate is closed, an allocation waits until it opens. A
// peer server in the test process serving it holds a model's upload in progress for as long as a test needs
// (a load that is under way, deterministically).
//
//   test::alloc_gate gate;
//   test::gated_device gated(cpu::cpu_device(), gate);
//   auto server = rpc::testing::start_server({.devices = {&gated}});
//   gate.close();  ...  gate.wait_held(60s);  ...  gate.open();
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string_view>

#include "runtime/backend.h"

namespace troupe::test {

// A gate for a device's allocations: while it is closed, an allocation that arrives waits until it is
// opened. Held there, a model's upload to a peer served by this process stays in progress for as long as
// the test needs.
class alloc_gate {
 public:
  void close() {
    std::lock_guard l(mu_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // An allocation passing: waits while the gate is closed.
  void pass() {
    std::unique_lock l(mu_);
    if (open_) return;
    ++held_;
    cv_.notify_all();
    cv_.wait(l, [this] { return open_; });
    ++passed_;
  }
  // Whether an allocation is (or was) held at the closed gate, waiting at most `limit` for one.
  bool wait_held(std::chrono::seconds limit) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, limit, [this] { return held_ > 0; });
  }
  // Held allocations that went on once the gate was opened.
  int passed() {
    std::lock_guard l(mu_);
    return passed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int held_ = 0, passed_ = 0;
};

// The CPU's buffer type, its allocations through a gate.
class gated_buffer_type final : public buffer_type_i {
 public:
  gated_buffer_type(device_i& dev, buffer_type_i& inner, alloc_gate& gate) : dev_(dev), inner_(inner), gate_(gate) {}
  std::string_view name() const override { return inner_.name(); }
  buffer_ptr alloc_buffer(size_t size) override {
    gate_.pass();
    return inner_.alloc_buffer(size);
  }
  size_t alignment() const override { return inner_.alignment(); }
  size_t max_size() const override { return inner_.max_size(); }
  size_t alloc_size(const tensor& t) const override { return inner_.alloc_size(t); }
  bool is_host() const override { return inner_.is_host(); }
  device_i& device() const override { return dev_; }

 private:
  device_i& dev_;
  buffer_type_i& inner_;
  alloc_gate& gate_;
};

// The CPU as a peer server in this process serves it, with its buffers allocated through a gate.
class gated_device final : public device_i {
 public:
  gated_device(device_i& inner, alloc_gate& gate) : inner_(inner), buft_(*this, inner.buffer_type(), gate) {}
  std::string_view name() const override { return "GatedCPU"; }
  std::string description() const override { return inner_.description(); }
  device_type type() const override { return inner_.type(); }
  device_memory memory() const override { return inner_.memory(); }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override { return inner_.init_backend(); }
  buffer_type_i& buffer_type() override { return buft_; }
  bool supports_op(const tensor& t) const override { return inner_.supports_op(t); }
  bool supports_buft(const buffer_type_i& b) const override { return &b == &buft_ || inner_.supports_buft(b); }

 private:
  device_i& inner_;
  gated_buffer_type buft_;
};

}  // namespace troupe::test
