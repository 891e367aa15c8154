// The CPU kernels' per-type function tables, one per instruction-set level, chosen once at startup.
//
//   const simd::kernel_table& kt = simd::active_table();   // the level cpu_features allows (and
//   kt.vec_dot[int(type::q4_0)](k, &s, a_row, b_row);      // TROUPE_CPU_ISA does not lower)
//   kt.from_float[int(type::q8_0)](x, y, k);               // activation quantizer
//
// Every entry of a supported type is set: where a level has no SIMD version of a function, the table holds
// the reference one from runtime/quants.h. The CPU kernels use active_table() unless
// compute_params::reference asks for the reference functions (traits(t)) themselves.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "runtime/types.h"

namespace troupe::cpu::simd {

// s[r] = vec_dot(n, row r of x, y) for r < nrows, the rows of x x_stride bytes apart (one call per chunk of
// a matrix-vector product instead of one per row).
using vec_dot_rows_fn = void (*)(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y);

// s[c * s_stride + r] = vec_dot(n, row r of x, row c of y) for r < nrows, c < ncols: rows of x x_stride bytes
// apart, rows of y y_stride bytes apart, s_stride in floats. Each block of x is decoded once for several rows
// of y (a matrix product with a few activation rows, e.g. several sequences decoding at once), and every
// element is bit-identical to vec_dot's, so a result does not depend on the batch it was computed in.
using vec_dot_tile_fn = void (*)(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x,
                                 size_t x_stride, const void* y, size_t y_stride);

// Some tile kernels read their activation rows in a layout prepared once per row (the activation-side work
// every weight row would otherwise redo): tile_prepare converts one row of n values of the weight type's
// vec_dot_type into tile_prepared_size(n) bytes.
using tile_prepare_fn = void (*)(int64_t n, const void* y, void* out);
using tile_size_fn = size_t (*)(int64_t n);

// The most bytes of prepared activation rows a tile (up to 4 rows) should read for vec_dot_tile_prepared to
// beat vec_dot_tile, and of activation rows for a float type's tile to beat one row at a time: a third of a
// 48 KiB L1 (the weights and the rest share it; at 24 KiB q8_0 weights streamed from memory already lost).
// Measured with tools/bench/bench_cpu_ops (matvec_batch).
constexpr size_t tile_prepared_budget = 16 << 10;
// The same for matrix-matrix products, whose weight rows come from cache (a chunk's rows are reused across
// its activation rows): prepared rows pay up to a larger share (SmolLM2's ffn_down, k = 1536: 18 KiB for 4
// rows, 1.2-1.3x faster prepared; bench_cpu_ops matmul_shape/<type>/quant/576x1536).
constexpr size_t tile_prepared_budget_mm = 24 << 10;

// Products with a column-major a (mad_tile.h): s[c * s_stride + i] = sum over l < k of a_l[i] * b_c[l], a's
// rows (m values of the type) a_stride bytes apart, b's f32 columns b_stride bytes apart, in order of l,
// skipping b values of 0. f32 and f16 a.
using mad_tile_fn = void (*)(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b,
                             size_t b_stride, float* s, size_t s_stride);

// y[i] = exp(y[i] - max) for n values; returns their sum.
using exp_row_fn = float (*)(int64_t n, float* y, float max);
// The steps of the attention softmax over a run of one row of scores (kernels_attn.cpp), each the same bits
// as the plain loop it replaces:
// scale_mask_max: y[i] = y[i] * scale + m[i] (a dense f32 mask row) for n values; returns their maximum (a
// per-lane maximum, x > m ? x : m, 8 lanes then the tail, then the lanes).
using scale_mask_max_fn = float (*)(int64_t n, float* y, const float* m, float scale);
// exp_lane_sum: y[i] = exp(y[i] - max) as exp_row computes each, and the nonzero results added to the 16
// lanes (lanes[lane], lane + 1 mod 16 after each) as the cpu kernels' nonzero_lane_sum::add does.
using exp_lane_sum_fn = void (*)(int64_t n, float* y, float max, float* lanes, unsigned* lane);
// scale_row: y[i] *= s.
using scale_row_fn = void (*)(int64_t n, float* y, float s);
// y[i] = silu(x[i]) = x[i] / (1 + exp(-x[i])).
using silu_row_fn = void (*)(int64_t n, const float* x, float* y);
// y[i] = silu(x[i]) * g[i].
using swiglu_row_fn = void (*)(int64_t n, const float* x, const float* g, float* y);

struct kernel_table {
  isa level = isa::scalar;
  bool bf16_native = false;  // vec_dot[bf16] uses AVX512_BF16 (vdpbf16ps)
  // vec_dot[w]: row of weights of type w . row of traits(w).vec_dot_type.
  std::array<vec_dot_fn, type_id_count> vec_dot{};
  std::array<vec_dot_rows_fn, type_id_count> vec_dot_rows{};  // the same dot over several rows of weights
  // The same dot over rows of weights x rows of activations; null where the level has no batched kernel for
  // the type (then one vec_dot_rows call per activation row does the same).
  std::array<vec_dot_tile_fn, type_id_count> vec_dot_tile{};
  // Where set: the same tiles on activation rows prepared by tile_prepare[t] (tile_prepared_size[t](n) bytes
  // each) instead of rows of t's vec_dot_type, bit-identical again. Faster where the prepared rows of a tile
  // stay in L1 (see tile_prepared_budget); otherwise slower than vec_dot_tile.
  std::array<vec_dot_tile_fn, type_id_count> vec_dot_tile_prepared{};
  std::array<tile_prepare_fn, type_id_count> tile_prepare{};
  std::array<tile_size_fn, type_id_count> tile_prepared_size{};
  // Where set: the GEMM for batches of activation rows (prompts), the same elements as vec_dot_tile's bit for
  // bit, on rows prepared by gemm_prepare[t] (gemm_prepared_size[t](n) bytes each). A tile of weight rows is
  // converted once into a row-interleaved 8-bit form and every activation row of the call passes over it.
  std::array<vec_dot_tile_fn, type_id_count> gemm{};
  std::array<tile_prepare_fn, type_id_count> gemm_prepare{};
  std::array<tile_size_fn, type_id_count> gemm_prepared_size{};
  std::array<mad_tile_fn, type_id_count> mad_tile{};  // f32, f16
  // mad_tile[f32] continuing each element's chain from s's value instead of +0: calls over consecutive runs
  // of a's rows give the bits of one call over all of them (rows converted to f32 a block at a time).
  mad_tile_fn mad_acc_f32 = nullptr;
  // from_float[t]: f32 -> t, bit-identical to traits(t).from_float_ref (used for the activation types).
  std::array<from_float_fn, type_id_count> from_float{};
  // to_float[t]: t -> f32, bit-identical to traits(t).to_float.
  std::array<to_float_fn, type_id_count> to_float{};
  // Dense f32 rows of the elementwise ops (scalar std::exp in the scalar table; within a few ulp of it in
  // the SIMD ones).
  exp_row_fn exp_row = nullptr;
  scale_mask_max_fn scale_mask_max = nullptr;
  exp_lane_sum_fn exp_lane_sum = nullptr;
  scale_row_fn scale_row = nullptr;
  silu_row_fn silu_row = nullptr;
  swiglu_row_fn swiglu_row = nullptr;

