// Rotary position embedding, as ggml's rope (normal and neox modes, YaRN, freq_factors, partial n_dims).
//
// a: [ne0 = head_dim, ne1 = n_head, ne2 = n_tokens, ne3] f32, any strides; pos: [n_tokens] i32;
// freq_factors: optional [n_dims / 2] f32. Threads split the rows; each thread keeps a (cos, sin) cache of
// n_dims floats for the token it is on in the work buffer, recomputed when the token changes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "backends/cpu/kernels_internal.h"
#include "runtime/ops.h"

namespace troupe::cpu::detail {

namespace {

struct rope_args {
  int32_t n_dims;
  int32_t mode;
  int32_t n_ctx_orig;
  float freq_base;
  float freq_scale;
  float ext_factor;
  float attn_factor;
  float beta_fast;
  float beta_slow;
};

// op_params layout of runtime/ops.h: [0] n_dims, [1] mode, [2] n_ctx_orig, [3..8] f32 parameters.
rope_args read_args(const tensor& node) {
  return {node.param<int32_t>(0), node.param<int32_t>(1), node.param<int32_t>(2),
          node.param<float>(3),   node.param<float>(4),   node.param<float>(5),
          node.param<float>(6),   node.param<float>(7),   node.param<float>(8)};
}

// The float arithmetic below mirrors ggml's rope_yarn_ramp / rope_yarn / ggml_rope_yarn_corr_dims step for
// step, so that results match ggml's CPU backend bit for bit (same libm).
float yarn_ramp(float low, float high, int64_t i0) {
  const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

// cache[i0] = cos(theta_i0) * mscale, cache[i0 + 1] = sin(theta_i0) * mscale for i0 = 0, 2, ... < n_dims,
// theta_i0 = pos * base^(-i0 / n_dims) / freq_factor[i0 / 2], interpolated / extrapolated by YaRN.
void cache_init(const rope_args& p, float pos, const tensor* ff, const float corr[2], float theta_scale,
                float* cache) {
  float theta = pos;
  for (int64_t i0 = 0; i0 < p.n_dims; i0 += 2) {
    const float f = ff != nullptr ? load_float(addr(*ff, i0 / 2, 0, 0, 0), type::f32) : 1.0f;
    const float theta_extrap = theta / f;
    const float theta_interp = p.freq_scale * theta_extrap;
    float th = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const float ramp_mix = yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
      th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cache[i0 + 0] = std::cos(th) * mscale;
    cache[i0 + 1] = std::sin(th) * mscale;
    theta *= theta_scale;
  }
}

inline float ld(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void st(char* p, float v) { std::memcpy(p, &v, 4); }

}  // namespace

bool supports_rope(const tensor& node) {
  const tensor* a = node.src[0];
  const tensor* pos = node.src[1];
  const tensor* ff = node.src[2];
  if (a == nullptr || pos == nullptr || a->type != type::f32 || node.type != type::f32) return false;
  if (pos->type != type::i32) return false;
  if (ff != nullptr && ff->type != type::f32) return false;
  const rope_args p = read_args(node);
  if (p.mode != static_cast<int32_t>(rope_mode::normal) && p.mode != static_cast<int32_t>(rope_mode::neox)) {
    return false;  // multi-section / vision rope are not implemented
  }
  return p.n_dims >= 0 && p.n_dims % 2 == 0 && p.n_dims <= a->ne[0];
}

size_t rope_work_size(const tensor& node, int nth) {
  const int32_t n_dims = node.param<int32_t>(0);
  return static_cast<size_t>(nth) * align_up(static_cast<size_t>(std::max(n_dims, 0)) * sizeof(float));
}

void compute_rope(const compute_params& params, tensor& node) {
  if (!supports_rope(node)) {
    unsupported(node, "needs f32 a/dst, i32 pos, f32 freq_factors, normal or neox mode, even n_dims <= ne0");
  }
  const size_t cache_bytes = align_up(static_cast<size_t>(node.param<int32_t>(0)) * sizeof(float));
  require_work(params, node, cache_bytes * static_cast<size_t>(params.nth));

  const tensor& a = *node.src[0];
  const tensor& pos = *node.src[1];
  const tensor* ff = node.src[2];
  const rope_args p = read_args(node);
  const bool neox = p.mode == static_cast<int32_t>(rope_mode::neox);
  const int64_t ne0 = a.ne[0];
  const int64_t n_dims = p.n_dims;
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const int64_t sd = static_cast<int64_t>(node.nb[0]);

  const float theta_scale = n_dims > 0 ? std::pow(p.freq_base, -2.0f / static_cast<float>(n_dims)) : 1.0f;
  float corr[2];
  rope_yarn_corr_dims(rope_params_of(node), corr);

  float* cache = reinterpret_cast<float*>(params.wdata + cache_bytes * static_cast<size_t>(params.ith));
  int64_t cached_i2 = -1;

  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    if (ri.i2 != cached_i2 && n_dims > 0) {  // positions are per token (dim 2)
      int32_t token_pos;
      std::memcpy(&token_pos, addr(pos, ri.i2, 0, 0, 0), sizeof token_pos);
      cache_init(p, static_cast<float>(token_pos), ff, corr, theta_scale, cache);
      cached_i2 = ri.i2;
    }
    const char* x = row_addr(a, ri);
    char* y = row_addr(node, ri);
    // normal: rotates pairs (i0, i0 + 1); neox: pairs (ic, ic + n_dims / 2), ic < n_dims / 2. Pair number
    // ic = i0 / 2 uses cache[2 ic], cache[2 ic + 1] in both modes.
    const int64_t step = neox ? 1 : 2;            // distance between consecutive pairs' first elements
    const int64_t other = neox ? n_dims / 2 : 1;  // distance between a pair's two elements
    for (int64_t ic = 0; ic < n_dims / 2; ++ic) {
      const int64_t i = ic * step;
      const float c = cache[2 * ic + 0];
      const float s = cache[2 * ic + 1];
      const float x0 = ld(x + i * sa);
      const float x1 = ld(x + (i + other) * sa);
      st(y + i * sd, x0 * c - x1 * s);
      st(y + (i + other) * sd, x0 * s + x1 * c);
    }
    for (int64_t i = n_dims; i < ne0; ++i) st(y + i * sd, ld(x + i * sa));  // not rotated: passed through
  }
}

}  // namespace troupe::cpu::detail
