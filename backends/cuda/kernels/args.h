// The arguments of every CUDA kernel: plain structs of device pointers, shapes and byte strides, built on the
// host from a node's tensors (backends/cuda/plan.cpp) and passed by value to a launch. The kernels' bodies
// (bodies.h) read them on the device; the host tests run the same bodies over host memory.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/weights.h"

namespace troupe::cuda::kern {

// A tensor's data and byte strides.
struct view {
  uint8_t* p = nullptr;
  int64_t nb[4] = {};
};

// Float element types the copy kernels convert between.
enum : int { f32_code = 0, f16_code = 1, bf16_code = 2, q8_0_code = 3 };
// set_rows' destinations of blocks of 32 values beyond q8_0 (a quantized KV cache).
enum : int { q4_0_code = 4, q4_1_code = 5, q5_0_code = 6, q5_1_code = 7, iq4_nl_code = 8 };

// d = a op b, b broadcast over a (b's shape b_ne divides a's ne). op: 0 add, 1 sub, 2 mul, 3 div.
struct binary_args {
  int64_t ne[4], b_ne[4];
  view a, b, d;
  int op;
};

// d = f(a). op: 0 scale (a * s + bias), 1 silu, 2 gelu.
struct unary_args {
  int64_t ne[4];
  view a, d;
  int op;
  float s, bias;
};

// d = act(x) * g. kind: 0 swiglu (silu), 1 geglu (gelu).
struct glu_args {
  int64_t ne[4];
  view x, g, d;
  int kind;
};

// op 0 concat (a then b along dim), 1 pad (a, zeros past its end).
struct concat_pad_args {
  int64_t ne[4], a_ne[4];
  view a, b, d;
  int op, dim;
};

// Rotary embedding of a [head_dim, n_head, n_tokens, ne3]; pos: i32 per token, ff: freq_factors or null.
struct rope_args {
  int64_t ne[4];
  view a, d;
  const int32_t* pos;
  const float* ff;
  int n_dims, neox;
  float theta_scale, freq_scale, attn_factor;
  float ext_factor, corr0, corr1, yarn_mscale;  // YaRN (ext_factor 0: off)
};

// The destination's elements in order are the source's in order (shapes may differ), converted.
struct cpy_args {
  int64_t s_ne[4], d_ne[4];
  view s, d;
  int s_type, d_type;  // f32_code, f16_code, bf16_code
  int64_t n;
};

// d[:, i, j] = row idx[i, j] of a's plane j, f32; an index outside a's rows gives a zero row.
struct get_rows_args {
  type t;
  int64_t ne0, n, ne2;
  const uint8_t* a;
  int64_t a_nb1, a_nb2, a_rows;
  view idx;
  int i64;
  view d;
};

// d[:, idx[i, j % i_ne1, k % i_ne2], j, k] = s[:, i, j, k]; d_type f32 / f16 / bf16, or whole blocks of q8_0,
// q4_0, q4_1, q5_0, q5_1, iq4_nl quantized as the CPU's reference quantizers do.
// An index outside d's rows writes nothing.
struct set_rows_args {
  int64_t ne[4];  // s
  view s, idx;
  int64_t i_ne1, i_ne2;
  int i64;
  view d;
  int64_t d_rows;
  int d_type;
};

// Per-row ops over dim 0. op: 0 norm, 1 sum_rows, 2 mean, 3 argmax (i32 at the row's flat index, walked
// through d_ne), 4 rms_norm.
struct rows_args {
  int64_t ne[4];  // a
  view a, d;
  int64_t d_ne[4];
  int op;
  float eps;
};

// d = softmax(a * scale + slope * mask) per row; mask rows nb0 = element size; m null: no mask.
struct soft_max_args {
  int64_t ne[4];
  view a, d;
  const uint8_t* m;
  int64_t m_nb1, m_nb2, m_nb3, m_ne2, m_ne3;
  int m_f16;
  float scale, max_bias, m0, m1;
  int n_head_log2;
};

// The activations of a matrix product as act_blocks: q[((i3 * ne2 + i2) * n + i1) * (k / 32) + j].
struct quantize_args {
  view b;  // f32 [k, n, ne2, ne3]
  int64_t k, n, ne2, ne3;
  act_block* q;
};

// d[i, c, i2, i3] = row i of a's plane (i2 / r2, i3 / r3) . activation column c, for c in [c0, c0 + n).
// Quantized weights read q (quantize_args' layout, n_all columns); float weights read b.
struct mat_vec_args {
  type t;
  const uint8_t* a;
  int64_t a_nb1, a_nb2, a_nb3, r2, r3;
  int64_t m, c0, n, n_all, k, ne2, ne3;
  const act_block* q;
  view b;
  view d;
};

// a's planes (a_ne2 x a_ne3 of m rows of k values) as f16, contiguous: out[((i3 * ne2 + i2) * m + r) * k + i].
struct dequant_args {
  type t;
  const uint8_t* a;
  int64_t a_nb1, a_nb2, a_nb3;
  int64_t k, m, ne2, ne3;
  uint16_t* out;
};

// One cuBLAS product per plane, column-major: D (m x n, ldc) = A^T (A: k x m, lda) * B (k x n, ldb), the
// plane (i2, i3) of D taking A's plane (i2 / r2, i3 / r3) and B's plane i3 * ne2 + i2 (b_plane bytes apart).
// ab_type: f32_code, f16_code or bf16_code (A and B alike); D is f32; f32 accumulation.
struct gemm_args {
  int ab_type;
  const uint8_t* a;
  int64_t lda, a_nb2, a_nb3, r2, r3;
  const uint8_t* b;
  int64_t ldb, b_plane;
  uint8_t* d;
  int64_t ldc, d_nb2, d_nb3;
  int64_t m, n, k, ne2, ne3;
};

}  // namespace troupe::cuda::kern
