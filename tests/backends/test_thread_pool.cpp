// The CPU thread pool: every thread runs, barriers separate phases, exceptions propagate without hanging.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"

using troupe::cpu::barrier;
using troupe::cpu::thread_pool;

TEST_CASE("a job runs once on each of nth threads, the caller as thread 0", "[thread_pool]") {
  thread_pool pool(4);
  CHECK(pool.max_threads() == 4);
  for (int nth : {1, 2, 3, 4, 9}) {
    std::vector<std::atomic<int>> hits(4);
    pool.run(nth, [&](int ith, barrier&) { hits[static_cast<size_t>(ith)]++; });
    const int used = nth > 4 ? 4 : nth;
    for (int i = 0; i < 4; ++i) CHECK(hits[static_cast<size_t>(i)].load() == (i < used ? 1 : 0));
  }
}

TEST_CASE("barriers separate phases across many rounds", "[thread_pool]") {
  thread_pool pool(3);
  constexpr int rounds = 2000;
  std::vector<int> slots(3, 0);
  std::atomic<int> violations{0};
  pool.run(3, [&](int ith, barrier& b) {
    for (int r = 0; r < rounds; ++r) {
      slots[static_cast<size_t>(ith)] = r;
      b.wait();
      for (int j = 0; j < 3; ++j) {
        if (slots[static_cast<size_t>(j)] != r) violations++;
      }
      b.wait();
    }
  });
  CHECK(violations.load() == 0);
}

TEST_CASE("an exception on one thread reaches the caller and releases the others", "[thread_pool]") {
  thread_pool pool(3);
  std::atomic<int> finished{0};
  CHECK_THROWS_WITH(pool.run(3,
                             [&](int ith, barrier& b) {
                               if (ith == 1) throw std::runtime_error("kernel failed on thread 1");
                               b.wait();  // would wait forever for thread 1 if the barrier were not broken
                               finished++;
                             }),
                    "kernel failed on thread 1");
  CHECK(finished.load() == 2);
  // The pool stays usable.
  std::atomic<int> ran{0};
  pool.run(3, [&](int, barrier& b) {
    b.wait();
    ran++;
  });
  CHECK(ran.load() == 3);
}

TEST_CASE("runs alternate thread counts, and skipped and sleeping workers still join later runs", "[thread_pool]") {
  thread_pool pool(3);
  std::atomic<int> total{0};
  int expected = 0;
  for (int i = 0; i < 3000; ++i) {
    const int nth = 1 + i % 3;  // workers 1 and 2 sit out some runs
    pool.run(nth, [&](int, barrier& b) {
      b.wait();
      total++;
    });
    expected += nth;
    if (i % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let workers fall asleep
  }
  CHECK(total.load() == expected);
}
