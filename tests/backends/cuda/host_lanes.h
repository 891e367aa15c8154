// CUDA's thread model on the CPU, so that the host tests run the CUDA kernels themselves
// (backends/cuda/kernels/kernels.cuh) with every thread of every block: threadIdx, blockIdx, blockDim,
// gridDim, __syncthreads, the warp shuffles and votes, and __shared__ memory.
//
//   #include "tests/backends/cuda/host_lanes.h"          // before any device header
//   #include "backends/cuda/kernels/kernels.cuh"
//   lanes::launch(dim3(blocks), dim3(256), lanes::mode::cooperative, [&] { each_row<...>(args, rows); });
//
// Blocks run one after another on the calling thread. In a cooperative launch each thread of the block (a
// lane) is a fiber of its own (ucontext, with its own stack) and they take turns in a fixed order: lanes run
// in increasing index until each has reached a barrier, a warp collective or its end; then the barriers
// whose lanes have all arrived are released, and the next round starts. A warp collective (shuffle, vote,
// __syncwarp) completes when every lane its mask names has reached one with that mask; each lane's result is
// computed from the values all of them brought, as the hardware does. __syncthreads completes when every
// lane of the block still running has reached it (lanes that returned take no part). So the order of
// execution, and the results, depend on nothing but the code: no timing, no OS threads; the fibers are
// announced to AddressSanitizer and ThreadSanitizer, so both run these tests.
//
// What CUDA leaves undefined is an error here, thrown from launch (std::logic_error): a barrier some lanes
// never reach while others wait (a divergent __syncthreads, a shuffle naming a lane that returned or that
// waits elsewhere), a shuffle reading a lane outside its mask, a mask without the calling lane, a width that
// is no power of two up to 32. An element-wise launch (mode::independent) runs its lanes one after another
// to the end, each on the caller's stack: its lanes do not communicate, so any order is the hardware's; a
// barrier or warp collective there is an error.
//
// __shared__ variables are one per OS thread (static thread_local): the block running there. They keep
// their values from one block to the next, where the hardware's are undefined.
#pragma once

#if defined(__CUDACC__)
#error "host_lanes.h emulates CUDA on the host; nvcc compiles the real thing"
#endif

#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#define TROUPE_HOST_LANES 1
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static thread_local

// CUDA's built-in types and variables. The variables are the running lane's: the scheduler sets them
// before every switch to a lane.
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace troupe::test::lanes {

enum class mode {
  independent,  // lanes that never synchronize: each runs to its end in turn
  cooperative   // lanes as fibers: barriers, shuffles and votes
};

// Runs kernel once for every thread of grid x block (x fastest, then y, then z), blocks in order, and
// returns when all have finished. Throws std::logic_error for what CUDA leaves undefined (above); an
// exception from the kernel ends the launch (the other lanes of its block are unwound) and is rethrown.
void launch(dim3 grid, dim3 block, mode m, const std::function<void()>& kernel);

namespace detail {

enum class op : uint8_t { shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, sync };

// The running lane's part of a warp collective: `value` is what it brings (a shuffle's operand, a vote's
// predicate), `arg` the shuffle's lane, delta or lane mask. Returns its result once the collective completes.
uint64_t warp_op(op o, unsigned mask, uint64_t value, int arg, int width);
void block_barrier();

template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a shuffle moves at most 64 bits");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}

template <class T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

template <class T>
T shuffle(op o, unsigned mask, T var, int arg, int width) {
  return from_bits<T>(warp_op(o, mask, to_bits(var), arg, width));
}

}  // namespace detail

}  // namespace troupe::test::lanes

inline void __syncthreads() { troupe::test::lanes::detail::block_barrier(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  troupe::test::lanes::detail::warp_op(troupe::test::lanes::detail::op::sync, mask, 0, 0, warpSize);
}

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return troupe::test::lanes::detail::shuffle(troupe::test::lanes::detail::op::shfl_idx, mask, var, src_lane, width);
}

template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return troupe::test::lanes::detail::shuffle(troupe::test::lanes::detail::op::shfl_up, mask, var, static_cast<int>(delta), width);
}

template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return troupe::test::lanes::detail::shuffle(troupe::test::lanes::detail::op::shfl_down, mask, var, static_cast<int>(delta), width);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return troupe::test::lanes::detail::shuffle(troupe::test::lanes::detail::op::shfl_xor, mask, var, lane_mask, width);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      troupe::test::lanes::detail::warp_op(troupe::test::lanes::detail::op::ballot, mask, predicate != 0 ? 1 : 0, 0, warpSize));
}

inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      troupe::test::lanes::detail::warp_op(troupe::test::lanes::detail::op::any, mask, predicate != 0 ? 1 : 0, 0, warpSize));
}

inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      troupe::test::lanes::detail::warp_op(troupe::test::lanes::detail::op::all, mask, predicate != 0 ? 1 : 0, 0, warpSize));
}
