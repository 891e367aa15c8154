// Building ops: each function adds one node to a context and returns it. Nothing is computed here; a
// backend computes a graph of these nodes later.
//
//   context ctx({.max_tensors = 256, .no_alloc = true});
//   tensor* x   = ctx.new_tensor_2d(type::f32, n_embd, n_tokens);             // [n_embd, n_tokens]
//   tensor* h   = rms_norm(ctx, x, 1e-5f);                                   // [n_embd, n_tokens]
//   tensor* y   = mul_mat(ctx, w, mul(ctx, h, norm_w));                      // [n_out, n_tokens]
//
// Shapes use dimension 0 as the innermost. A source whose shape or type an op cannot take throws op_error
// naming the op and describing every source ("mul_mat: a.ne[0] != b.ne[0]: a = wq [64, 64, 1, 1] q4_0, ...").
//
// Parameter layout (tensor::op_params, 32-bit words) of every op, for backends:
//   scale     [0] f32 scale, [1] f32 bias                         dst = a * scale + bias
//   rms_norm  [0] f32 eps                                         dst = a / sqrt(mean(a^2) + eps), per row
//   norm      [0] f32 eps                                         dst = (a - mean) / sqrt(var + eps), per row
//   rope      see rope_params below: [0] n_dims, [1] mode, [2] n_ctx_orig, [3..8] f32 freq_base,
//             freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
//   soft_max  [0] f32 scale, [1] f32 max_bias (0: no ALiBi)       dst = softmax(a * scale + mask), per row
//   glu       [0] glu_kind, [1] swapped (0/1)
//   view      [0] view offset in bytes (low 32 bits), [1] high 32 bits
//   permute   [0..3] axes
//   concat    [0] dim
//   pad       [0..3] elements added at the end of each dimension
#pragma once

#include <cstdint>

#include "runtime/context.h"
#include "runtime/tensor.h"

