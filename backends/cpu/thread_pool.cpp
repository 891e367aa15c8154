#include "backends/cpu/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace troupe::cpu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spin iterations before a waiter goes to sleep: long enough to cover a typical op's imbalance between
// threads (a few microseconds), short enough not to burn a core when the work is uneven.
constexpr int spin_iterations = 1 << 14;

}  // namespace

void barrier::reset(int n) {
  n_ = n;
  arrived_.store(0);
  broken_.store(false);
}

bool barrier::wait() {
  if (n_ <= 1) return !broken();
  const uint32_t phase = phase_.load(std::memory_order_acquire);
  if (broken()) return false;
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    phase_.fetch_add(1, std::memory_order_acq_rel);
    phase_.notify_all();
    return !broken();
  }
  for (int i = 0; i < spin_iterations; ++i) {
    if (phase_.load(std::memory_order_acquire) != phase) return !broken();
    cpu_relax();
  }
  while (phase_.load(std::memory_order_acquire) == phase) phase_.wait(phase, std::memory_order_acquire);
  return !broken();
}

void barrier::abort() {
  broken_.store(true, std::memory_order_release);
  phase_.fetch_add(1, std::memory_order_acq_rel);
  phase_.notify_all();
}

thread_pool::thread_pool(int n_threads) {
  const int n = n_threads < 1 ? 1 : n_threads;
  workers_.reserve(static_cast<size_t>(n - 1));
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::run_one(int ith, const job& f) {
  try {
    f(ith, barrier_);
  } catch (...) {
    {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    barrier_.abort();
  }
}

void thread_pool::run(int nth, const job& f) {
  if (nth < 1) nth = 1;
  if (nth > max_threads()) nth = max_threads();
  barrier_.reset(nth);
  error_ = nullptr;
  {
    std::lock_guard lock(mutex_);
    job_ = &f;
    job_threads_ = nth;
    pending_ = nth - 1;
    ++generation_;
  }
  if (nth > 1) wake_.notify_all();
  run_one(0, f);
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void thread_pool::worker_main(int ith) {
  uint64_t seen = 0;
  for (;;) {
    const job* f = nullptr;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (ith < job_threads_) f = job_;
    }
    if (f == nullptr) continue;
    run_one(ith, *f);
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

}  // namespace troupe::cpu
