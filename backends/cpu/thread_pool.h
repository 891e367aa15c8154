// A persistent pool of worker threads and a barrier that spins briefly, then sleeps.
//
//   thread_pool pool(4);                          // 3 workers + the calling thread
//   pool.run(4, [&](int ith, barrier& b) {        // ith in [0, 4); the caller runs ith == 0
//     for (node : nodes) { compute(ith, node); b.wait(); }
//   });                                            // returns when every thread has finished
//
// No thread is created per op or per graph. A job that throws on one thread breaks the barrier: the other
// threads' waits return at once, the job ends, and run() rethrows the first exception.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
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
  void worker_main(int ith);
  void run_one(int ith, const job& f);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const job* job_ = nullptr;
  int job_threads_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  barrier barrier_;
  std::exception_ptr error_;
  std::mutex error_mutex_;
};

}  // namespace troupe::cpu