namespace troupe {

// Ops that only reinterpret their source's memory (no work for a backend): view, reshape, permute, transpose.
inline bool is_view_op(op o) { return o == op::view || o == op::reshape || o == op::permute || o == op::transpose; }

// ---- element-wise, with broadcasting of b over a (each a.ne[i] a multiple of b.ne[i]); f32 -> f32 ----
tensor* add(context& ctx, tensor* a, tensor* b);
tensor* sub(context& ctx, tensor* a, tensor* b);
tensor* mul(context& ctx, tensor* a, tensor* b);
tensor* div(context& ctx, tensor* a, tensor* b);
tensor* scale(context& ctx, tensor* a, float s, float bias = 0.0f);

// ---- normalisation over dimension 0 (each row), f32 ----
tensor* rms_norm(context& ctx, tensor* a, float eps);
tensor* norm(context& ctx, tensor* a, float eps);

// ---- activations, f32 ----
tensor* silu(context& ctx, tensor* a);
tensor* gelu(context& ctx, tensor* a);  // tanh approximation, as GGUF models expect
tensor* sigmoid(context& ctx, tensor* a);  // 1 / (1 + exp(-x))

enum class glu_kind : int32_t { swiglu = 0, geglu = 1 };
// Fused gated unit. With b: act(a) * b, a and b the same shape. Without b: a's rows hold [x | g] halves,
// dst = act(x) * g with ne0 = a.ne0 / 2 (swapped: act(g) * x).
tensor* glu(context& ctx, tensor* a, tensor* b, glu_kind kind, bool swapped = false);
inline tensor* swiglu(context& ctx, tensor* a, tensor* b) { return glu(ctx, a, b, glu_kind::swiglu); }
inline tensor* geglu(context& ctx, tensor* a, tensor* b) { return glu(ctx, a, b, glu_kind::geglu); }

// ---- rotary position embedding ----
enum class rope_mode : int32_t { normal = 0, neox = 2 };  // normal: pairs (2i, 2i+1); neox: (i, i + n_dims/2)

struct rope_params {
  int32_t n_dims = 0;  // rotated dimensions, <= a.ne0 and even (partial rotary: the rest pass through)
  rope_mode mode = rope_mode::normal;
  int32_t n_ctx_orig = 0;    // training context, for YaRN (0: not used)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // 1 / linear scaling factor
  float ext_factor = 0.0f;   // YaRN extrapolation mix (0: off)
  float attn_factor = 1.0f;  // magnitude scale
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
};

// a: [head_dim, n_head, n_tokens, 1] f32; pos: [n_tokens] i32; freq_factors: optional [n_dims/2] f32
// dividing each frequency (Llama 3 long-context rope). dst: a's shape, f32.
tensor* rope(context& ctx, tensor* a, tensor* pos, tensor* freq_factors, const rope_params& p);
rope_params rope_params_of(const tensor& t);  // read back from a rope node
// YaRN's correction range [dims[0], dims[1]] of rotated dimension pairs (ggml_rope_yarn_corr_dims, step for
// step): every backend's rope interpolates between them.
void rope_yarn_corr_dims(const rope_params& p, float dims[2]);
// What a rope kernel takes from a node's parameters, as the CPU computes it: theta_scale = freq_base ^
// (-2 / n_dims) (pair i's angle is pos * theta_scale^i); with YaRN (ext_factor != 0) the correction range
// and the magnitude scale 1 + 0.1 ln(1 / freq_scale), else zeros.
struct rope_constants {
  float theta_scale = 0, ext_factor = 0, corr0 = 0, corr1 = 0, yarn_mscale = 0;
};
rope_constants rope_constants_of(const rope_params& p);

// ---- attention helpers ----
// a: [n_kv, n_q, ne2, ne3] f32; mask: optional [n_kv, >= n_q, ne2m, ne3m] f32 or f16, broadcast over
// dims 2 and 3; dst = softmax(a * scale + mask) per row. max_bias > 0 adds ALiBi slopes per head (dim 2).
tensor* soft_max(context& ctx, tensor* a, tensor* mask, float scale, float max_bias = 0.0f);
// The ALiBi slopes' bases for n_head heads: head h < n_head_log2 has slope m0^(h + 1), the others
// m1^(2 (h - n_head_log2) + 1) (as ggml).
struct alibi_constants {
  uint32_t n_head_log2 = 1;
  float m0 = 1, m1 = 1;
};
alibi_constants alibi_constants_of(float max_bias, uint32_t n_head);

// ---- matrix product ----
// a: [k, m, ne2a, ne3a] any supported type (weights, rows contiguous); b: [k, n, ne2b, ne3b] f32, with
// ne2b a multiple of ne2a and ne3b of ne3a (a is broadcast). dst: [m, n, ne2b, ne3b] f32, dst = a^T b,
// i.e. dst[i, j] = dot(row i of a, row j of b).
tensor* mul_mat(context& ctx, tensor* a, tensor* b);
// mul_mat whose result feeds soft_max with `mask` ([>= m, >= n, ne2 broadcast, 1], f32 / f16): elements
// where the mask is -inf are left unspecified (finite; the CPU writes 0 for blocks masked whole, the
// attention's masked half of a prompt, instead of computing them). The mask is src[2]; a backend that
// ignores it computes every element, which is as correct.
tensor* mul_mat_masked(context& ctx, tensor* a, tensor* b, tensor* mask);

// Mixture of experts: each token's row of b multiplied by the experts ids chose for it.
// as: [k, m, n_expert, 1], the experts' weights (a type mul_mat reads, rows contiguous); b: [k, n_b, n_tokens, 1]
// f32 with n_b == 1 (every chosen expert reads the token's one row) or n_b == n_used (one row per choice);
// ids: [n_used, n_tokens, 1, 1] i32. dst: [m, n_used, n_tokens, 1] f32,
//   dst[:, s, t] = as[:, :, ids[s, t]]^T b[:, s % n_b, t].
// An id outside [0, n_expert) (only a malformed graph has one) gives a row of zeros.
tensor* mul_mat_id(context& ctx, tensor* as, tensor* b, tensor* ids);

// Attention in one op, without the [n_kv, n_tokens, n_head] score matrix in memory:
// dst = softmax(scale * k^T q + mask) v for every query row of every head.
// q: [hd_k, n_tok, n_head, 1] f32 (dense rows, any strides: a permuted view of [hd_k, n_head, n_tok]);
// k: [hd_k, n_kv, n_head_kv, 1], v: [hd_v, n_kv, n_head_kv, 1], f32 or f16 with dense rows (a row per cache
// cell), n_head a multiple of n_head_kv (query head h reads KV head h / (n_head / n_head_kv));
// mask: optional [>= n_kv, >= n_tok, 1, 1] f32 / f16. dst: [hd_v, n_head, n_tok, 1] f32 (a token's heads side
// by side, what the output projection takes). Parameters: [0] f32 scale.
// The CPU computes it as mul_mat_masked, soft_max and the column-major mul_mat compute the unfused graph (the
// same functions in the same order): the two give bit-identical results there. Devices do not support it.
tensor* flash_attn(context& ctx, tensor* q, tensor* k, tensor* v, tensor* mask, float scale);

// ---- rows ----
// a: [ne0, n_rows, ne2, 1] any supported type; idx: [n, ne2, 1, 1] i32 or i64. dst: [ne0, n, ne2, 1] f32,
// row j of dst (in plane k) = row idx[j, k] of a (in plane k), converted to f32.
tensor* get_rows(context& ctx, tensor* a, tensor* idx);
// Writes rows of src into dst at the row indices idx: dst[:, idx[i, j, k], j, k] = src[:, i, j, k].
// dst: [ne0, n_rows, ne2, ne3] of f32, f16, bf16 or q8_0 (a KV cache); src: [ne0, n, ne2, ne3] f32;
// idx: [n, ne2i, ne3i] i32 or i64, broadcast over dims 2 and 3 of src. Returns a view of dst.
tensor* set_rows(context& ctx, tensor* dst, tensor* src, tensor* idx);

// ---- copies and conversions ----
// Copies a's elements, in order, into b (same element count, any shapes), converting to b's type:
// f32 -> f32/f16/bf16/q8_0/(any supported type whose rows are whole blocks); f16/bf16 -> f32. Returns a
// view of b; computing it writes b.
tensor* cpy(context& ctx, tensor* a, tensor* b);
// A contiguous copy of a (any layout), optionally reshaped to ne (same element count).
tensor* cont(context& ctx, tensor* a);
tensor* cont(context& ctx, tensor* a, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1);

// ---- views (no data of their own, no compute) ----
tensor* view_1d(context& ctx, tensor* a, int64_t ne0, size_t offset);
tensor* view_2d(context& ctx, tensor* a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset);
tensor* view_3d(context& ctx, tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2,
                size_t offset);
tensor* view_4d(context& ctx, tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1,
                size_t nb2, size_t nb3, size_t offset);
// a must be contiguous; same element count.
tensor* reshape(context& ctx, tensor* a, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1);
// Dimension i of a becomes dimension axis_i of the result (axes a permutation of 0..3).
tensor* permute(context& ctx, tensor* a, int axis0, int axis1, int axis2, int axis3);
tensor* transpose(context& ctx, tensor* a);  // swaps dimensions 0 and 1

// ---- shape ops, f32 ----
// a and b equal in every dimension but dim; dst joins them along dim.
tensor* concat(context& ctx, tensor* a, tensor* b, int dim);
// Appends p_i zero elements at the end of dimension i.
tensor* pad(context& ctx, tensor* a, int p0, int p1, int p2 = 0, int p3 = 0);

// ---- reductions over dimension 0, f32 ----
tensor* sum_rows(context& ctx, tensor* a);  // [1, ne1, ne2, ne3]
tensor* mean(context& ctx, tensor* a);      // [1, ne1, ne2, ne3]
tensor* argmax(context& ctx, tensor* a);    // a: [ne0, ne1] f32 -> [ne1] i32, first index of the maximum
// The indices of the k largest values of each row, largest first (equal values: the lower index first):
// a: [n, ne1, ne2, ne3] f32 -> [k, ne1, ne2, ne3] i32, 1 <= k <= n. A mixture of experts' routing.
tensor* top_k(context& ctx, tensor* a, int k);

}  // namespace troupe
