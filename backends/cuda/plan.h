// What the CUDA backend does for a node, decided on the host and testable without a GPU: whether it computes
// the node (supports), which matrix-product path it takes (choose_matmul), the steps it runs (plan: kernel
// launches with their arguments, cuBLAS products) and each launch's geometry (dims_of).
//
//   if (!cuda::supports(node)) ...                       // device::supports_op asks this
//   for (const cuda::step& s : cuda::plan(node, scratch)) launch(s, stream);   // cuda_backend.cpp
//
// Matrix products: float weights (f32 / f16 / bf16) take the float matrix-vector kernel for up to 8
// activation columns and cuBLAS beyond; quantized weights take activations quantized to 8 bits and the
// integer (dp4a) matrix-vector kernel for up to 8 columns, and beyond that weights dequantized to f16 and
// cuBLAS (f16 x f16, f32 accumulation). Columns go to the matrix-vector kernels 8, 4, 2 or 1 at a time.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "backends/cuda/kernels/args.h"
#include "runtime/tensor.h"

namespace troupe::cuda {

// Whether the CUDA backend computes node t (views: yes, they cost nothing).
bool supports(const tensor& t);

enum class matmul_path : uint8_t {
  mat_vec_float,  // own kernel, float weights, <= mat_vec_max_cols columns
  mat_vec_q,      // own kernel, quantized weights, activations quantized to 8 bits
  cublas,         // float weights, activations converted to the weights' type
  cublas_dequant  // quantized weights dequantized to f16, activations converted to f16
};
constexpr int64_t mat_vec_max_cols = 8;
matmul_path choose_matmul(type weights, int64_t columns);

// Memory a node's steps need besides its tensors (activations quantized or converted, weights
// dequantized): get(slot, bytes) returns at least `bytes` of device memory, the same for a slot until the
// next get of that slot (which may move it: the caller waits for the earlier users first).
class scratch_i {
 public:
  virtual ~scratch_i() = default;
  virtual uint8_t* get(int slot, size_t bytes) = 0;
};
constexpr int scratch_slots = 2;

// One launch: an element-wise kernel (one thread per unit) ...
struct binary_step { kern::binary_args a; };
struct unary_step { kern::unary_args a; };
struct glu_step { kern::glu_args a; };
struct concat_pad_step { kern::concat_pad_args a; };
struct rope_step { kern::rope_args a; };
struct cpy_step { kern::cpy_args a; };
struct get_rows_step { kern::get_rows_args a; };
struct set_rows_step { kern::set_rows_args a; };
struct dequant_step { kern::dequant_args a; };
// ... a group of threads per row ...
struct rows_step { kern::rows_args a; };
struct soft_max_step { kern::soft_max_args a; };
struct quantize_step { kern::quantize_args a; };  // a warp per 32 activations
struct mat_vec_step { kern::mat_vec_args a; };    // a warp per output row; a.n (1, 2, 4 or 8) columns
// ... or a cuBLAS product.
struct gemm_step { kern::gemm_args a; };

using step = std::variant<binary_step, unary_step, glu_step, concat_pad_step, rope_step, cpy_step, get_rows_step, set_rows_step,
                          dequant_step, rows_step, soft_max_step, quantize_step, mat_vec_step, gemm_step>;
std::string_view step_name(const step& s);

// The steps of node t (supports(t)), its tensors' data being device addresses. Views: none. Throws
// backend_error naming the node when it is not supported.
std::vector<step> plan(const tensor& t, scratch_i& scratch);

// A launch's geometry: grid (x, y) of blocks of `block` threads. Element-wise kernels and row kernels stride
// over their units when there are more than the grid holds.
struct launch_dims {
  uint32_t grid_x = 1, grid_y = 1;
  uint32_t block = 1;
};
constexpr uint32_t elementwise_block = 256;
constexpr uint32_t max_grid_x = 1u << 20;  // blocks before a kernel strides (well under the 2^31 - 1 limit)
constexpr uint32_t max_grid_y = 65535;     // the hardware limit
constexpr uint32_t mat_vec_warps = 4;      // output rows per block of the matrix-vector kernels
// Units of work of a step (elements, pairs, rows, 32-value blocks, output rows x planes).
int64_t units_of(const step& s);
launch_dims dims_of(const step& s);
// Threads per row for the row kernels: rows of up to 32 values take a warp, longer ones up to 256 threads.
uint32_t row_block(int64_t row_length);

}  // namespace troupe::cuda
