// A CPU backend whose n-th graph (counted over every backend sharing the counter) fails, as a device fails
// mid-way: the peer server's backend in tests of failures mid-pipeline (tests/backends/rpc, tests/actors).
//
//   std::atomic<int> graphs{0}, fail_at{-1};
//   so.make_backend = [&](device_i&) -> backend_ptr { return std::make_unique<test::failing_backend>(graphs, fail_at); };
//   fail_at = graphs + 10;   // the 10th graph from now throws backend_error("injected failure of graph N")
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "backends/cpu/cpu_backend.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace troupe::test {

class failing_backend final : public backend_i {
 public:
  failing_backend(std::atomic<int>& count, std::atomic<int>& fail_at)
      : inner_(cpu::make_cpu_backend({.n_threads = 1})), count_(count), fail_at_(fail_at) {}
  std::string_view name() const override { return inner_->name(); }
  device_i& device() const override { return inner_->device(); }
  void graph_compute(graph& g) override {
    if (const int n = ++count_; n == fail_at_) throw backend_error("injected failure of graph " + std::to_string(n));
    inner_->graph_compute(g);
  }

 private:
  std::unique_ptr<cpu::cpu_backend> inner_;
  std::atomic<int>& count_;
  std::atomic<int>& fail_at_;
};

}  // namespace troupe::test
