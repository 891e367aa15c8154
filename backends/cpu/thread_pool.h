// A persistent pool of worker threads and a barrier that spins briefly, then sleeps.
//
//   thread_pool pool(4);                          // 3 workers + the calling thread
//   pool.run(4, [&](int ith, barrier& b) {        // ith in [0, 4); the caller runs ith == 0
//     for (node : nodes) { compute(ith, node); b.wait(); }
//   });                                            // returns when every thread has finished
//
// No thread is created per op or per graph. A job that throws on one thread breaks the barrier: the other
// threads' waits return at once, the job ends, and run() rethrows the first exception.
//
// Dispatch without locks: each worker waits on its own cache line (a generation counter) and the caller on
// a pending-thread count. Every wait spins, then yields for up to 2 ms (enough to cover the gap
// between back-to-back graphs and the imbalance between threads within an op), then sleeps on a futex
// (C++20 atomic wait), so idle workers cost nothing. Only the threads a run uses are woken.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::cpu {

class barrier {
 public:
  explicit barrier(int n = 1) : n_(n) {}
  void reset(int n);
  // Waits until all n threads have arrived (or the barrier is broken). Returns false when broken.
  bool wait();
  // Releases every waiter now and makes later waits return false until reset().
  void abort();
  bool broken() const { return broken_.load(std::memory_order_acquire); }

 private:
  int n_;
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> phase_{0};
  std::atomic<bool> broken_{false};
};

class thread_pool {
 public:
  using job = std::function<void(int ith, barrier& b)>;

  // n_threads: the most threads a job may use, the caller included (>= 1).
  explicit thread_pool(int n_threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int max_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs f on nth threads (1 <= nth <= max_threads()), the caller as ith 0; returns when all are done.
  // Rethrows the first exception any thread threw. Not reentrant: one run at a time per pool.
  void run(int nth, const job& f);

 private:
  // One per worker, on its own cache line: the caller bumps `go` to hand the worker a job.
  struct alignas(64) worker_slot {
    std::atomic<uint32_t> go{0};
  };

  void worker_main(int ith);
  void run_one(int ith, const job& f);

  std::unique_ptr<worker_slot[]> slots_;  // index ith - 1 for worker ith
  std::vector<std::thread> workers_;
  const job* job_ = nullptr;  // published by the release store to a worker's `go`
  uint32_t generation_ = 0;   // caller only
  bool stop_ = false;         // published like job_
  alignas(64) std::atomic<int> pending_{0};  // workers of the current run that have not finished
  barrier barrier_;
  std::exception_ptr error_;
  std::mutex error_mutex_;
};

}  // namespace troupe::cpu
