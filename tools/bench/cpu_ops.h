// The CPU op workloads measured by bench_cpu_ops (Google Benchmark) and `troupe bench ops`: each is set up
// once, then run() is one timed iteration; bytes / flops / items say what one run() processes.
//
//   auto w = bench::make_matvec(type::q4_0, 4096, 4096, 2);   // weights rotate through >= 256 MiB
//   w->run();                                                  // one mul_mat through the CPU backend
//   double gbs = w->bytes / seconds_per_run / 1e9;
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/types.h"

namespace troupe::bench {

struct workload {
  virtual ~workload() = default;
  virtual void run() = 0;
  double bytes = 0;  // bytes one run moves (memcpy: copied; read: summed; matvec: weight bytes read)
  double flops = 0;  // floating-point operations of one run (matmul, sgemm: 2 m k n)
  double items = 0;  // ops of one run (dispatch: 1; graph_nodes: the node count)
};

constexpr size_t stream_bytes = size_t{256} << 20;  // memcpy / read buffers, matvec weight rotation

// Copy / sum of a 256 MiB buffer split across nth threads of a troupe thread pool.
std::unique_ptr<workload> make_memcpy(int nth);
std::unique_ptr<workload> make_read(int nth);

// mul_mat of m x k weights of type t by n f32 vectors (1: one sequence's token generation; 2..8: several
// sequences decoding at once) on the CPU backend with nth threads. The weights rotate through copies
// filling >= 256 MiB, so they come from memory, never from the last-level cache. bytes = the weight bytes,
// whatever n (the effective weight bandwidth).
std::unique_ptr<workload> make_matvec(type t, int64_t m, int64_t k, int nth, int64_t n = 1);

// How a matrix-matrix product is computed: the backend's choice, the SIMD dot products (BLAS off), or
// dequantize + sgemm (BLAS forced, where built).
enum class mm_path { automatic, quant, blas };

// mul_mat of m x k weights of type t by n f32 vectors on the CPU backend with nth threads.
std::unique_ptr<workload> make_matmul(type t, mm_path path, int64_t m, int64_t k, int64_t n, int nth);

// flash_attn as a Llama-3.2-1B layer computes it (head size 64, 32 query heads over 8 KV heads): n_tok query
// rows (1: a decode step; more: a prompt's micro-batch, causal) after `depth` cells of one sequence, K and V
// of type kv in the CPU cache's layout (a row of all 8 heads per cell). Copies of K and V fill >= 256 MiB and
// rotate, so they come from memory as a model's layers do. flops = 4 hd n_head n_tok (depth + n_tok).
std::unique_ptr<workload> make_attention(type kv, int64_t depth, int64_t n_tok, int nth);

// OpenBLAS cblas_sgemm of the same shape on nth OpenBLAS threads; null when built without BLAS.
std::unique_ptr<workload> make_sgemm(int64_t m, int64_t k, int64_t n, int nth);

// thread_pool::run of an empty job on nth threads (items = 1).
std::unique_ptr<workload> make_dispatch(int nth);
// A graph of 64 trivial nodes on the CPU backend with nth threads (items = 64: kernel + barrier each).
std::unique_ptr<workload> make_graph_nodes(int nth);

// "OpenBLAS <core name>" or "none": what the sgemm baseline runs.
std::string blas_description();

}  // namespace troupe::bench
