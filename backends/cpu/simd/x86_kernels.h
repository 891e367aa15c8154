// Declarations of the x86 SIMD kernels, one namespace per instruction-set level. Each function has the
// signature and meaning of the reference function of the same name in runtime/quants.h:
//
//   vec_dot_<w>(n, s, x, y)   *s = dot of a row of weights x (type w) with a row y of w's vec_dot type
//   quantize_row_<t>(x, y, n) f32 -> t, bit-identical to quantize_row_<t>_ref
//   dequantize_row_<t>(x, y, n)
//   exp_row, silu_row, swiglu_row: as the kernel_table members of the same names (simd.h)
//
// Call one only after cpu_features says the CPU has its level (simd_table.cpp does this). Defined in
// dot_avx2.cpp (+ dot_blocks_x86.inc), gemm_avx2.cpp (+ q8_0_x86.inc, q4_K_x86.inc, q6_K_x86.inc),
// dot_avx2_k.cpp, quantize_avx2.cpp, math_avx2.cpp (avx2: AVX2 + FMA + F16C), dot_avx512.cpp, gemm_avx512.cpp
// (the same .inc files), dot_avx512_float.cpp (avx512: F/BW/VL/DQ + VNNI) and dot_avx512_bf16.cpp (avx512 +
// AVX512_BF16). x86-64 builds only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::cpu::simd {

// Each dot product comes with name_rows: s[r] = dot(row r of x, y) for nrows rows x_stride bytes apart.
#define TROUPE_SIMD_DOT(name)                                  \
  void name(int64_t n, float* s, const void* x, const void* y); \
  void name##_rows(int64_t n, int64_t nrows, float* s, const void* x, size_t x_stride, const void* y)
// Batched dot products (dot_tile in x86_common.h): s[c * s_stride + r] = name(row r of x, row c of y) for
// r < nrows, c < ncols, each element bit-identical to name's.
#define TROUPE_SIMD_TILE_DECL(name)                                                                         \
  void name##_tile(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x,       \
                   size_t x_stride, const void* y, size_t y_stride)
#define TROUPE_SIMD_GEMM_DECL(w)                                                                              \
  void gemm_##w(int64_t n, int64_t nrows, int64_t ncols, float* s, size_t s_stride, const void* x, size_t x_stride, \
                const void* y, size_t y_stride);                                                               \
  void gemm_prepare_##w(int64_t n, const void* y, void* out);                                                  \
  size_t gemm_prepared_size_##w(int64_t n)
#define TROUPE_SIMD_QUANT(name) void name(const float* x, void* y, int64_t n)
#define TROUPE_SIMD_DEQUANT(name) void name(const void* x, float* y, int64_t n)

// Column-major products (simd.h: mad_tile_fn).
#define TROUPE_SIMD_MAD(name)                                                                              \
  void name(int64_t k, int64_t m, int64_t ncols, const void* a, size_t a_stride, const void* b, size_t b_stride, \
            float* s, size_t s_stride)

namespace avx2 {
TROUPE_SIMD_MAD(mad_tile_f32);
TROUPE_SIMD_MAD(mad_tile_f16);
TROUPE_SIMD_MAD(mad_tile_acc_f32);
TROUPE_SIMD_DOT(vec_dot_f32);
TROUPE_SIMD_DOT(vec_dot_f16);
TROUPE_SIMD_DOT(vec_dot_bf16);
TROUPE_SIMD_DOT(vec_dot_q4_0);
TROUPE_SIMD_DOT(vec_dot_q4_1);
TROUPE_SIMD_DOT(vec_dot_q5_0);
TROUPE_SIMD_DOT(vec_dot_q5_1);
TROUPE_SIMD_DOT(vec_dot_q8_0);
TROUPE_SIMD_DOT(vec_dot_q2_K);
TROUPE_SIMD_DOT(vec_dot_q3_K);
TROUPE_SIMD_DOT(vec_dot_q4_K);
TROUPE_SIMD_DOT(vec_dot_q5_K);
TROUPE_SIMD_DOT(vec_dot_q6_K);
TROUPE_SIMD_DOT(vec_dot_iq4_nl);
TROUPE_SIMD_DOT(vec_dot_iq4_xs);
TROUPE_SIMD_DOT(vec_dot_iq3_s);
TROUPE_SIMD_DOT(vec_dot_mxfp4);
TROUPE_SIMD_TILE_DECL(vec_dot_f32);
TROUPE_SIMD_TILE_DECL(vec_dot_f16);
TROUPE_SIMD_TILE_DECL(vec_dot_bf16);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_0);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_1);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_0);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_1);
TROUPE_SIMD_TILE_DECL(vec_dot_q8_0);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_K);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_K);
TROUPE_SIMD_TILE_DECL(vec_dot_q6_K);
TROUPE_SIMD_TILE_DECL(vec_dot_iq4_nl);
TROUPE_SIMD_TILE_DECL(vec_dot_iq4_xs);
TROUPE_SIMD_TILE_DECL(vec_dot_iq3_s);
TROUPE_SIMD_TILE_DECL(vec_dot_mxfp4);
// The 32-value block types' tiles on prepared activation rows (simd.h: tile_prepare); _s: against q8_0,
// _u: against q8_1.
TROUPE_SIMD_TILE_DECL(vec_dot_q4_0_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_1_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_0_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_1_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_iq4_nl_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_mxfp4_prepared);
void tile_prepare_q4_0(int64_t n, const void* y, void* out);
void tile_prepare_q4_1(int64_t n, const void* y, void* out);
void tile_prepare_q5_0(int64_t n, const void* y, void* out);
void tile_prepare_q5_1(int64_t n, const void* y, void* out);
void tile_prepare_iq4_nl(int64_t n, const void* y, void* out);
void tile_prepare_mxfp4(int64_t n, const void* y, void* out);
size_t tile_prepared_size_s(int64_t n);
size_t tile_prepared_size_u(int64_t n);

