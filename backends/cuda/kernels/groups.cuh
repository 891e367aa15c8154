// The thread groups the CUDA kernels run bodies.h's row and matrix-vector bodies with. Device code: the host
// compiles it only under the emulation of CUDA's thread model that the host tests provide.
#pragma once

#if !defined(__CUDACC__) && !defined(TROUPE_HOST_LANES)
#error "groups.cuh on the host needs CUDA's names (threadIdx, __syncthreads, __shfl_xor_sync) from the host tests' lane emulation"
#endif

#include "backends/cuda/kernels/bodies.h"

namespace troupe::cuda::kern {

struct warp_group {
  __device__ int lane() const { return static_cast<int>(threadIdx.x % 32); }
  __device__ int size() const { return 32; }
  __device__ float sum(float v) const {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
  __device__ float max(float v) const {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
  }
};

// A whole block (a multiple of 32 threads, at most 1024): warps reduce, then every warp reduces the warps'
// results, so every thread gets the result.
struct block_group {
  __device__ int lane() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return static_cast<int>(blockDim.x); }
  __device__ float sum(float v) const { return reduce(v, false); }
  __device__ float max(float v) const { return reduce(v, true); }

 private:
  __device__ static float reduce(float v, bool is_max) {
    __shared__ float partial[32];
    const warp_group w;
    v = is_max ? w.max(v) : w.sum(v);
    __syncthreads();  // partial is free (an earlier reduction has read it)
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    const unsigned warps = blockDim.x / 32;
    const float identity = is_max ? -INFINITY : 0.0f;
    v = threadIdx.x % 32 < warps ? partial[threadIdx.x % 32] : identity;
    return is_max ? w.max(v) : w.sum(v);
  }
};

}  // namespace troupe::cuda::kern
