// The CUDA kernels: how a launch's threads map onto bodies.h's bodies (a thread per unit, a warp per unit, a
// block per row, a warp per matrix row). kernels_*.cu launch them with plan.h's geometry (dims_of). The host
// tests compile this header too, with CUDA's thread model emulated (tests/backends/cuda/host_lanes.h): every
// thread of every block runs these very kernels, shuffles and barriers included.
#pragma once

#include "backends/cuda/kernels/groups.cuh"

namespace troupe::cuda::kern {

// A thread per unit, striding over the units beyond the grid.
template <class Args, void (*Body)(const Args&, int64_t)>
__global__ void each_unit(Args p, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) Body(p, i);
}

// A block per row, striding over the rows beyond the grid.
template <class Args, void (*Body)(const Args&, int64_t, block_group&)>
__global__ void each_row(Args p, int64_t rows) {
  block_group g;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) Body(p, r, g);
}

// A warp per unit (blockDim.x / 32 units per block), striding over the units beyond the grid.
template <class Args, void (*Body)(const Args&, int64_t, warp_group&)>
__global__ void each_warp(Args p, int64_t units) {
  warp_group g;
  const int64_t per_block = blockDim.x / 32;
  for (int64_t u = blockIdx.x * per_block + threadIdx.x / 32; u < units; u += static_cast<int64_t>(gridDim.x) * per_block) {
    Body(p, u, g);
  }
}

// A warp per output row (blockDim.x / 32 rows per block in x), planes in y; N activation columns.
template <type T, int N, bool Quantized>
__global__ void mat_vec_kernel(mat_vec_args p) {
  warp_group g;
  const int64_t planes = p.ne2 * p.ne3;
  const int64_t warps = blockDim.x / 32;
  for (int64_t plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    for (int64_t row = blockIdx.x * warps + threadIdx.x / 32; row < p.m; row += static_cast<int64_t>(gridDim.x) * warps) {
      if constexpr (Quantized) {
        mat_vec_q_row<T, N>(p, row, plane, g);
      } else {
        mat_vec_f_row<T, N>(p, row, plane, g);
      }
    }
  }
}

}  // namespace troupe::cuda::kern