// The GEMMs (q8_0_x86.inc, q4_K_x86.inc, q6_K_x86.inc) on activation rows prepared by gemm_prepare_<w>
// (gemm_prepared_size_<w>(n) bytes each), every element bit-identical to vec_dot_<w>'s.
TROUPE_SIMD_GEMM_DECL(q8_0);
TROUPE_SIMD_GEMM_DECL(q4_K);
TROUPE_SIMD_GEMM_DECL(q6_K);

TROUPE_SIMD_QUANT(quantize_row_q8_0);
TROUPE_SIMD_QUANT(quantize_row_q8_1);
TROUPE_SIMD_QUANT(quantize_row_q8_K);
TROUPE_SIMD_QUANT(quantize_row_f16);
TROUPE_SIMD_QUANT(quantize_row_bf16);

TROUPE_SIMD_DEQUANT(dequantize_row_f16);
TROUPE_SIMD_DEQUANT(dequantize_row_bf16);
TROUPE_SIMD_DEQUANT(dequantize_row_q4_0);
TROUPE_SIMD_DEQUANT(dequantize_row_q4_1);
TROUPE_SIMD_DEQUANT(dequantize_row_q5_0);
TROUPE_SIMD_DEQUANT(dequantize_row_q5_1);
TROUPE_SIMD_DEQUANT(dequantize_row_q8_0);
TROUPE_SIMD_DEQUANT(dequantize_row_q4_K);
TROUPE_SIMD_DEQUANT(dequantize_row_q6_K);

float exp_row(int64_t n, float* y, float max);  // math_avx2.cpp
float scale_mask_max(int64_t n, float* y, const float* m, float scale);
void exp_lane_sum(int64_t n, float* y, float max, float* lanes, unsigned* lane);
void scale_row(int64_t n, float* y, float s);
void silu_row(int64_t n, const float* x, float* y);
void swiglu_row(int64_t n, const float* x, const float* g, float* y);
}  // namespace avx2

namespace avx512 {
TROUPE_SIMD_MAD(mad_tile_f32);
TROUPE_SIMD_MAD(mad_tile_f16);
TROUPE_SIMD_MAD(mad_tile_acc_f32);
TROUPE_SIMD_DOT(vec_dot_f32);
TROUPE_SIMD_DOT(vec_dot_f16);
TROUPE_SIMD_DOT(vec_dot_q4_0);
TROUPE_SIMD_DOT(vec_dot_q4_1);
TROUPE_SIMD_DOT(vec_dot_q5_0);
TROUPE_SIMD_DOT(vec_dot_q5_1);
TROUPE_SIMD_DOT(vec_dot_q8_0);
TROUPE_SIMD_DOT(vec_dot_q4_K);
TROUPE_SIMD_DOT(vec_dot_q6_K);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_0);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_1);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_0);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_1);
TROUPE_SIMD_TILE_DECL(vec_dot_q8_0);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_K);
TROUPE_SIMD_TILE_DECL(vec_dot_q6_K);
TROUPE_SIMD_TILE_DECL(vec_dot_f32);
TROUPE_SIMD_TILE_DECL(vec_dot_f16);
// The 32-value block types' tiles on prepared activation rows (simd.h: tile_prepare).
TROUPE_SIMD_TILE_DECL(vec_dot_q4_0_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_q4_1_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_0_prepared);
TROUPE_SIMD_TILE_DECL(vec_dot_q5_1_prepared);
void tile_prepare_q4_0(int64_t n, const void* y, void* out);
void tile_prepare_q4_1(int64_t n, const void* y, void* out);
void tile_prepare_q5_0(int64_t n, const void* y, void* out);
void tile_prepare_q5_1(int64_t n, const void* y, void* out);
// The GEMMs (q8_0_x86.inc, q4_K_x86.inc, q6_K_x86.inc) on activation rows prepared by gemm_prepare_<w>
// (gemm_prepared_size_<w>(n) bytes each), every element bit-identical to vec_dot_<w>'s.
TROUPE_SIMD_GEMM_DECL(q8_0);
TROUPE_SIMD_GEMM_DECL(q4_K);
TROUPE_SIMD_GEMM_DECL(q6_K);
size_t tile_prepared_size(int64_t n);
}  // namespace avx512

namespace avx512bf16 {
TROUPE_SIMD_DOT(vec_dot_bf16);
}  // namespace avx512bf16

#undef TROUPE_SIMD_DOT
#undef TROUPE_SIMD_MAD
#undef TROUPE_SIMD_TILE_DECL
#undef TROUPE_SIMD_GEMM_DECL
#undef TROUPE_SIMD_QUANT
#undef TROUPE_SIMD_DEQUANT

}  // namespace troupe::cpu::simd