  vec_dot_fn dot(type t) const { return vec_dot[static_cast<size_t>(t)]; }
  vec_dot_rows_fn dot_rows(type t) const { return vec_dot_rows[static_cast<size_t>(t)]; }
  vec_dot_tile_fn dot_tile(type t) const { return vec_dot_tile[static_cast<size_t>(t)]; }
  vec_dot_tile_fn dot_tile_prepared(type t) const { return vec_dot_tile_prepared[static_cast<size_t>(t)]; }
  tile_prepare_fn prepare_tile(type t) const { return tile_prepare[static_cast<size_t>(t)]; }
  tile_size_fn prepared_size(type t) const { return tile_prepared_size[static_cast<size_t>(t)]; }
  vec_dot_tile_fn gemm_of(type t) const { return gemm[static_cast<size_t>(t)]; }
  tile_prepare_fn prepare_gemm(type t) const { return gemm_prepare[static_cast<size_t>(t)]; }
  tile_size_fn gemm_size(type t) const { return gemm_prepared_size[static_cast<size_t>(t)]; }
  mad_tile_fn mad(type t) const { return mad_tile[static_cast<size_t>(t)]; }
  from_float_fn quantize(type t) const { return from_float[static_cast<size_t>(t)]; }
  to_float_fn dequantize(type t) const { return to_float[static_cast<size_t>(t)]; }
};

// The table of one level. Only call its functions when isa_supported(level).
const kernel_table& table(isa level);

// table(active_isa()).
const kernel_table& active_table();

}  // namespace troupe::cpu::simd
