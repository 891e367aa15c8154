#include "backends/cpu/thread_pool.h"

#include <chrono>

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

// A waiter first spins with pause for a few microseconds (a pause is ~10-40 ns): long enough for a thread
// that is running on another core to answer. Then it polls with sched_yield for up to yield_window of
// wall time (the usual imbalance between threads within an op, and the gap between back-to-back graphs:
// host work between two decode steps, or a network round trip when the graph comes from a remote client),
// and finally sleeps on the atomic (futex). Yielding early matters when the machine has fewer free cores
// than runnable threads: a spinning waiter would keep the very thread it waits for off the CPU until the
// scheduler's time slice ends, whereas a yield hands the core over at once, and costs little (one system
// call) when no other thread wants it. The window is measured in time, not in yields: a yield costs 0.3 us
// on an idle core and several microseconds when it switches threads, so a count would mean anything from
// under a millisecond to tens of them. Sleeping is what it avoids: waking a sleeping worker costs tens of
// microseconds on a virtual machine (an inter-processor interrupt to an idle vCPU), per graph.
constexpr int spin_iterations = 1 << 8;
constexpr auto yield_window = std::chrono::microseconds(2000);
constexpr int yields_per_clock_check = 8;

// Waits until a.load() != old (spin, yield, then futex). Returns the new value.
template <class T>
T wait_change(const std::atomic<T>& a, T old) {
  for (int i = 0; i < spin_iterations; ++i) {
    const T v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    cpu_relax();
  }
  const auto until = std::chrono::steady_clock::now() + yield_window;
  for (int i = 1;; ++i) {
    const T v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    std::this_thread::yield();
    if (i % yields_per_clock_check == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  T v;
  while ((v = a.load(std::memory_order_acquire)) == old) a.wait(old, std::memory_order_acquire);
  return v;
}

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
    phase_.notify_all();  // no system call unless some thread is asleep
    return !broken();
  }
  wait_change(phase_, phase);
  return !broken();
}

void barrier::abort() {
  broken_.store(true, std::memory_order_release);
  phase_.fetch_add(1, std::memory_order_acq_rel);
  phase_.notify_all();
}

thread_pool::thread_pool(int n_threads) {
  const int n = n_threads < 1 ? 1 : n_threads;
  slots_ = std::make_unique<worker_slot[]>(static_cast<size_t>(n));
  workers_.reserve(static_cast<size_t>(n - 1));
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

thread_pool::~thread_pool() {
  stop_ = true;
  ++generation_;
  for (size_t i = 0; i < workers_.size(); ++i) {
    slots_[i].go.store(generation_, std::memory_order_release);
    slots_[i].go.notify_one();
  }
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
  job_ = &f;
  ++generation_;
  pending_.store(nth - 1, std::memory_order_relaxed);
  // The release stores publish job_, the barrier and pending_ to the workers woken here.
  for (int i = 1; i < nth; ++i) {
    worker_slot& s = slots_[static_cast<size_t>(i - 1)];
    s.go.store(generation_, std::memory_order_release);
    s.go.notify_one();  // no system call unless the worker is asleep
  }
  run_one(0, f);
  for (int left = pending_.load(std::memory_order_acquire); left != 0;) left = wait_change(pending_, left);
  job_ = nullptr;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void thread_pool::worker_main(int ith) {
  worker_slot& slot = slots_[static_cast<size_t>(ith - 1)];
  uint32_t seen = 0;
  for (;;) {
    seen = wait_change(slot.go, seen);
    if (stop_) return;
    run_one(ith, *job_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace troupe::cpu
