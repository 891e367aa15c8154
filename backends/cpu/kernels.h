// CPU op kernels: one entry point that computes one graph node with nth threads.
//
// The CPU backend runs a graph node by node; for each node every worker thread ith in [0, nth) calls
// compute_forward(params, node) with the same node and a shared work buffer of work_size(node, nth) bytes.
// A kernel splits its work by ith/nth (usually by rows) and may call params.sync() to wait for all threads
// (e.g. after converting the activations into the work buffer once, before the dot products).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/tensor.h"
#include "runtime/types.h"

namespace troupe::cpu {

struct compute_params {
  int ith = 0;  // this thread
  int nth = 1;  // threads on this node
  uint8_t* wdata = nullptr;  // shared work buffer, work_size(node, nth) bytes, 64-byte aligned
  size_t wsize = 0;
  bool reference = false;    // scalar reference paths only: no BLAS, no shortcuts
  std::function<void()> barrier;  // waits for all nth threads; null when nth == 1

  void sync() const {
    if (barrier) barrier();
  }
};

// Whether the CPU can compute this node with the types and layouts of its sources.
bool supports_op(const tensor& node);

// Work buffer bytes the node needs when computed by nth threads (0 for most ops).
size_t work_size(const tensor& node, int nth, bool reference);

// Matrix products whose b has at least this many rows (tokens) per plane run as OpenBLAS sgemm when troupe
// is built with it (never in reference mode). By default that is never: troupe's own kernels compute every
// element of a product the same way whatever the batch, so a sequence's tokens do not depend on which other
// sequences (or how many prompt tokens) shared its batch, and sgemm (f32 activations against dequantized
// weights, its own summation order) would break that at the crossover. TROUPE_CPU_BLAS=on (or 1) trades
// that for the crossovers measured by bench_cpu_ops (docs/performance.md), per weight type: faster prompts
// where OpenBLAS has AVX2 / AVX-512 kernels and troupe's are slower.
int64_t blas_min_batch(type weights);
bool blas_crossovers_enabled();  // TROUPE_CPU_BLAS is on (read once)
// The kernels OpenBLAS picked for this CPU (its core name), and the crossover for a weight type given them,
// whether troupe's kernels run SIMD code, and whether they have native bf16 dot products (blas_min_batch is
// this for the running process; INT64_MAX: never).
enum class blas_kernels : uint8_t { older, avx2, avx512 };
blas_kernels blas_kernel_family();
int64_t blas_min_batch_for(type weights, blas_kernels family, bool simd, bool bf16_native);
// Overrides blas_min_batch for every weight type, process-wide (benchmarks measuring the crossover):
// n > 0 sets it, n < 0 turns BLAS off, 0 restores the defaults.
void set_blas_min_batch(int64_t n);

// Which kernel family the optimized mul_mat runs for weights of type t against n activation rows per plane
// (a dense product, b converted to t's dot type): "blas" (sgemm, above blas_min_batch), "gemm" (the weight
// tiles converted to the row-interleaved 8-bit form, q8_0 / q4_K / q6_K from a batch of 16 rows), "tile"
// (register tiles of one weight row x several activation rows), "rows" (one dot product per element, several
// weight rows per call) or "dot"; troupe bench reports it.
const char* mul_mat_kernel_family(type t, int64_t n);

// Computes node (all its sources have data) on thread params.ith of params.nth. Views, reshapes, permutes,
// transposes and op::none are no-ops. Throws backend_error for a node supports_op would reject.
void compute_forward(const compute_params& params, tensor& node);

}  // namespace troupe::cpu
