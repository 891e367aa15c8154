// Busy polling a socket for a short while before sleeping on it.
//
//   const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(250);
//   size_t n = 0;
//   std::error_code ec;
//   busy_poll(until, [&] { n = sock.read_some(buf, ec); return ec != asio::error::would_block; });
//   if (ec == asio::error::would_block) { /* nothing came in time: wait in poll()/epoll as usual */ }
//
// Why: a blocking receive on a virtual machine wakes up tens of microseconds after the bytes arrive (the
// idle vCPU sleeps until an inter-processor interrupt). Loopback round trips measured 54 us blocking against
// 7 us polling on the 2-core development VM. A decode step on a remote peer is one round trip, so for a small
// model this wake-up is a large part of the step. Polling yields the core between attempts (one
// non-blocking receive and one sched_yield, about a microsecond), so a thread the poller shares a core with
// still runs; the window bounds what polling costs when nothing comes.
#pragma once

#include <chrono>
#include <thread>

namespace troupe::rpc {

// Calls attempt() until it returns true (done: data, or an error other than "would block") or `until` has
// passed; yields the core between attempts. Returns whether attempt() returned true.
template <class Attempt>
bool busy_poll(std::chrono::steady_clock::time_point until, Attempt&& attempt) {
  for (;;) {
    if (attempt()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
}

}  // namespace troupe::rpc
