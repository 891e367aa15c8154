// The matrix products: activations quantized to 8 bits (a warp per 32 values), the matrix-vector kernels
// (a warp per output row, 4 rows per block; quantized weights by dp4a over act_blocks, float weights by
// f32 fma) and cuBLAS (cublasGemmEx, f32 accumulation) for more than 8 activation columns. The kernels are
// kernels.cuh's, which the host tests run too.
#include <type_traits>

#include "backends/cuda/kernels/kernels.cuh"
#include "backends/cuda/launch.h"
#include "runtime/error.h"

namespace troupe::cuda {

namespace {

using namespace kern;

template <type T, bool Quantized>
void run_mat_vec(const step& s, const mat_vec_args& a, cudaStream_t stream) {
  const launch_dims d = dims_of(s);
  const dim3 grid(d.grid_x, d.grid_y);
  switch (a.n) {
    case 1: mat_vec_kernel<T, 1, Quantized><<<grid, d.block, 0, stream>>>(a); break;
    case 2: mat_vec_kernel<T, 2, Quantized><<<grid, d.block, 0, stream>>>(a); break;
    case 4: mat_vec_kernel<T, 4, Quantized><<<grid, d.block, 0, stream>>>(a); break;
    case 8: mat_vec_kernel<T, 8, Quantized><<<grid, d.block, 0, stream>>>(a); break;
    default: throw backend_error("CUDA: a matrix-vector launch of " + std::to_string(a.n) + " columns (1, 2, 4 or 8)");
  }
}

void mat_vec(const step& s, const mat_vec_args& a, cudaStream_t stream) {
  with_weight_type(a.t, [&](auto t) {
    constexpr type T = decltype(t)::value;
    run_mat_vec<T, !is_float_type(T)>(s, a, stream);
  });
}

cudaDataType_t data_type(int code) { return code == f32_code ? CUDA_R_32F : code == f16_code ? CUDA_R_16F : CUDA_R_16BF; }

void check_cublas(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS) throw backend_error(std::string("CUDA: ") + call + ": " + error_text(st));
}

void gemm(const gemm_args& g, cudaStream_t stream, cublasHandle_t h) {
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = data_type(g.ab_type);
  for (int64_t i3 = 0; i3 < g.ne3; ++i3) {
    for (int64_t i2 = 0; i2 < g.ne2; ++i2) {
      const uint8_t* a = g.a + (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
      const uint8_t* b = g.b + (i3 * g.ne2 + i2) * g.b_plane;
      uint8_t* d = g.d + i2 * g.d_nb2 + i3 * g.d_nb3;
      check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k),
                                &alpha, a, t, static_cast<int>(g.lda), b, t, static_cast<int>(g.ldb), &beta, d, CUDA_R_32F,
                                static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }
  }
}

}  // namespace

void launch_matmul(const step& s, cudaStream_t stream, cublasHandle_t cublas) {
  if (const auto* st = std::get_if<quantize_step>(&s)) {
    const launch_dims d = dims_of(s);
    each_warp<quantize_args, quantize_block<warp_group>><<<dim3(d.grid_x, d.grid_y), d.block, 0, stream>>>(st->a, units_of(s));
  } else if (const auto* st = std::get_if<mat_vec_step>(&s)) {
    mat_vec(s, st->a, stream);
  } else if (const auto* st = std::get_if<gemm_step>(&s)) {
    gemm(st->a, stream, cublas);
  } else {
    throw backend_error("CUDA: step " + std::string(step_name(s)) + " is not a matrix product");
  }
}

void launch(const step& s, cudaStream_t stream, cublasHandle_t cublas) {
  if (std::holds_alternative<quantize_step>(s) || std::holds_alternative<mat_vec_step>(s) || std::holds_alternative<gemm_step>(s)) {
    launch_matmul(s, stream, cublas);
  } else {
    launch_elementwise(s, stream);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    throw backend_error("CUDA: launch of " + std::string(step_name(s)) + ": " + error_text(e));
  }
}

std::string error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

std::string error_text(cublasStatus_t s) { return std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s); }

}  // namespace troupe::cuda
