#include "tests/backends/cuda/host_lanes.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define TROUPE_LANES_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define TROUPE_LANES_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(TROUPE_LANES_ASAN)
#define TROUPE_LANES_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(TROUPE_LANES_TSAN)
#define TROUPE_LANES_TSAN 1
#endif
#endif
#if defined(TROUPE_LANES_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(TROUPE_LANES_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace troupe::test::lanes {

namespace {

using detail::op;

// A lane's stack: the kernels' frames need a few KiB, an exception or an error report under the sanitizers
// some tens. Pages are mapped as they are touched.
constexpr size_t stack_bytes = size_t{128} << 10;
constexpr int host = -1;  // the context that called launch, as a lane index

enum class state : uint8_t { ready, at_warp, at_block, done };

// Thrown in the lanes of a launch that ends early (an error in any lane): it unwinds each to its loop.
struct cancelled {};

// An execution context: a lane's fiber or the thread that called launch.
struct context {
  ucontext_t uc{};
  void* fake_stack = nullptr;          // ASan's fake stack of this context while it is switched out
  const void* stack_bottom = nullptr;  // its stack, which ASan is told of when switching to it
  size_t stack_size = 0;
  void* tsan_fiber = nullptr;
};

struct lane {
  context ctx;
  void* mapping = nullptr;  // its stack, above a guard page
  size_t mapping_bytes = 0;
  state st = state::done;
  // The warp collective it waits at and, once complete, its result.
  op o = op::sync;
  unsigned mask = 0;
  int arg = 0;
  int width = warpSize;
  uint64_t value = 0;
  uint64_t result = 0;
};

const char* name_of(op o) {
  switch (o) {
    case op::shfl_idx: return "__shfl_sync";
    case op::shfl_up: return "__shfl_up_sync";
    case op::shfl_down: return "__shfl_down_sync";
    case op::shfl_xor: return "__shfl_xor_sync";
    case op::ballot: return "__ballot_sync";
    case op::any: return "__any_sync";
    case op::all: return "__all_sync";
    case op::sync: return "__syncwarp";
  }
  return "a warp collective";
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void lane_main(int index);

// The lanes of this OS thread (fibers kept from launch to launch, as many as the largest block so far) and
// the launch in progress.
class scheduler {
 public:
  scheduler() = default;
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  ~scheduler() {
    for (auto& l : lanes_) {
#if defined(TROUPE_LANES_TSAN)
      __tsan_destroy_fiber(l->ctx.tsan_fiber);
#endif
      munmap(l->mapping, l->mapping_bytes);
    }
  }

  void launch(dim3 grid, dim3 block, mode m, const std::function<void()>& kernel) {
    if (active_) throw std::logic_error("lanes: a launch from inside a kernel (dynamic parallelism is not emulated)");
    const uint64_t count = uint64_t{block.x} * block.y * block.z;
    if (count == 0 || count > 1024 || block.z > 64) {
      throw std::logic_error("lanes: a block of " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" +
                             std::to_string(block.z) + " threads (CUDA allows 1 to 1024, z up to 64)");
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
      throw std::logic_error("lanes: a grid of " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                             std::to_string(grid.z) + " blocks (outside CUDA's limits)");
    }
    struct end_of_launch {
      scheduler& s;
      ~end_of_launch() {
        s.active_ = false;
        s.kernel_ = nullptr;
        s.current_ = host;
      }
    } end{*this};
    active_ = true;
    kernel_ = &kernel;
    mode_ = m;
    block_ = block;
    count_ = static_cast<unsigned>(count);
    error_ = nullptr;
    cancelled_ = false;
    gridDim = grid;
    blockDim = block;
    if (m == mode::cooperative) {
      grow(count_);
#if defined(TROUPE_LANES_TSAN)
      host_.tsan_fiber = __tsan_get_current_fiber();
#endif
    }
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          blockIdx = uint3{x, y, z};
          if (m == mode::independent) {
            for (unsigned i = 0; i < count_; ++i) {
              enter(static_cast<int>(i));
              kernel();
            }
          } else {
            run_block();
            if (error_) std::rethrow_exception(error_);
          }
        }
      }
    }
  }

  uint64_t warp_op(op o, unsigned mask, uint64_t value, int arg, int width) {
    const int me = running(name_of(o));
    const unsigned in_warp = static_cast<unsigned>(me) % warpSize;
    if ((mask >> in_warp & 1u) == 0) {
      throw std::logic_error(std::string("lanes: ") + name_of(o) + " by thread " + std::to_string(me) + " with mask " + hex(mask) +
                             ", which does not name it" + where());
    }
    if (width < 1 || width > warpSize || (width & (width - 1)) != 0) {
      throw std::logic_error(std::string("lanes: ") + name_of(o) + " of width " + std::to_string(width) +
                             " (a power of two up to 32)" + where());
    }
    lane& l = *lanes_[static_cast<size_t>(me)];
    l.o = o;
    l.mask = mask;
    l.value = value;
    l.arg = arg;
    l.width = width;
    l.st = state::at_warp;
    yield(me);
    if (cancelled_) throw cancelled{};
    return l.result;
  }

  void block_barrier() {
    const int me = running("__syncthreads");
    lanes_[static_cast<size_t>(me)]->st = state::at_block;
    yield(me);
    if (cancelled_) throw cancelled{};
  }

  // A lane's life: the kernel once per block it is part of, then back to the scheduler.
  [[noreturn]] void lane_loop(int me) {
    arrived(lanes_[static_cast<size_t>(me)]->ctx);
    for (;;) {
      try {
        (*kernel_)();
      } catch (const cancelled&) {
        // the launch ended in another lane's error; this lane's stack is unwound
      } catch (...) {
        fail(std::current_exception());
      }
      lanes_[static_cast<size_t>(me)]->st = state::done;
      yield(me);
    }
  }

 private:
  // The running lane (for a barrier or collective), or why there is none.
  int running(const char* what) {
    if (!active_ || current_ == host) throw std::logic_error(std::string("lanes: ") + what + " outside a kernel launch");
    if (mode_ == mode::independent) {
      throw std::logic_error(std::string("lanes: ") + what + " in a launch of independent lanes (mode::cooperative runs lanes that synchronize)" +
                             where());
    }
    if (cancelled_) throw cancelled{};
    return current_;
  }

  std::string where() const {
    return " (block " + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," + std::to_string(blockIdx.z) + " of a " +
           std::to_string(block_.x) + "x" + std::to_string(block_.y) + "x" + std::to_string(block_.z) + " block)";
  }

  void grow(unsigned count) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    while (lanes_.size() < count) {
      auto l = std::make_unique<lane>();
      l->mapping_bytes = stack_bytes + page;
      void* m = mmap(nullptr, l->mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (m == MAP_FAILED) throw std::runtime_error("lanes: cannot map a lane's stack");
      l->mapping = m;
      mprotect(m, page, PROT_NONE);  // an overflow faults instead of writing over the next mapping
      char* stack = static_cast<char*>(m) + page;
      if (getcontext(&l->ctx.uc) != 0) {
        munmap(m, l->mapping_bytes);
        throw std::runtime_error("lanes: getcontext failed");
      }
      l->ctx.uc.uc_stack.ss_sp = stack;
      l->ctx.uc.uc_stack.ss_size = stack_bytes;
      l->ctx.uc.uc_link = nullptr;
      // makecontext passes int arguments to a function it takes as void(); lane_main never returns.
      makecontext(&l->ctx.uc, reinterpret_cast<void (*)()>(&lane_main), 1, static_cast<int>(lanes_.size()));
      l->ctx.stack_bottom = stack;
      l->ctx.stack_size = stack_bytes;
#if defined(TROUPE_LANES_ASAN)
      // ASan's swapcontext interceptor clears the shadow of the target's uc_stack at every switch, which would
      // drop the redzones of the suspended lane's frames (and cost a memset of its whole shadow). The stack
      // is announced through the fiber switches instead; makecontext has used the field, swapcontext does not.
      l->ctx.uc.uc_stack.ss_sp = nullptr;
      l->ctx.uc.uc_stack.ss_size = 0;
#endif
#if defined(TROUPE_LANES_TSAN)
      l->ctx.tsan_fiber = __tsan_create_fiber(0);
      __tsan_set_fiber_name(l->ctx.tsan_fiber, "CUDA lane");
#endif
      lanes_.push_back(std::move(l));
    }
  }

  context& ctx(int i) { return i == host ? host_ : lanes_[static_cast<size_t>(i)]->ctx; }

  // Makes lane i the running one: CUDA's threadIdx is its position in the block, x fastest.
  void enter(int i) {
    current_ = i;
    const auto u = static_cast<unsigned>(i);
    threadIdx = uint3{u % block_.x, u / block_.x % block_.y, u / (block_.x * block_.y)};
  }

  void run_block() {
    queue_.clear();
    next_ = 0;
    for (unsigned i = 0; i < count_; ++i) {
      lanes_[i]->st = state::ready;
      queue_.push_back(static_cast<int>(i));
    }
    switch_to(host, pick());
  }

  // The next lane to run in this round, the first of the next round when this one is over, or the host
  // when every lane has finished.
  int pick() {
    for (;;) {
      while (next_ < queue_.size()) {
        const int i = queue_[next_++];
        if (lanes_[static_cast<size_t>(i)]->st == state::ready) return i;
      }
      if (!release()) return host;
    }
  }

  // Lane `me` waits (or has finished): the next one runs.
  void yield(int me) {
    const int to = pick();
    if (to != me) switch_to(me, to);
  }

  void switch_to(int from, int to) {
    context& f = ctx(from);
    context& t = ctx(to);
    if (to == host) {
      current_ = host;
    } else {
      enter(to);
    }
    prev_ = &f;
#if defined(TROUPE_LANES_ASAN)
    __sanitizer_start_switch_fiber(&f.fake_stack, t.stack_bottom, t.stack_size);
#endif
#if defined(TROUPE_LANES_TSAN)
    __tsan_switch_to_fiber(t.tsan_fiber, 0);
#endif
    swapcontext(&f.uc, &t.uc);
    arrived(f);
  }

  // Back in context self after a switch: ASan learns the stack it runs on, and says which it left (the
  // host's stack is known that way).
  void arrived(context& self) {
#if defined(TROUPE_LANES_ASAN)
    const void* bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(self.fake_stack, &bottom, &size);
    prev_->stack_bottom = bottom;
    prev_->stack_size = size;
#else
    (void)self;
#endif
  }

  // No lane is ready: releases the warp collectives and the barrier that every lane they wait for has
  // reached, queueing those lanes in order. Returns false when every lane has finished. A wait that can
  // never end is an error: the launch is cancelled (every waiting lane resumes to unwind).
  bool release() {
    queue_.clear();
    next_ = 0;
    bool running = false;
    bool all_at_block = true;
    for (unsigned i = 0; i < count_; ++i) {
      const state st = lanes_[i]->st;
      if (st == state::done) continue;
      running = true;
      if (st != state::at_block) all_at_block = false;
    }
    if (!running) return false;
    for (unsigned base = 0; base < count_ && !cancelled_; base += warpSize) release_warp(base);
    if (cancelled_) return true;
    if (queue_.empty() && all_at_block) {
      for (unsigned i = 0; i < count_; ++i) {
        if (lanes_[i]->st != state::done) {
          lanes_[i]->st = state::ready;
          queue_.push_back(static_cast<int>(i));
        }
      }
    }
    if (queue_.empty()) {
      fail(std::make_exception_ptr(std::logic_error("lanes: the block's threads wait for each other forever: " + waits() + where())));
      return true;
    }
    std::sort(queue_.begin(), queue_.end());
    return true;
  }

  // Completes every collective of the warp at base whose mask's lanes have all reached it.
  void release_warp(unsigned base) {
    for (unsigned l = 0; l < warpSize && base + l < count_; ++l) {
      const lane& a = *lanes_[base + l];
      if (a.st != state::at_warp) continue;
      bool complete = true;
      for (unsigned b = 0; b < warpSize; ++b) {
        if ((a.mask >> b & 1u) == 0) continue;
        const unsigned j = base + b;
        if (j >= count_ || lanes_[j]->st == state::done) {
          fail(std::make_exception_ptr(std::logic_error(
              std::string("lanes: ") + name_of(a.o) + " by thread " + std::to_string(base + l) + " with mask " + hex(a.mask) +
              " names thread " + std::to_string(j) + (j >= count_ ? ", which the block does not have" : ", which has returned") + where())));
          return;
        }
        const lane& c = *lanes_[j];
        if (c.st != state::at_warp || c.mask != a.mask) {
          complete = false;
        } else if (c.o != a.o) {
          fail(std::make_exception_ptr(std::logic_error(std::string("lanes: threads ") + std::to_string(base + l) + " and " +
                                                        std::to_string(j) + " meet at different collectives, " + name_of(a.o) +
                                                        " and " + name_of(c.o) + where())));
          return;
        }
      }
      if (complete) complete_collective(base, a.mask);
    }
  }

  void complete_collective(unsigned base, unsigned mask) {
    unsigned votes = 0;
    for (unsigned b = 0; b < warpSize; ++b) {
      if ((mask >> b & 1u) != 0 && lanes_[base + b]->value != 0) votes |= 1u << b;
    }
    for (unsigned b = 0; b < warpSize; ++b) {
      if ((mask >> b & 1u) == 0) continue;
      lane& c = *lanes_[base + b];
      const auto w = static_cast<unsigned>(c.width);
      const unsigned segment = b & ~(w - 1);  // the first lane of its group of `width`
      const auto arg = static_cast<unsigned>(c.arg);
      unsigned src = b;
      switch (c.o) {
        case op::shfl_idx: src = segment | (arg & (w - 1)); break;
        case op::shfl_up: src = b - segment >= arg ? b - arg : b; break;
        case op::shfl_down: src = b - segment + static_cast<uint64_t>(arg) < w ? b + arg : b; break;
        case op::shfl_xor:
          src = b ^ arg;
          if ((src & ~(w - 1)) > segment) src = b;  // a later group: the lane's own value
          break;
        case op::ballot: c.result = votes; break;
        case op::any: c.result = votes != 0 ? 1 : 0; break;
        case op::all: c.result = votes == mask ? 1 : 0; break;
        case op::sync: c.result = 0; break;
      }
      if (c.o == op::shfl_idx || c.o == op::shfl_up || c.o == op::shfl_down || c.o == op::shfl_xor) {
        if ((mask >> src & 1u) == 0) {
          fail(std::make_exception_ptr(std::logic_error(std::string("lanes: ") + name_of(c.o) + " by thread " +
                                                        std::to_string(base + b) + " reads lane " + std::to_string(src) +
                                                        ", outside its mask " + hex(mask) + where())));
          return;
        }
        c.result = lanes_[base + src]->value;
      }
    }
    for (unsigned b = 0; b < warpSize; ++b) {
      if ((mask >> b & 1u) == 0) continue;
      lanes_[base + b]->st = state::ready;
      queue_.push_back(static_cast<int>(base + b));
    }
  }

  // What the threads of a block that cannot go on wait at.
  std::string waits() const {
    std::string out;
    const auto add = [&](unsigned from, unsigned to, state st, unsigned mask) {
      if (!out.empty()) out += "; ";
      out += "threads " + std::to_string(from) + (to > from ? ".." + std::to_string(to) : "");
      out += st == state::at_block  ? " at __syncthreads"
             : st == state::at_warp ? " at a warp collective (mask " + hex(mask) + ")"
             : st == state::done    ? " returned"
                                    : " running";
    };
    unsigned from = 0;
    for (unsigned i = 1; i <= count_; ++i) {
      const lane& a = *lanes_[from];
      if (i < count_) {
        const lane& b = *lanes_[i];
        if (b.st == a.st && (a.st != state::at_warp || (b.mask == a.mask && i / warpSize == from / warpSize))) continue;
      }
      add(from, i - 1, a.st, a.mask);
      from = i;
    }
    return out;
  }

  // Ends the launch with error e (the first one wins): every lane still running resumes to unwind.
  void fail(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
    cancelled_ = true;
    queue_.clear();
    next_ = 0;
    for (unsigned i = 0; i < count_; ++i) {
      if (lanes_[i]->st != state::done) {
        lanes_[i]->st = state::ready;
        queue_.push_back(static_cast<int>(i));
      }
    }
  }

  std::vector<std::unique_ptr<lane>> lanes_;  // a lane's context must not move: it points into itself
  context host_;
  context* prev_ = &host_;  // the context the last switch left

  // The launch in progress.
  bool active_ = false;
  const std::function<void()>* kernel_ = nullptr;
  mode mode_ = mode::independent;
  dim3 block_;
  unsigned count_ = 0;
  int current_ = host;
  std::vector<int> queue_;  // this round's lanes, in order
  size_t next_ = 0;
  bool cancelled_ = false;
  std::exception_ptr error_;
};

thread_local scheduler t_scheduler;

void lane_main(int index) { t_scheduler.lane_loop(index); }

}  // namespace

void launch(dim3 grid, dim3 block, mode m, const std::function<void()>& kernel) { t_scheduler.launch(grid, block, m, kernel); }

namespace detail {

uint64_t warp_op(op o, unsigned mask, uint64_t value, int arg, int width) { return t_scheduler.warp_op(o, mask, value, arg, width); }

void block_barrier() { t_scheduler.block_barrier(); }

}  // namespace detail

}  // namespace troupe::test::lanes
