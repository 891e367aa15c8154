// When to poll for a reply whose latency repeats: a decode step's graph_recompute takes about as long as the
// last ones on the same device. Per key (a device index), a moving average of the latency and of its
// deviation, as TCP estimates round-trip times (RFC 6298: gains 1/8 and 1/4). The reply is polled for from
// two deviations before the expected time to two after it, and slept on before: waking up costs tens of
// microseconds on a virtual machine (backends/rpc/wire/busy_poll.h), a core spinning for milliseconds costs more.
//
//   latency_estimator est;
//   const auto sent = clock::now();
//   poll_window w = est.window(0, sent, busy_poll);   // no history yet: poll at once, for busy_poll
//   ...                                                // the reply came after `took`
//   est.note(0, took);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>

namespace troupe::rpc {

// A read sleeps on the socket until `from`, polls it until `until`, then sleeps again.
struct poll_window {
  std::chrono::steady_clock::time_point from, until;
};

class latency_estimator {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // The window for a reply sent at `sent`: polling at once for busy_poll while the key has no history or
  // its replies come within busy_poll anyway.
  poll_window window(uint32_t key, time_point sent, std::chrono::nanoseconds busy_poll) const {
    const auto it = estimates_.find(key);
    if (it == estimates_.end() || it->second.mean <= busy_poll) return {sent, sent + busy_poll};
    const estimate& e = it->second;
    const std::chrono::nanoseconds margin = std::max<std::chrono::nanoseconds>(busy_poll, 2 * e.deviation);
    return {sent + e.mean - std::min(margin, e.mean), sent + e.mean + margin};
  }

  // A reply for `key` took `took`.
  void note(uint32_t key, std::chrono::nanoseconds took) {
    auto [it, fresh] = estimates_.try_emplace(key, estimate{took, took / 8});
    if (fresh) return;
    estimate& e = it->second;
    const std::chrono::nanoseconds error = took - e.mean;
    e.mean += error / 8;
    e.deviation += (std::chrono::abs(error) - e.deviation) / 4;
  }

  // Forgets every key (a new connection: the peer's timing may differ).
  void clear() { estimates_.clear(); }

  std::chrono::nanoseconds mean(uint32_t key) const {
    const auto it = estimates_.find(key);
    return it == estimates_.end() ? std::chrono::nanoseconds{0} : it->second.mean;
  }

 private:
  struct estimate {
    std::chrono::nanoseconds mean{0};
    std::chrono::nanoseconds deviation{0};
  };
  std::map<uint32_t, estimate> estimates_;
};

}  // namespace troupe::rpc
