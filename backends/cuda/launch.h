// Launching a planned step (plan.h) on a CUDA stream: the kernels (kernels_*.cu) and cuBLAS. Host code calls
// these; only the .cu files see the kernels.
//
//   cuda::launch(step, stream, cublas);   // throws backend_error naming the step and CUDA's error
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backends/cuda/plan.h"

namespace troupe::cuda {

// Queues step s on stream (asynchronously). Throws backend_error with CUDA's or cuBLAS's error.
void launch(const step& s, cudaStream_t stream, cublasHandle_t cublas);

// The parts in each .cu file (launch dispatches to them).
void launch_elementwise(const step& s, cudaStream_t stream);              // kernels_elementwise.cu
void launch_matmul(const step& s, cudaStream_t stream, cublasHandle_t cublas);  // kernels_matmul.cu

// "cudaErrorMemoryAllocation: out of memory" for an error code; cuBLAS's status name.
std::string error_text(cudaError_t e);
std::string error_text(cublasStatus_t s);

}  // namespace troupe::cuda
