// backends/rpc/latency_estimator.h: when a recompute reply is polled for, from the replies before it.
#include <catch2/catch.hpp>

#include "backends/rpc/latency_estimator.h"

using namespace troupe::rpc;
using namespace std::chrono_literals;

TEST_CASE("the poll window follows a device's reply times and their spread", "[rpc][poll]") {
  latency_estimator est;
  const auto t0 = std::chrono::steady_clock::time_point{} + 1s;
  // No history: poll at once, for busy_poll.
  poll_window w = est.window(0, t0, 250us);
  CHECK(w.from == t0);
  CHECK(w.until == t0 + 250us);

  // Replies of 2 ms: the first sets mean 2 ms and deviation 2 ms / 8; the window is two deviations around it.
  est.note(0, 2ms);
  CHECK(est.mean(0) == 2ms);
  w = est.window(0, t0, 250us);
  CHECK(w.from == t0 + 2ms - 500us);
  CHECK(w.until == t0 + 2ms + 500us);
  // Steady replies shrink the spread to busy_poll at least.
  for (int i = 0; i < 64; ++i) est.note(0, 2ms);
  w = est.window(0, t0, 250us);
  CHECK(w.from == t0 + 2ms - 250us);
  CHECK(w.until == t0 + 2ms + 250us);
  // A slower reply moves the mean by 1/8 of the error.
  est.note(0, 10ms);
  CHECK(est.mean(0) == 3ms);

  // Keys are separate; replies faster than busy_poll keep the default window.
  est.note(1, 100us);
  w = est.window(1, t0, 250us);
  CHECK(w.from == t0);
  CHECK(w.until == t0 + 250us);

  est.clear();
  CHECK(est.mean(0) == 0ns);
  CHECK(est.window(0, t0, 250us).until == t0 + 250us);
}
